"""Dynamic trace replay: pods arrive and leave through ``Scheduler.submit`` / ``release``.

The static protocol of ``infra.replay.trace`` asks only where each pod goes, on a cluster that never
empties. Here the trace's times drive the scheduler itself, queue included: a pod is submitted at
its ``creation_time`` (priority from its QoS class), waits in the queue when it does not fit,
may preempt lower classes (a preempted pod starts again from scratch when it is placed again),
and leaves its runtime after it was placed, its runtime being ``deletion_time`` minus
``scheduled_time`` (``creation_time`` for pods the trace never scheduled). Reported: allocation
over time, queueing delay p50/p99 per priority class, pods that timed out or never ran, the
preemptions, and the wall time of every ``submit`` and ``release``.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infra.common.csv_rows import number, read_rows
from infra.replay.trace import Pod, read_pods
from infra.scheduler import EventKind, Scheduler
from infra.scheduler.frag import TypicalPods
from infra.scheduler.requests import Bundle, GangRequest, RequestError
from infra.scheduler.resources import MILLI, Cluster

PRIORITY_OF_QOS = {"BE": 0, "Burstable": 1, "LS": 2, "Guaranteed": 3}
"""Priority class of each QoS of the openb trace (best effort lowest)."""


@dataclass(frozen=True)
class TimedPod:
    """A pod with its arrival time, runtime (seconds) and priority class."""

    pod: Pod
    arrival: float
    runtime: float
    priority: int

    def request(self, timeout_s: float | None) -> GangRequest:
        """The pod as a one-bundle gang."""
        p = self.pod
        whole = p.gpu_milli == MILLI
        bundle = Bundle(p.cpu, p.mem, gpus=p.num_gpu if whole else 0, gpu_fraction=0 if whole else p.gpu_milli,
                        gpu_models=p.models if p.num_gpu else frozenset())
        return GangRequest(p.name, (bundle,), priority=self.priority, timeout_s=timeout_s)


def read_timed_pods(path: str | Path, speedup: float = 1.0) -> list[TimedPod]:
    """The pods of an openb pod list with their times, in arrival order (ties by name).

    Args:
        path: the pod list.
        speedup: arrivals come this many times faster (times after the first arrival divided by
            it); runtimes are kept, so the offered load grows by the same factor.
    """
    if not speedup > 0 or speedup == float("inf"):
        raise ValueError(f"speedup={speedup} must be a finite number > 0.")
    by_name = {p.name: p for p in read_pods(path)}
    out = []
    for place, row in read_rows(path, {"name", "creation_time", "deletion_time"}, "Pod list", "--pods"):
        created = number(row, "creation_time", place)
        start = number(row, "scheduled_time", place) if row.get("scheduled_time") else created
        runtime = max(1.0, number(row, "deletion_time", place) - start)
        prio = PRIORITY_OF_QOS.get(row.get("qos", ""), 0)
        out.append(TimedPod(by_name[row["name"]], created, runtime, prio))
    first = min(t.arrival for t in out)
    out = [TimedPod(t.pod, first + (t.arrival - first) / speedup, t.runtime, t.priority) for t in out]
    return sorted(out, key=lambda t: (t.arrival, t.pod.name))


@dataclass
class DynamicResult:
    """Outcome of a dynamic replay.

    Attributes:
        times: ``[E]`` trace time (s) after each arrival or departure.
        alloc_pct: ``[E]`` % of the GPU capacity held by placed pods then (reservations excluded).
        queue_len: ``[E]`` waiting pods then.
        delays_s: priority class -> queueing delays (s) of the pods placed (first placement).
        invalid: pods refused at submission (larger than any node ...).
        timed_out: pods that waited longer than the timeout.
        never_ran: pods that left (their deletion came) or remained at the end without running.
        preemptions: preemption notices.
        submit_ns, release_ns: wall time of each ``submit`` / ``release`` call.
        wall_s: wall time of the whole replay.
    """

    times: np.ndarray
    alloc_pct: np.ndarray
    queue_len: np.ndarray
    delays_s: dict[int, np.ndarray]
    invalid: int
    timed_out: int
    never_ran: int
    preemptions: int
    submit_ns: np.ndarray
    release_ns: np.ndarray
    wall_s: float

    def summary(self) -> dict[str, float]:
        """Figures for reports: delays p50/p99 per class, allocation, counts, latencies, wall time."""
        out: dict[str, float] = {}
        for prio, d in sorted(self.delays_s.items()):
            out[f"class{prio}_placed"] = int(d.size)
            out[f"class{prio}_delay_p50_s"] = float(np.percentile(d, 50)) if d.size else float("nan")
            out[f"class{prio}_delay_p99_s"] = float(np.percentile(d, 99)) if d.size else float("nan")
            out[f"class{prio}_delay_max_s"] = float(d.max()) if d.size else float("nan")
            out[f"class{prio}_delayed"] = int((d > 0).sum())
        out.update(
            alloc_pct_mean=float(np.mean(self.alloc_pct)), alloc_pct_max=float(np.max(self.alloc_pct)),
            invalid=self.invalid, timed_out=self.timed_out, never_ran=self.never_ran, preemptions=self.preemptions,
            submit_p50_ms=float(np.percentile(self.submit_ns, 50) / 1e6),
            submit_p99_ms=float(np.percentile(self.submit_ns, 99) / 1e6),
            release_p50_ms=float(np.percentile(self.release_ns, 50) / 1e6) if self.release_ns.size else 0.0,
            release_p99_ms=float(np.percentile(self.release_ns, 99) / 1e6) if self.release_ns.size else 0.0,
            wall_s=self.wall_s,
        )
        return out


class _Replay:
    """State of one dynamic replay (see ``replay_dynamic``)."""

    def __init__(self, sched: Scheduler, pods: list[TimedPod], timeout_s: float | None) -> None:
        self.s = sched
        self.pods = {t.pod.name: t for t in pods}
        self.timeout_s = timeout_s
        self.heap: list[tuple[float, int, str, str, int]] = []  # (time, order, kind, pod, epoch)
        for k, t in enumerate(pods):
            heapq.heappush(self.heap, (t.arrival, k, "arrive", t.pod.name, 0))
        self.order = len(pods)
        self.seen = 0
        self.started: dict[str, float] = {}
        self.epoch: dict[str, int] = {}
        self.placed_milli = 0
        self.counts = {"invalid": 0, "timed_out": 0, "preemptions": 0}
        self.submit_ns: list[int] = []
        self.release_ns: list[int] = []

    def run(self) -> tuple[list[float], list[float], list[int]]:
        times, alloc, queue = [], [], []
        capacity = self.s.state.total_gpu_milli()
        while self.heap:
            now, _, kind, name, epoch = heapq.heappop(self.heap)
            if kind == "arrive":
                self._arrive(name, now)
            elif self.epoch.get(name) == epoch and name in self.s.gangs():
                t0 = time.perf_counter_ns()
                self.s.release(name, now=now)
                self.release_ns.append(time.perf_counter_ns() - t0)
                self.placed_milli -= self.pods[name].pod.total_gpu_milli
                self.epoch.pop(name)
            self._follow_events(now)
            times.append(now)
            alloc.append(100.0 * self.placed_milli / capacity)
            queue.append(len(self.s.queue))
        return times, alloc, queue

    def _arrive(self, name: str, now: float) -> None:
        t0 = time.perf_counter_ns()
        try:
            self.s.submit(self.pods[name].request(self.timeout_s), now=now)
        except RequestError:
            self.counts["invalid"] += 1
        self.submit_ns.append(time.perf_counter_ns() - t0)

    def _follow_events(self, now: float) -> None:
        """Start the runtime of pods the scheduler placed; count notices and timeouts."""
        events = self.s.events
        for e in events[self.seen :]:
            if e.kind is EventKind.PLACED:
                epoch = e.detail["epoch"]
                self.epoch[e.gang] = epoch
                self.started.setdefault(e.gang, e.time)
                self.placed_milli += self.pods[e.gang].pod.total_gpu_milli
                heapq.heappush(self.heap, (e.time + self.pods[e.gang].runtime, self.order, "leave", e.gang, epoch))
                self.order += 1
            elif e.kind is EventKind.PREEMPT_NOTICE:
                self.counts["preemptions"] += 1
                if self.epoch.pop(e.gang, None) is not None:
                    self.placed_milli -= self.pods[e.gang].pod.total_gpu_milli
            elif e.kind is EventKind.TIMED_OUT:
                self.counts["timed_out"] += 1
        self.seen = len(events)
        if self.timeout_s is not None:
            self.s.tick(now)


def replay_dynamic(
    cluster: Cluster,
    pods: list[TimedPod],
    policy: str = "fgd-strand",
    typical: TypicalPods | None = None,
    seed: int = 42,
    timeout_s: float | None = None,
) -> DynamicResult:
    """Replay ``pods`` (see ``read_timed_pods``) through a new ``Scheduler`` over ``cluster``.

    Args:
        cluster: the nodes.
        pods: the timed pods.
        policy: placement policy.
        typical: typical pods for fragmentation-aware policies (default: from ``pods``).
        seed: seeds the scheduler's node tie order.
        timeout_s: a pod waiting longer fails (None: pods wait until the end of the trace).
    """
    typical = typical or TypicalPods.from_shapes([t.pod.shape for t in pods])
    start = time.perf_counter()
    r = _Replay(Scheduler(cluster, policy=policy, typical=typical, seed=seed), pods, timeout_s)
    times, alloc, queue = r.run()
    delays: dict[int, list[float]] = {}
    for name, t in r.pods.items():
        if name in r.started:
            delays.setdefault(t.priority, []).append(r.started[name] - t.arrival)
        else:
            delays.setdefault(t.priority, [])
    never = len(pods) - len(r.started) - r.counts["invalid"] - r.counts["timed_out"]
    return DynamicResult(
        times=np.array(times), alloc_pct=np.array(alloc), queue_len=np.array(queue),
        delays_s={p: np.array(d) for p, d in delays.items()}, invalid=r.counts["invalid"],
        timed_out=r.counts["timed_out"], never_ran=never, preemptions=r.counts["preemptions"],
        submit_ns=np.array(r.submit_ns), release_ns=np.array(r.release_ns), wall_s=time.perf_counter() - start,
    )

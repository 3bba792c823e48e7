"""Decision latency on the path a job takes (``Scheduler.submit`` / ``release``) and the dynamic replay.

    python scripts/bench_scheduler.py --json docs/figures/bench/bench_scheduler_quiet.json

* ``fill``: the default trace's pods, inflated to 1.3x the GPU capacity as in the FGD protocol
  (seed 42), submitted one by one to a ``Scheduler`` over all 1,523 nodes until the end; every
  ``submit`` timed once (wall clock, and the thread's CPU time, which excludes waits for a core
  on a shared machine). Pods that do not fit wait in the queue.
* ``release``: the same fill stopped when 1,000 gangs wait; then random placed gangs are released
  one by one (each timed) while a new pod arrives after each, so that about 1,000 always wait.
* ``dynamic``: the trace replayed with its arrival and departure times through ``submit`` /
  ``release`` (``infra.replay.dynamic``), at the trace's speed and with arrivals compressed.

Each part also measures a baseline policy (``--baseline``, FGD by default: the scoring fgd-strand
builds on) in the same run on the same machine, the two schedulers fed the same pods in lockstep, and
reports ``baseline_<policy>`` and ``ratio_<figure>_vs_<policy>``: a ratio moves less than the
absolute times with the machine and its load. The JSON is rewritten after each part.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_report import BenchReport, output_path

from infra.replay.dynamic import read_timed_pods, replay_dynamic
from infra.replay.trace import arrival_sequence, read_pods
from infra.scheduler import Scheduler
from infra.scheduler.frag import TypicalPods
from infra.scheduler.requests import RequestError
from infra.scheduler.resources import Cluster

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-openb-2023"


def _percentiles(ns: list[int]) -> dict[str, float]:
    ms = np.array(ns) / 1e6
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "max": float(ms.max())}


def _timed(fn, wall: list[int], cpu: list[int]):
    t, c = time.perf_counter_ns(), time.thread_time_ns()
    try:
        return fn()
    finally:
        wall.append(time.perf_counter_ns() - t)
        cpu.append(time.thread_time_ns() - c)


def _setup(args, policy: str):
    from infra.replay.dynamic import TimedPod

    pods = read_pods(args.pods)
    cluster = Cluster.from_csv(args.nodes)
    typical = TypicalPods.from_shapes([p.shape for p in pods])
    sched = Scheduler(cluster, policy=policy, typical=typical, seed=args.seed)
    seq = arrival_sequence(pods, sched.state.total_gpu_milli(), args.inflate, args.seed)
    reqs = [dataclasses.replace(TimedPod(p, 0.0, 1.0, 0).request(None), name=f"{p.name}#{i}") for i, p in enumerate(seq)]
    return sched, reqs


def _policies(args) -> list[str]:
    """The policy measured, then the baseline (none when it is the same policy or ``none``)."""
    return [args.policy] + ([args.baseline] if args.baseline not in ("none", args.policy) else [])


def _with_baseline(args, figures: dict[str, dict], keys: tuple[str, ...]) -> dict:
    """The measured policy's figures, the baseline's under ``baseline_<policy>`` and ``ratio_<key>_vs_<policy>``."""
    out = dict(figures[args.policy])
    for policy in _policies(args)[1:]:
        out[f"baseline_{policy}"] = figures[policy]
        out.update({f"ratio_{k}_vs_{policy}": out[k] / figures[policy][k] for k in keys})
    return out


def bench_fill(args) -> dict:
    """Every submit of the inflated fill, timed once; each pod goes to the measured policy's scheduler and
    right after to the baseline's, so that both see the same moment of the machine."""
    runs = {p: _setup(args, p) for p in _policies(args)}
    times = {p: ([], []) for p in runs}
    placed = dict.fromkeys(runs, 0)
    for i, req in enumerate(runs[args.policy][1]):
        for policy, (sched, _) in runs.items():
            try:
                placed[policy] += _timed(lambda s=sched, r=req, i=i: s.submit(r, now=float(i)), *times[policy]) is not None
            except RequestError:
                continue
    figures = {}
    for policy, (sched, _) in runs.items():
        wall, cpu = (_percentiles(t) for t in times[policy])
        figures[policy] = {
            "submits": len(times[policy][0]), "placed_at_once": placed[policy], "waiting_at_end": len(sched.queue),
            "alloc_pct_at_end": 100.0 * sched.state.used_gpu_milli() / sched.state.total_gpu_milli(),
            "submit_latency_p50_ms": wall["p50"], "submit_latency_p99_ms": wall["p99"],
            "submit_latency_max_ms": wall["max"], "submit_cpu_p50_ms": cpu["p50"], "submit_cpu_p99_ms": cpu["p99"],
        }
    return _with_baseline(args, figures, ("submit_latency_p50_ms", "submit_latency_p99_ms", "submit_cpu_p99_ms"))


def _fill_until_waiting(sched: Scheduler, reqs: list, waiting: int):
    """Submit ``reqs`` until ``waiting`` gangs wait; the rest of them, as an iterator."""
    it = iter(enumerate(reqs))
    for i, req in it:
        with contextlib.suppress(RequestError):
            sched.submit(req, now=float(i))
        if len(sched.queue) >= waiting:
            break
    return it


def bench_release(args) -> dict:
    """Releases while about ``args.waiting`` gangs wait in the queue; the measured policy's and the
    baseline's releases alternate."""
    runs = {}
    for policy in _policies(args):
        sched, reqs = _setup(args, policy)
        runs[policy] = (sched, _fill_until_waiting(sched, reqs, args.waiting), np.random.default_rng(args.seed))
    times = {p: ([], [], []) for p in runs}
    for k in range(args.releases):
        for policy, (sched, it, rng) in runs.items():
            nxt = next(it, None)
            if nxt is None:
                continue
            placed = sorted(sched.placements)
            victim = placed[int(rng.integers(len(placed)))]
            wall, cpu, queue = times[policy]
            queue.append(len(sched.queue))
            _timed(lambda s=sched, v=victim, k=k: s.release(v, now=1e6 + k), wall, cpu)
            with contextlib.suppress(RequestError):
                sched.submit(nxt[1], now=1e6 + k + 0.5)
    figures = {}
    for policy, (wall_ns, cpu_ns, queue) in times.items():
        wall, cpu = _percentiles(wall_ns), _percentiles(cpu_ns)
        figures[policy] = {
            "releases": len(wall_ns), "waiting_mean": float(np.mean(queue)), "waiting_min": int(np.min(queue)),
            "release_latency_p50_ms": wall["p50"], "release_latency_p99_ms": wall["p99"],
            "release_latency_max_ms": wall["max"], "release_cpu_p50_ms": cpu["p50"], "release_cpu_p99_ms": cpu["p99"],
        }
    return _with_baseline(args, figures, ("release_latency_p50_ms", "release_latency_p99_ms", "release_cpu_p99_ms"))


def bench_dynamic(args) -> dict:
    """The dynamic replay at each speed-up, for the measured policy and then the baseline."""
    cluster = Cluster.from_csv(args.nodes)
    out = {}
    for speedup in args.speedups:
        pods = read_timed_pods(args.pods, speedup)
        figures = {p: replay_dynamic(cluster, pods, policy=p, seed=args.seed).summary() for p in _policies(args)}
        out[f"speedup_{speedup:g}"] = _with_baseline(args, figures, ("wall_s", "submit_p99_ms"))
    return out


def bounded(low: float, high: float, kind: type = float) -> Callable[[str], float]:
    """An argparse type: a finite number of ``kind`` within ``[low, high]``, else a one-line usage error."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside [{low:g}, {high:g}]")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=Path, default=TRACE / "openb_pod_list_default.csv")
    parser.add_argument("--nodes", type=Path, default=TRACE / "openb_node_list_all_node.csv")
    parser.add_argument("--policy", default="fgd-strand")
    parser.add_argument("--baseline", default="fgd",
                        help="policy measured beside it in the same run, for the ratio_* figures (none: no baseline)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--inflate", type=bounded(0.1, 10.0), default=1.3,
                        help="demand as a multiple of the cluster's GPU capacity (0.1 to 10; the FGD protocol: 1.3)")
    parser.add_argument("--waiting", type=bounded(0, 100_000, int), default=1000, help="gangs waiting during the release benchmark")
    parser.add_argument("--releases", type=bounded(1, 100_000, int), default=500)
    parser.add_argument("--speedups", type=float, nargs="+", default=[1.0, 50000.0])
    parser.add_argument("--only", choices=["fill", "release", "dynamic"], nargs="+", default=["fill", "release", "dynamic"])
    parser.add_argument("--json", type=output_path, default=None)
    args = parser.parse_args(argv)
    if not args.pods.is_file() or not args.nodes.is_file():
        parser.error(f"trace files not found ({args.pods}, {args.nodes}); pass --pods and --nodes")
    config = {k: v for k, v in vars(args).items() if k != "json"}
    report = BenchReport(args.json, config)
    for name in args.only:
        start = time.perf_counter()
        measure = {"fill": bench_fill, "release": bench_release, "dynamic": bench_dynamic}[name]
        report.part(name, lambda measure=measure, name=name: {name: measure(args)})
        print(f"({name}: {time.perf_counter() - start:.1f} s, load {os.getloadavg()[0]:.2f})", flush=True)
    return 1 if report.failed else 0

if __name__ == "__main__":
    sys.exit(main())

"""The elastic service pool: LLM function calls of many RLVR jobs on GPUs leased from the scheduler.

What the simulation's request-level model (``infra.llm.sim.service_pool``) describes, on Ray:

- *Slots* are long-lived service processes (Ray actors placed by the cluster's scheduler service
  as one CPU gang). Each hosts a :class:`~infra.llm.service_actors.RolloutService` and a
  :class:`~infra.llm.service_actors.TrainerService`, so every registered job's weights (and, on its
  trainer slot, its model, reference and Adam state) stay resident in the slot's host memory and
  are swapped onto the device per call, as those services do.
- *Leases*: a slot holds no GPU while idle. The first call that needs the device submits a
  one-GPU gang to the scheduler service (``infra.service.client``) and waits until it is placed; the slot
  hands the gang back once it has been idle for ``keep_alive_s``. GPU-time held is read from the
  scheduler's own event log (placed -> released of the lease gangs).
- *Requests*: every generate call (one turn of a job's batch) and every train step is one request,
  queued on its slot earliest deadline first; a job's deadline for iteration ``i`` is its start +
  ``(i + 1) * pace``, so the job furthest behind its dedicated schedule is served first. The pace is
  its seconds per iteration alone, profiled beforehand, then, from its first train step on, its own
  measured time per iteration less the time it waited in the pool.
- *Affinity*: a job is registered only on its home slots (``shape.rollout_homes`` rollout slots and one
  trainer slot); its requests go only there. Among its rollout homes the router decides on the
  slots' own reports (queue depth, prefill tokens in flight, sequences holding KV cache), homes
  that already hold the job's weights listed first so that ties keep the weights where they are.

Device work is real (the tiny model's generate and GRPO update on the slot's host); with a
:class:`CallEmulation` (the benchmark's ``infra.llm.sim.emulator.Emulation``) each call then holds its
lease until the workload's duration has passed: those figures are "emulated compute".
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from infra.common.typed_config import ConfigError
from infra.llm.handles import JobServices, LocalHandle
from infra.llm.model import ModelConfig
from infra.llm.pool_shape import PoolShape
from infra.llm.router import InstanceLoad, Router, load_router
from infra.llm.service_actors import RewardService, RolloutService, TrainerService

_POOLS = itertools.count()
"""Numbers the pools of this process, so that their gang names never collide."""


class EDFQueue:
    """Requests ordered by deadline (ties: submission order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._seq = itertools.count()

    def push(self, deadline: float) -> tuple[float, int]:
        """Queue a request due at ``deadline``; returns its ticket."""
        ticket = (deadline, next(self._seq))
        heapq.heappush(self._heap, ticket)
        return ticket

    def head(self) -> tuple[float, int] | None:
        """The ticket served next (earliest deadline), or None when empty."""
        return self._heap[0] if self._heap else None

    def pop(self) -> tuple[float, int]:
        """Remove and return the head."""
        return heapq.heappop(self._heap)

    def __len__(self) -> int:
        return len(self._heap)


@dataclass(frozen=True)
class PoolRequest:
    """One device call of one job on a slot (times in wall seconds, already scaled)."""

    job: str
    service: str
    """``rollout`` or ``trainer``."""
    method: str
    args: tuple
    deadline: float
    hold_s: float = 0.0
    """Emulated device time of the call (0: the real compute's own time)."""
    prefill_s: float = 0.0
    """Emulated prefill time (time to first token after the call starts)."""
    swap_s: float = 0.0
    """Emulated host-to-device copy, charged when the slot's device last served another job."""
    prompt_tokens: int = 0
    sequences: int = 0


@dataclass(frozen=True)
class RequestRecord:
    """A request as the slot served it (wall clock, ``time.time``)."""

    job: str
    fn: str
    slot: str
    deadline: float
    submitted: float
    start: float
    first_token: float
    end: float
    swapped: bool
    lease: str


@dataclass(frozen=True)
class LeaseRecord:
    """One GPU lease of a slot: the gang, where it was placed, how long the placement took."""

    gang: str
    slot: str
    node: str
    gpus: tuple[int, ...]
    asked: float
    placed: float
    released: float | None = None


@dataclass(frozen=True)
class SlotReport:
    """What a slot reports of its load (the router decides on these)."""

    slot: str
    queue_depth: int
    """Requests waiting for the device, plus the one running."""
    prefill_tokens: int
    """Prompt tokens of queued and running requests not yet prefilled."""
    kv_sequences: int
    """Sequences holding KV cache on the device (the running generate request's)."""
    leased: bool
    resident: str | None
    """Job whose weights the rollout engine holds."""


def choose_home(router: Router, job: str, prompt_tokens: int, reports: list[SlotReport]) -> int:
    """Index into ``reports`` of the slot that gets ``job``'s request: the router's choice on the reported
    loads, slots already holding the job's weights offered first (ties keep the weights where they are)."""
    order = sorted(range(len(reports)), key=lambda i: reports[i].resident != job)
    loads = [InstanceLoad(reports[i].queue_depth, reports[i].prefill_tokens, reports[i].kv_sequences) for i in order]
    return order[router.choose(prompt_tokens, loads)]


@dataclass(frozen=True)
class LeaseSpec:
    """The gang a slot submits for its GPU."""

    prefix: str
    cpu_milli: int = 100
    memory_mib: int = 256
    priority: int = 0
    tenant: str = "default"
    timeout_s: float = 60.0


class PoolSlot:
    """One service process of the pool: host-resident job state, an EDF device queue, its GPU lease.

    ``keep_alive_s`` None: the lease, once taken, is held until :meth:`release_lease` (dedicated
    placement). Becomes a threaded Ray actor (one thread per waiting request).
    """

    def __init__(self, name: str, model: ModelConfig, lease: LeaseSpec, keep_alive_s: float | None) -> None:
        self.name = name
        self.services = {"rollout": RolloutService(model), "trainer": TrainerService()}
        self.lease_spec = lease
        self.keep_alive_s = keep_alive_s
        self._cv = threading.Condition()
        self._queue = EDFQueue()
        self._busy = False
        self._idle_epoch = 0
        self._prefill_tokens = 0
        self._kv_sequences = 0
        self._last_trained: str | None = None
        self._lease_lock = threading.Lock()
        self._gang: Any = None
        self._lease_n = itertools.count()
        self._client: Any = None
        self.records: list[RequestRecord] = []
        self.leases: list[LeaseRecord] = []

    # ------------------------------------------------------------ host-only calls (no device)
    def host(self, service: str, method: str, *args: Any) -> Any:
        """Call a method of a service that touches host memory only (register, weights, unregister)."""
        return getattr(self.services[service], method)(*args)

    # ------------------------------------------------------------ device calls
    def run(self, req: PoolRequest) -> tuple[Any, RequestRecord]:
        """Queue ``req`` EDF, lease a GPU if none is held, run it, hold the device for its emulated time."""
        submitted = time.time()
        with self._cv:
            ticket = self._queue.push(req.deadline)
            self._prefill_tokens += req.prompt_tokens
            self._cv.wait_for(lambda: not self._busy and self._queue.head() == ticket)
            self._queue.pop()
            self._busy = True
            self._idle_epoch += 1
        try:
            lease = self._ensure_lease()
            start = time.time()
            swapped = self._swapping(req)
            with self._cv:
                self._kv_sequences = req.sequences
            result = getattr(self.services[req.service], req.method)(*req.args)
            if req.service == "trainer":
                self._last_trained = req.job
            swap = req.swap_s if swapped else 0.0
            time.sleep(max(0.0, start + swap + req.hold_s - time.time()))
            end = time.time()
        finally:
            with self._cv:
                self._busy = False
                self._kv_sequences = 0
                self._prefill_tokens -= req.prompt_tokens
                epoch = self._idle_epoch
                self._cv.notify_all()
            self._schedule_release(epoch)
        record = RequestRecord(req.job, req.method, self.name, req.deadline, submitted, start,
                               min(end, start + swap + req.prefill_s), end, swapped, lease)
        self.records.append(record)
        return result, record

    def _swapping(self, req: PoolRequest) -> bool:
        if req.service == "rollout":
            return self.services["rollout"].resident != req.job
        return self._last_trained != req.job

    # ------------------------------------------------------------ leases
    def _ensure_lease(self) -> str:
        from infra.scheduler.requests import Bundle, GangRequest
        from infra.service.client import connect

        with self._lease_lock:
            if self._gang is not None:
                return self._gang.name
            if self._client is None:
                self._client = connect(start_service=False)
            spec = self.lease_spec
            req = GangRequest(f"{spec.prefix}-{self.name}-{next(self._lease_n)}",
                              (Bundle(spec.cpu_milli, spec.memory_mib, gpus=1, name="gpu"),),
                              priority=spec.priority, tenant=spec.tenant)
            asked = time.time()
            gang = self._client.submit(req)
            try:
                status = gang.wait(timeout_s=spec.timeout_s)
            except BaseException:
                gang.release()
                raise
            a = status.placement.assignments[0]
            self.leases.append(LeaseRecord(req.name, self.name, a.node, tuple(a.gpus), asked, time.time()))
            self._gang = gang
            return gang.name

    def _schedule_release(self, epoch: int) -> None:
        if self.keep_alive_s is None:
            return
        timer = threading.Timer(self.keep_alive_s, self._release_if_idle, args=(epoch,))
        timer.daemon = True
        timer.start()

    def _release_if_idle(self, epoch: int) -> None:
        # The lease lock first: a request that has taken the device either holds it (and its lease
        # stays) or waits for it behind us (and leases again).
        with self._lease_lock:
            with self._cv:
                if self._busy or len(self._queue) or epoch != self._idle_epoch:
                    return
            self._hand_back()

    def release_lease(self) -> None:
        """Hand the GPU back to the scheduler (a no-op when none is held)."""
        with self._lease_lock:
            self._hand_back()

    def _hand_back(self) -> None:
        if self._gang is None:
            return
        gang, self._gang = self._gang, None
        gang.release()
        last = self.leases[-1]
        self.leases[-1] = dataclasses.replace(last, released=time.time())

    # ------------------------------------------------------------ reports and logs
    def report(self) -> SlotReport:
        """The slot's load as the slot itself sees it."""
        with self._cv:
            return SlotReport(self.name, len(self._queue) + int(self._busy), self._prefill_tokens, self._kv_sequences,
                              self._gang is not None, self.services["rollout"].resident)

    def logs(self) -> dict[str, list]:
        """Requests served, leases taken, and the services' slice logs."""
        return {"requests": list(self.records), "leases": list(self.leases),
                "slices": [(name, s) for name, svc in self.services.items() for s in svc.slices()]}


@dataclass(frozen=True)
class PoolConfig:
    """The running pool: its :class:`~infra.llm.pool_shape.PoolShape` (one slot process per GPU of each
    service, leasing that GPU per call) and what placing it on Ray needs (see the module docstring)."""

    shape: PoolShape
    """Slots of each service, a job's rollout homes, the keep-alive (in wall seconds) of an idle lease."""
    colocated: bool = False
    """Rollout and trainer of a job on the same slot (one GPU per slot for both: dedicated placement);
    ``shape.trainer_gpus`` is then ignored."""
    router: str = "prefill_decode_aware"
    """Router over a job's rollout homes, on the slots' reports (``infra.llm.router.load_router``)."""
    priority: int = 0
    tenant: str = "default"
    lease_timeout_s: float = 60.0
    """Longest wait for one lease to be placed."""

    def validate(self) -> None:
        """Raise :class:`~infra.common.typed_config.ConfigError` naming the field and the fix."""
        self.shape.validate()
        if self.shape.rollout_homes > self.shape.rollout_gpus:
            raise ConfigError(f"shape.rollout_homes={self.shape.rollout_homes} exceeds shape.rollout_gpus="
                              f"{self.shape.rollout_gpus} (one slot each); lower rollout_homes or add rollout slots.")
        try:
            load_router(self.router)
        except ValueError as e:
            raise ConfigError(str(e)) from e  # names the router and the valid ones


class CallEmulation(Protocol):
    """Emulated compute of one job (the benchmark's ``infra.llm.sim.emulator.Emulation``): per iteration,
    the device time each call holds its lease for, in workload seconds, and the wall seconds per workload
    second. The pool only reads it, so production code never imports the simulator."""

    work: list[Any]
    """Per iteration: ``turns`` (each with ``prompt_tokens``, ``sequences``, ``prefill_s``, ``decode_s``,
    ``stall_s``), ``train_s`` and ``reward_s``."""
    rollout_swap_s: float
    trainer_swap_s: float
    scale: float
    chunk_s: float


@dataclass
class _JobState:
    name: str
    rollout_homes: list[int]
    trainer_home: int
    pace_s: float
    emulation: CallEmulation | None
    start: float = field(default_factory=time.time)
    iteration: int = 0
    scored: bool = True
    """Whether the latest training rollout's reward time has passed (greedy evaluations have none)."""
    waited_s: float = 0.0
    """Time the job's requests spent queued, leasing and swapping: what it would not spend alone."""
    demand: tuple[float, float] = (1.0, 1.0)
    """Expected share of time generating and training alone."""

    def deadline(self) -> float:
        return self.start + (self.iteration + 1) * self.pace_s

    def served(self, req: PoolRequest, record: RequestRecord) -> None:
        """Account a served request; after a train step, the pace becomes the job's own measured time per
        iteration without its waits (a profile taken on other draws can be far off one run's draws, and
        EDF lets a job drift by as much as its pace overestimates it)."""
        self.waited_s += record.start - record.submitted + (req.swap_s if record.swapped else 0.0)
        if req.method == "train":
            self.iteration += 1
            self.pace_s = max(1e-6, (record.end - self.start - self.waited_s) / self.iteration)

    def work(self) -> Any | None:
        if self.emulation is None:
            return None
        return self.emulation.work[min(self.iteration, len(self.emulation.work) - 1)]


class ElasticPool:
    """Slots placed through the scheduler service, leasing GPUs per call; hands out job services.

    Args:
        client: ``infra.service.client.connect()``.
        model: the (tiny) model every slot's services host.
        cfg: pool shape.
    """

    def __init__(self, client: Any, model: ModelConfig, cfg: PoolConfig) -> None:
        import ray

        from infra.scheduler.requests import Bundle, GangRequest
        from infra.service.client import GangBackend

        cfg.validate()
        model.validate()
        self.cfg, self.client = cfg, client
        self.prefix = f"pool{os.getpid()}-{next(_POOLS)}"
        n = cfg.shape.rollout_gpus + (0 if cfg.colocated else cfg.shape.trainer_gpus)
        req = GangRequest(f"{self.prefix}-slots", tuple(Bundle(100, 512, name=f"slot{i}") for i in range(n)),
                          priority=cfg.priority, tenant=cfg.tenant)
        self.gang = client.submit(req)
        self.gang.wait(timeout_s=cfg.lease_timeout_s)
        backend = GangBackend(self.gang, restart=False)
        lease = LeaseSpec(self.prefix, priority=cfg.priority, tenant=cfg.tenant, timeout_s=cfg.lease_timeout_s)
        remote = ray.remote(PoolSlot)
        self.slots = [backend.start_actor(i, remote, f"s{i}", model, lease, cfg.shape.keep_alive_s,
                                          options={"max_concurrency": 64}) for i in range(n)]
        ray.get([s.report.remote() for s in self.slots])
        self.router: Router = load_router(cfg.router)
        self.reward = LocalHandle(RewardService())
        self._jobs: dict[str, _JobState] = {}
        self._demand = [0.0] * len(self.slots)
        """Expected busy share of the jobs homed on each slot."""
        self._lock = threading.Lock()

    def job_services(self, job: str, *, pace_s: float, demand: tuple[float, float] = (1.0, 1.0),
                     emulation: CallEmulation | None = None) -> JobServices:
        """Choose ``job``'s homes and return its services (handles for ``infra.llm.rlvr.run_job``).

        ``demand``: the job's expected share of time generating and training when alone (profiled
        beforehand); its rollout homes are the ``shape.rollout_homes`` slots, and its trainer the trainer slot,
        with the least demand of the jobs already there (ties: lowest index)."""
        c = self.cfg.shape
        with self._lock:
            if job in self._jobs:
                raise ValueError(f"job {job!r} is already in the pool; pick a new name.")
            homes = sorted(sorted(range(c.rollout_gpus), key=lambda i: (self._demand[i], i))[: c.rollout_homes])
            trainers = range(c.rollout_gpus, len(self.slots))
            trainer = homes[0] if self.cfg.colocated else min(trainers, key=lambda i: (self._demand[i], i))
            for i in homes:
                self._demand[i] += demand[0] / len(homes)
            self._demand[trainer] += demand[1]
            state = _JobState(job, homes, trainer, pace_s, emulation, demand=demand)
            self._jobs[job] = state
        return JobServices(_RolloutHandle(self, state), _RewardHandle(self.reward, state), _TrainerHandle(self, state))

    def route(self, state: _JobState, prompt_tokens: int) -> int:
        """The rollout home of ``state``'s job for a request, chosen by the router on the homes' reports."""
        import ray

        reports = ray.get([self.slots[i].report.remote() for i in state.rollout_homes])
        return state.rollout_homes[choose_home(self.router, state.name, prompt_tokens, reports)]

    def finish(self, job: str) -> None:
        """The job ended: drop it; a slot no other job uses hands its GPU back now."""
        import ray

        with self._lock:
            state = self._jobs.pop(job)
            for i in state.rollout_homes:
                self._demand[i] -= state.demand[0] / len(state.rollout_homes)
            self._demand[state.trainer_home] -= state.demand[1]
            used = {i for s in self._jobs.values() for i in (*s.rollout_homes, s.trainer_home)}
        ray.get([self.slots[i].release_lease.remote() for i in {*state.rollout_homes, state.trainer_home} - used])

    def logs(self) -> dict[str, list]:
        """Every slot's requests, leases and service slices (``("s<i>/<service>", SliceRecord)``)."""
        import ray

        out: dict[str, list] = {"requests": [], "leases": [], "slices": []}
        for i, part in enumerate(ray.get([s.logs.remote() for s in self.slots])):
            for key, rows in part.items():
                out[key] += [(f"s{i}/{service}", r) for service, r in rows] if key == "slices" else rows
        return out

    def close(self) -> None:
        """Hand back every lease, then the slots' gang."""
        import ray

        with contextlib.suppress(Exception):
            ray.get([s.release_lease.remote() for s in self.slots], timeout=60)
        self.gang.release()


class _RolloutHandle:
    """A job's rollout service in the pool: host calls to its homes, generate routed and queued EDF."""

    def __init__(self, pool: ElasticPool, state: _JobState) -> None:
        self.pool, self.state = pool, state

    def call(self, method: str, *args: Any) -> Any:
        import ray

        slots = [self.pool.slots[i] for i in self.state.rollout_homes]
        if method != "generate":
            return ray.get([s.host.remote("rollout", method, *args) for s in slots])[0]
        work = self.state.work()
        prompt_tokens = sum(map(len, args[1]))
        if work is None or args[3] == 0.0:  # real compute alone; greedy evaluations are not emulated
            return self._run(PoolRequest(self.state.name, "rollout", "generate", args, self.state.deadline(),
                                         prompt_tokens=prompt_tokens, sequences=len(args[1])))
        em = self.state.emulation
        result = None
        for turn in work.turns:
            pieces = max(1, math.ceil(turn.decode_s / em.chunk_s))
            slot = self.pool.route(self.state, turn.prompt_tokens)
            for k in range(pieces):  # the first piece prefills; the rest continue on the slot holding the KV cache
                result = self._run(PoolRequest(
                    self.state.name, "rollout", "generate", args, self.state.deadline(),
                    hold_s=((turn.prefill_s if k == 0 else 0.0) + turn.decode_s / pieces) * em.scale,
                    prefill_s=turn.prefill_s * em.scale if k == 0 else 0.0, swap_s=em.rollout_swap_s * em.scale,
                    prompt_tokens=turn.prompt_tokens if k == 0 else 0, sequences=turn.sequences), slot)
            time.sleep(turn.stall_s * em.scale)  # tool calls: the job waits, holding no GPU
        self.state.scored = False
        return result

    def call_ref(self, method: str, *args: Any) -> tuple[Any, Any]:
        return self.call(method, *args)

    def _run(self, req: PoolRequest, slot: int | None = None) -> Any:
        import ray

        slot = self.pool.route(self.state, req.prompt_tokens) if slot is None else slot
        result, record = ray.get(self.pool.slots[slot].run.remote(req))
        self.state.served(req, record)
        return result


class _TrainerHandle:
    """A job's trainer service: device calls queued EDF on its trainer slot, the rest host-only."""

    DEVICE = frozenset({"supervised", "finish_warmup", "train"})

    def __init__(self, pool: ElasticPool, state: _JobState) -> None:
        self.pool, self.state = pool, state

    def call(self, method: str, *args: Any) -> Any:
        import ray

        slot = self.pool.slots[self.state.trainer_home]
        if method not in self.DEVICE:
            return ray.get(slot.host.remote("trainer", method, *args))
        work, em = self.state.work(), self.state.emulation
        emulated = work is not None and method == "train"
        req = PoolRequest(self.state.name, "trainer", method, args, self.state.deadline(),
                          hold_s=work.train_s * em.scale if emulated else 0.0,
                          swap_s=em.trainer_swap_s * em.scale if emulated else 0.0)
        result, record = ray.get(slot.run.remote(req))
        self.state.served(req, record)
        return result

    def call_ref(self, method: str, *args: Any) -> tuple[Any, Any]:
        """``(payload reference, meta)``: the weights stay in the object store, the driver never fetches them."""
        import ray

        slot = self.pool.slots[self.state.trainer_home]
        payload, meta = slot.host.options(num_returns=2).remote("trainer", method, *args)
        return payload, ray.get(meta)


class _RewardHandle:
    """The CPU reward service, then the workload's verification time (a stall that holds no GPU)."""

    def __init__(self, reward: LocalHandle, state: _JobState) -> None:
        self.reward, self.state = reward, state

    def call(self, method: str, *args: Any) -> Any:
        out = self.reward.call(method, *args)
        work = self.state.work()
        if work is not None and method == "score" and not self.state.scored:
            self.state.scored = True
            time.sleep(work.reward_s * self.state.emulation.scale)
        return out

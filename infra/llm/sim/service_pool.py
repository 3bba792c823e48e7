"""Request-level multiplexing (PlexRL/RollMux-style services), a discrete-event simulation.

The jobs share a rollout service of single-GPU instances behind a router and a trainer service of
GPU gangs; each generation request (one turn of one sequence) and each train step is scheduled on
its own, on instances of the nodes holding the job's weights, swapping weights in from host memory
when an instance switches job. :class:`ServiceSim` is the event loop, one method per
:class:`PoolEventKind`; :func:`simulate_services` validates the inputs and runs it.

Billing: GPUs held x time held (a static pool: from the first arrival to the last job's end; an
elastic pool: each GPU while taken), and the GPU-time charged (what the jobs' functions occupied,
swaps included). The workload and cost model are in :mod:`infra.llm.sim.workload`.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum, IntEnum
from typing import Any

import numpy as np

from infra.common.typed_config import ConfigError
from infra.llm.pool_shape import PoolShape
from infra.llm.sim.workload import (
    Hardware,
    JobProfile,
    batch_key,
    draw_batch,
    extra_turns,
    lognormal,
    turn_lengths,
)


class HomeRule(Enum):
    """How :class:`ServiceSim` picks each job's home nodes (rollout and trainer)."""

    INDEX = "index"
    """Job ``k``'s homes are nodes ``k * home_nodes ...`` modulo the nodes (the standalone benchmark)."""
    DEMAND = "demand"
    """Jobs in order take the nodes with the least expected demand of the jobs already there (ties:
    lowest index), as the running pool (``infra.llm.elastic.ElasticPool.job_services``) does; needs
    ``demand`` in :func:`simulate_services`."""


class DrawSource(Enum):
    """Where :class:`ServiceSim` draws each iteration's batch (lengths, turns, tool calls, reward) from."""

    SIMULATION = "simulation"
    """The simulation's own streams (``batch_key``; the standalone benchmark)."""
    EMULATOR = "emulator"
    """The running pool's compute-emulator streams (:func:`~infra.llm.sim.workload.draw_batch`), so that
    the simulation of a real run sees the very sequences the run emulated."""


@dataclass(frozen=True)
class ServicePool:
    """Shared LLM services for request-level multiplexing (see :func:`simulate_services`): the pool's
    :class:`~infra.llm.pool_shape.PoolShape` (the description the running pool reads too) and what only
    the simulation's cost model needs.

    The rollout service is ``shape.rollout_gpus`` single-GPU instances on nodes of ``node_gpus``; the
    trainer service is ``shape.trainer_gpus`` GPUs cut into gangs of the jobs' ``gpus``; a job's rollout
    homes are ``shape.rollout_homes`` nodes. With ``shape.keep_alive_s`` set the pool is *elastic*: its
    sizes are caps, a GPU is taken from the cluster when a function needs it and handed back once idle
    for the keep-alive (losing its weights and KV caches).
    """

    shape: PoolShape
    node_gpus: int = 8
    """GPUs per node; a node's instances and gangs share its host memory, where a job's state lives."""
    capacity: int = 256
    """Concurrent sequences per rollout instance (KV-cache memory of a 7B GQA model on 80 GB)."""
    max_resident: int = 1
    """Jobs' weights on one rollout GPU at once (more than 1: their decode steps take turns)."""
    swap: bool = True
    """Charge host-to-device swaps; False models dedicated GPUs whose state stays resident."""
    provision_s: float = 2.0
    """Elastic pools: seconds from taking a GPU to its first function (engine start); the job's weights
    are then copied in from host memory like any swap. Charged to the job that needed the GPU."""
    held_from_ready: bool = False
    """Elastic pools: a GPU counts as held from when it is ready (after ``provision_s``), as a lease of
    the running pool counts from its placement; False: from when it is asked for."""
    turn_sync: bool = False
    """Rollouts are turn-synchronous, as the running pool's: each turn of a job's batch is one request on
    one instance (the router picks it for the turn's first sequence), and the sequences that go on start
    their next turn together, once the last one finished this turn and the slowest of their tool calls
    returned. False: each sequence is routed, and goes on when its own tool call returns, on its own."""
    homes: HomeRule = HomeRule.INDEX
    """How jobs' home nodes are chosen (:class:`HomeRule`)."""
    draws: DrawSource = DrawSource.SIMULATION
    """Where each iteration's batch is drawn from (:class:`DrawSource`)."""
    trainer_home_nodes: int | None = None
    """Trainer nodes per job (None: ``shape.rollout_homes``); the running pool gives each job 1 trainer slot."""
    release_on_finish: bool = False
    """Elastic pools: when a job ends, the idle GPUs of its homes that no unfinished job shares are
    handed back at once, without waiting for the keep-alive (``ElasticPool.finish``)."""

    def with_shape(self, **changes: Any) -> ServicePool:
        """This pool with ``changes`` to its shape, e.g. ``with_shape(rollout_gpus=4, keep_alive_s=5.0)``."""
        return replace(self, shape=replace(self.shape, **changes))

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad field and the fix (whether the pool fits the jobs'
        GPUs is :func:`simulate_services`' check)."""
        self.shape.validate()
        for name in ("node_gpus", "capacity", "max_resident"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1.")
        if self.trainer_home_nodes is not None and self.trainer_home_nodes < 1:
            raise ConfigError(f"trainer_home_nodes={self.trainer_home_nodes} must be >= 1 (None: shape.rollout_homes).")
        if self.shape.elastic and not self.provision_s >= 0:
            raise ConfigError(f"provision_s={self.provision_s} must be >= 0 seconds.")


@dataclass
class ServiceResult:
    """Outcome of :func:`simulate_services`.

    ``jobs[name]``: ``jct_s``, ``charged_gpu_s`` (GPU-time its functions occupied, swaps included),
    ``swap_gpu_s``. ``reserved_gpu_s``: GPU-time the pool held (static: pool GPUs x makespan; elastic:
    each GPU from when it was taken to when it was handed back); ``peak_gpus``: most GPUs held at once;
    ``busy_gpu_s`` = sum of charges.
    With ``trace``: ``chunks`` rows ``(instance, job, start, end, job's sequences in the chunk, sequences on
    the instance, resident jobs)``,
    ``served`` rows ``(job, iteration, sequence, turn, instance)`` and, for elastic pools, ``holds`` rows
    ``(service, index, taken, handed back)`` (service ``"rollout"``: an instance; ``"trainer"``: a gang).
    """

    jobs: dict[str, dict[str, float]]
    makespan_s: float
    reserved_gpu_s: float
    busy_gpu_s: float
    peak_gpus: int = 0
    chunks: list[tuple[int, str, float, float, int, int, tuple[str, ...]]] = field(default_factory=list)
    served: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    homes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    holds: list[tuple[str, int, float, float]] = field(default_factory=list)


class PoolEventKind(IntEnum):
    """Events of :class:`ServiceSim`. Each event carries two integers ``(a, b)``, named per kind."""

    CHUNK_END = 0
    """Instance ``a`` finished its running chunk."""
    TURN_REQUEST = 1
    """Job ``a``'s sequence ``b`` returned from its tool call and asks for its next turn."""
    ROLLOUT_DONE = 2
    """Job ``a``'s whole batch was generated and rewarded: it waits for a trainer gang."""
    TRAIN_END = 3
    """Gang ``a`` finished job ``b``'s train step."""
    ARRIVAL = 4
    """Job ``a`` arrives and starts its first iteration."""
    INSTANCE_READY = 5
    """Instance ``a``, newly taken from the cluster, finished starting up."""
    INSTANCE_IDLE = 6
    """Instance ``a`` stayed idle for the keep-alive since hold token ``b``: hand it back."""
    GANG_IDLE = 7
    """Gang ``a`` stayed free for the keep-alive since hold token ``b``: hand it back."""
    BATCH_TURN = 8
    """Turn-synchronous pools: job ``a``'s slowest tool call returned; its sequences that go on ask for
    their next turn."""


@dataclass
class _Instance:
    node: int
    max_resident: int
    seqs: dict[int, set[int]] = field(default_factory=dict)  # job -> sequences decoding here
    resident: dict[int, tuple[int, int]] = field(
        default_factory=dict
    )  # job -> (load id, weight version), LRU first
    swap_due: set[int] = field(default_factory=set)
    n: int = 0
    rr: int = 0
    current: tuple[int, np.ndarray, int] | None = None
    held_since: float | None = 0.0  # None: handed back to the cluster (elastic pools)
    ready_at: float = 0.0
    idle_token: int = 0

    def holds(self, j: int, version: int) -> bool:
        return self.resident.get(j, (-1, -1))[1] == version

    def slot_for(self, j: int) -> bool:
        """Job ``j`` can run here without evicting a job that has sequences on this GPU."""
        return (
            j in self.resident
            or len(self.resident) < self.max_resident
            or any(not self.seqs.get(k) for k in self.resident)
        )


@dataclass
class _Gang:
    """A trainer gang of the jobs' ``gpus`` GPUs."""

    free: bool = True
    last: int = -1  # job whose training state is on it
    held_since: float | None = 0.0  # None: handed back to the cluster (elastic pools)
    token: int = 0  # bumped on every use, so a stale hand-back event is ignored


@dataclass
class _SJob:
    p: JobProfile
    index: int
    seed: int
    homes: list[int]
    gangs: list[int]
    target: int
    draws: DrawSource = DrawSource.SIMULATION
    iteration: int = 0
    version: int = 0
    end: float = -1.0
    charged: float = 0.0
    swapped: float = 0.0
    tokens: float = 0.0
    done: int = 0
    reward_s: float = 0.0
    in_turn: int = 0  # turn-synchronous pools: sequences still decoding the batch's current turn
    going_on: list[int] = field(default_factory=list)  # ... and those that finished it and go on
    stall_s: float = 0.0  # ... and the slowest tool call among them
    turn_inst: int = -1  # ... and the instance serving the turn (one request per turn), -1 before it is routed

    def start_iteration(self) -> None:
        """Draw the iteration's batch and reward time (streams keyed by :func:`batch_key`)."""
        if self.draws is DrawSource.EMULATOR:
            d = draw_batch(self.p, self.seed, self.iteration)
            self.set_batch(d.prompt, d.turn_len, d.tool_s, d.tool_tokens, d.n_turns, d.reward_s)
            return
        p, n = self.p, self.p.batch
        key = batch_key(self.seed, p.name, self.iteration)
        rng = np.random.default_rng(key)
        extra = extra_turns(p, rng, n)
        prompt = np.maximum(1, lognormal(rng, p.prompt_median, p.prompt_sigma, n))
        first = turn_lengths(p, rng, n)
        self.reward_s = float(lognormal(rng, p.reward_median_s, 0.5))
        turns_rng = np.random.default_rng([*key, 1000])
        width = max(1, int(extra.max()))
        self.turn_len = np.column_stack([first, turn_lengths(p, turns_rng, n * width).reshape(n, width)])
        self.tool_s = np.minimum(
            lognormal(turns_rng, p.tool_median_s, p.tool_sigma, n * width), p.tool_cap_s
        ).reshape(n, width)
        tool_tokens = np.maximum(1, lognormal(turns_rng, p.tool_tokens_median, 0.5, n * width)).reshape(n, width)
        self.set_batch(prompt, self.turn_len, self.tool_s, tool_tokens, extra + 1, self.reward_s)

    def set_batch(
        self,
        prompt: np.ndarray,
        turn_len: np.ndarray,
        tool_s: np.ndarray,
        tool_tokens: np.ndarray,
        n_turns: np.ndarray,
        reward_s: float,
    ) -> None:
        """Start the iteration on a drawn batch (``[n]`` prompts and turns, ``[n, turns]`` the rest)."""
        n = self.p.batch
        self.turn_len, self.tool_s, self.tool_tokens, self.reward_s = turn_len, tool_s, tool_tokens, reward_s
        self.n_turns = n_turns
        self.turn = np.zeros(n, dtype=np.int64)
        first = turn_len[:, 0]
        self.remaining = first.copy()
        self.context = prompt.copy()
        self.delta = prompt.copy()  # tokens to prefill when the KV cache of the sequence is still there
        self.prefill = np.zeros(n)
        self.kv = np.full((n, 2), -1, dtype=np.int64)  # (instance, load id) holding the sequence's KV cache
        self.tokens, self.done = 0.0, 0
        self.in_turn, self.going_on, self.stall_s, self.turn_inst = n, [], 0.0, -1


def _homes(index: int, n_nodes: int, k: int) -> list[int]:
    k = min(k, n_nodes)
    return sorted({(index * k + m) % n_nodes for m in range(k)})


def _homes_by_demand(demand: Sequence[float], n_nodes: int, k: int) -> list[list[int]]:
    """Each job in order gets the ``k`` nodes with the least summed ``demand`` of the jobs already
    there (ties: lowest index), adding its demand split over them."""
    load = [0.0] * n_nodes
    out = []
    for d in demand:
        nodes = sorted(sorted(range(n_nodes), key=lambda nd: (load[nd], nd))[: min(k, n_nodes)])
        for nd in nodes:
            load[nd] += d / len(nodes)
        out.append(nodes)
    return out


def home_nodes(
    profiles: Sequence[JobProfile],
    pool: ServicePool,
    n_rnodes: int,
    n_tnodes: int,
    demand: Mapping[str, tuple[float, float]] | None,
) -> list[tuple[list[int], list[int]]]:
    """Per job, its rollout and trainer home nodes under ``pool.homes`` (``demand[name]``: the job's
    expected share of time generating and training alone, for :attr:`HomeRule.DEMAND`)."""
    kt = pool.shape.rollout_homes if pool.trainer_home_nodes is None else pool.trainer_home_nodes
    if pool.homes is HomeRule.INDEX:
        return [(_homes(k, n_rnodes, pool.shape.rollout_homes), _homes(k, n_tnodes, kt)) for k in range(len(profiles))]
    rollout = _homes_by_demand([demand[p.name][0] for p in profiles], n_rnodes, pool.shape.rollout_homes)
    trainer = _homes_by_demand([demand[p.name][1] for p in profiles], n_tnodes, kt)
    return list(zip(rollout, trainer, strict=True))


class ServiceSim:
    """The event loop of :func:`simulate_services`: the pool's instances, gangs and queues, and one
    handler per :class:`PoolEventKind`. Inputs are validated by :func:`simulate_services`."""

    def __init__(
        self,
        profiles: list[JobProfile],
        hw: Hardware,
        pool: ServicePool,
        seed: int,
        arrive: list[float],
        pace: Mapping[str, float] | None,
        trace: bool,
        demand: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        self.hw, self.pool, self.arrive, self.pace, self.trace = hw, pool, arrive, pace, trace
        self.gpus = gpus = profiles[0].gpus
        self.elastic = pool.shape.elastic
        n_rnodes = -(-pool.shape.rollout_gpus // pool.node_gpus)
        held = None if self.elastic else 0.0  # an elastic pool starts with every GPU handed back
        self.inst = [
            _Instance(i // pool.node_gpus, pool.max_resident, held_since=held)
            for i in range(pool.shape.rollout_gpus)
        ]
        by_node = [[i for i, x in enumerate(self.inst) if x.node == nd] for nd in range(n_rnodes)]
        n_gangs = pool.shape.trainer_gpus // gpus
        per_tnode = pool.node_gpus // gpus
        n_tnodes = -(-n_gangs // per_tnode)
        self.gangs = [_Gang(held_since=held) for _ in range(n_gangs)]
        self.jobs: list[_SJob] = []
        for k, (p, (rnodes, tnodes)) in enumerate(
            zip(profiles, home_nodes(profiles, pool, n_rnodes, n_tnodes, demand), strict=True)
        ):
            homes = [i for nd in rnodes for i in by_node[nd]]
            gangs = [g for nd in tnodes for g in range(nd * per_tnode, min(n_gangs, (nd + 1) * per_tnode))]
            self.jobs.append(_SJob(p, k, seed, homes, gangs, -(-p.batch // p.gpus), pool.draws))
        self.held_now = 0 if self.elastic else pool.shape.rollout_gpus + pool.shape.trainer_gpus  # GPUs the pool holds
        self.held_gpu_s = 0.0  # GPU-time of holds that ended (elastic pools)
        self.peak = self.held_now
        homes_by_job = {j.p.name: tuple(sorted({self.inst[i].node for i in j.homes})) for j in self.jobs}
        self.res = ServiceResult({}, 0.0, 0.0, 0.0, homes=homes_by_job)
        self.events: list[tuple[float, int, PoolEventKind, int, int]] = []
        self.counter = 0  # event sequence number: ties at one time keep the order of pushing
        self.loads = 0  # weight loads so far: a load id tells a KV cache whether its weights are still there
        self.queues: list[list[int]] = [[] for _ in self.jobs]  # sequences waiting for an instance, per job
        self.queued_at: list[list[float]] = [[] for _ in self.jobs]
        self.train_queue: list[int] = []
        self.kick: set[int] = set()  # instances to start a chunk on once the current event is handled
        self.roll_swap = 2 * profiles[0].params / hw.pcie_bytes_per_s if pool.swap else 0.0
        self.t = 0.0

    # ------------------------------------------------------------------ bookkeeping

    def push(self, t: float, kind: PoolEventKind, a: int, b: int = 0) -> None:
        self.counter += 1
        heapq.heappush(self.events, (t, self.counter, kind, a, b))

    def take(self, n: int) -> None:
        """The pool takes ``n`` GPUs from the cluster."""
        self.held_now += n
        self.peak = max(self.peak, self.held_now)

    def give(self, service: str, index: int, since: float, t: float) -> None:
        """The pool hands back instance or gang ``index`` of ``service``, held since ``since``."""
        n = 1 if service == "rollout" else self.gpus
        self.held_now -= n
        self.held_gpu_s += n * (t - since)
        if self.trace:
            self.res.holds.append((service, index, since, t))

    def urgency(self, j: int, waited_since: float) -> float:
        """Sort key of job ``j``'s queued work: its oldest wait (FIFO), or its deadline with ``pace`` (EDF)."""
        if self.pace is None:
            return waited_since
        return self.arrive[j] + (self.jobs[j].iteration + 1) * self.pace[self.jobs[j].p.name]

    # ------------------------------------------------------------------ rollout service

    def route(self, j: int, s: int) -> int | None:
        """Instance for job ``j``'s sequence ``s`` in the router's order of preference, or None (it waits)."""
        job, capacity = self.jobs[j], self.pool.capacity
        if job.turn_inst >= 0:  # turn-synchronous: the turn's batch is one request, on one instance
            x = self.inst[job.turn_inst]
            return job.turn_inst if x.n < capacity and x.slot_for(j) else None
        ki, kl = job.kv[s]
        if (
            ki >= 0
            and self.inst[ki].resident.get(j, (-1, -1)) == (kl, job.version)
            and self.inst[ki].n < capacity
        ):
            return int(ki)
        best, key = None, None
        for i in job.homes:
            x = self.inst[i]
            if x.n >= capacity:
                continue
            fresh = x.holds(j, job.version)
            if fresh and len(x.seqs.get(j, ())) < job.target:
                k = (0, x.n, i)
            elif x.n == 0 and x.slot_for(j):
                k = (1, 2 if x.held_since is None else 0 if fresh else 1, i)
            elif fresh or x.slot_for(j):
                k = (2, x.n, i)
            else:
                continue
            if key is None or k < key:
                best, key = i, k
        return best

    def assign(self, j: int, s: int, i: int) -> None:
        """Put job ``j``'s sequence ``s`` on instance ``i``, taking the GPU and loading weights as needed."""
        job, x, pool = self.jobs[j], self.inst[i], self.pool
        x.idle_token += 1  # cancels a pending hand-back
        if x.held_since is None:
            self.take(1)
            x.ready_at = self.t + pool.provision_s
            x.held_since = x.ready_at if pool.held_from_ready else self.t
            job.charged += pool.provision_s
            self.push(x.ready_at, PoolEventKind.INSTANCE_READY, i)
        if not x.holds(j, job.version):
            if j not in x.resident and len(x.resident) >= pool.max_resident:
                victim = next(k for k in x.resident if not x.seqs.get(k))
                del x.resident[victim]
                x.swap_due.discard(victim)
            self.loads += 1
            x.resident[j] = (self.loads, job.version)
            if pool.swap:
                x.swap_due.add(j)
        x.resident[j] = x.resident.pop(j)  # most recently used last
        hit = tuple(job.kv[s]) == (i, x.resident[j][0])
        job.prefill[s] = job.delta[s] if hit else job.context[s]
        x.seqs.setdefault(j, set()).add(s)
        x.n += 1
        if pool.turn_sync:
            job.turn_inst = i
        if self.trace:
            self.res.served.append((job.p.name, job.iteration, s, int(job.turn[s]), i))
        if x.current is None:
            self.kick.add(i)

    def request(self, j: int, s: int) -> None:
        """Job ``j``'s sequence ``s`` asks for its next turn: routed now, or queued behind the job's queue."""
        i = self.route(j, s) if not self.queues[j] else None
        if i is None:
            self.queues[j].append(s)
            self.queued_at[j].append(self.t)
        else:
            self.assign(j, s, i)

    def dispatch(self) -> None:
        """Serve queued requests, most urgent job first, while the router finds them an instance."""
        waiting = sorted(
            (j for j in range(len(self.jobs)) if self.queues[j]),
            key=lambda j: self.urgency(j, self.queued_at[j][0]),
        )
        for j in waiting:
            while self.queues[j]:
                i = self.route(j, self.queues[j][0])
                if i is None:
                    break
                self.queued_at[j].pop(0)
                self.assign(j, self.queues[j].pop(0), i)

    def start_chunk(self, i: int) -> None:
        """Instance ``i``'s next chunk: the next resident job in turn prefills its new tokens and decodes."""
        x, hw, t = self.inst[i], self.hw, self.t
        if t < x.ready_at:
            return  # still starting; the ready event kicks it
        busy = [k for k in sorted(x.seqs) if x.seqs[k]]
        if not busy:
            x.current = None
            if self.elastic and x.held_since is not None:
                x.idle_token += 1
                self.push(t + self.pool.shape.keep_alive_s, PoolEventKind.INSTANCE_IDLE, i, x.idle_token)
            return
        j = busy[x.rr % len(busy)]
        x.rr += 1
        job = self.jobs[j]
        ids = np.fromiter(x.seqs[j], dtype=np.int64)
        pre = float(job.prefill[ids].sum())
        job.prefill[ids] = 0.0
        step = min(hw.chunk, max(1, int(np.ceil(job.remaining[ids].min()))))
        swap = self.roll_swap if j in x.swap_due else 0.0
        x.swap_due.discard(j)
        dt = (
            swap
            + 2 * job.p.params / (hw.peak_flops * hw.prefill_mfu) * pre
            + step * (hw.decode_step_s + hw.decode_s_per_seq * len(ids))
        )
        job.charged += dt
        job.swapped += swap
        x.current = (j, ids, step)
        if self.trace:
            resident = tuple(self.jobs[k].p.name for k in x.resident)
            self.res.chunks.append((i, job.p.name, t, t + dt, len(ids), x.n, resident))
        self.push(t + dt, PoolEventKind.CHUNK_END, i)

    def start_rollout(self, j: int) -> None:
        """Job ``j``'s next iteration: every sequence requests its first turn."""
        self.jobs[j].start_iteration()
        for s in range(self.jobs[j].p.batch):
            self.request(j, s)

    # ------------------------------------------------------------------ trainer service

    def start_trains(self) -> None:
        """Start the train step of every waiting job (most urgent first) that has a free gang at home."""
        t, hw, pool, gpus = self.t, self.hw, self.pool, self.gpus
        for j in sorted(self.train_queue, key=lambda j: self.urgency(j, 0.0)):
            job = self.jobs[j]
            free = [g for g in job.gangs if self.gangs[g].free]
            if not free:
                continue
            # a held gang first, then one holding this job's training state
            g = min(free, key=lambda g: (self.gangs[g].held_since is None, self.gangs[g].last != j, g))
            gang = self.gangs[g]
            self.train_queue.remove(j)
            start = 0.0
            if gang.held_since is None:
                self.take(gpus)
                start = pool.provision_s
                gang.held_since = t + start if pool.held_from_ready else t
            gang.token += 1
            swap = 2 * 16 * job.p.params / gpus / hw.pcie_bytes_per_s if pool.swap and gang.last != j else 0.0
            dt = start + swap + 10 * job.p.params * job.tokens / (gpus * hw.peak_flops * hw.train_mfu)
            gang.free, gang.last = False, j
            job.charged += gpus * dt
            job.swapped += gpus * swap
            self.push(t + dt, PoolEventKind.TRAIN_END, g, j)

    # ------------------------------------------------------------------ event handlers

    def on_chunk_end(self, i: int, _: int) -> None:
        x = self.inst[i]
        assert x.current is not None
        j, ids, step = x.current
        x.current = None
        job = self.jobs[j]
        job.remaining[ids] -= step
        job.context[ids] += step
        job.tokens += step * len(ids)
        for s in ids[job.remaining[ids] <= 0].tolist():
            x.seqs[j].discard(s)
            x.n -= 1
            self.turn_done(j, s, i)
        if any(self.queues):
            self.dispatch()
        self.kick.add(i)

    def turn_done(self, j: int, s: int, i: int) -> None:
        """Job ``j``'s sequence ``s`` finished a turn on instance ``i``: its tool call, then the next turn
        (at once, or with the batch in turn-synchronous pools), or its end; the batch's end starts the reward."""
        job = self.jobs[j]
        turn = job.turn[s]
        if turn + 1 < job.n_turns[s]:  # a tool call, then the next turn
            job.turn[s] += 1
            job.remaining[s] = job.turn_len[s, turn + 1]
            job.delta[s] = job.tool_tokens[s, turn]
            job.context[s] += job.delta[s]
            job.kv[s] = (i, self.inst[i].resident[j][0])
            if self.pool.turn_sync:
                job.going_on.append(s)
                job.stall_s = max(job.stall_s, float(job.tool_s[s, turn]))
            else:
                self.push(self.t + float(job.tool_s[s, turn]), PoolEventKind.TURN_REQUEST, j, s)
        else:
            job.done += 1
            if job.done == job.p.batch:
                self.push(self.t + job.reward_s, PoolEventKind.ROLLOUT_DONE, j)
        job.in_turn -= 1
        if self.pool.turn_sync and job.in_turn == 0 and job.going_on:
            self.push(self.t + job.stall_s, PoolEventKind.BATCH_TURN, j)

    def on_turn_request(self, j: int, s: int) -> None:
        self.request(j, s)

    def on_batch_turn(self, j: int, _: int) -> None:
        job = self.jobs[j]
        going_on, job.going_on, job.stall_s, job.turn_inst = sorted(job.going_on), [], 0.0, -1
        job.in_turn = len(going_on)
        for s in going_on:
            self.request(j, s)

    def on_rollout_done(self, j: int, _: int) -> None:
        self.train_queue.append(j)
        self.start_trains()

    def on_train_end(self, g: int, j: int) -> None:
        gang = self.gangs[g]
        gang.free = True
        if self.elastic:
            gang.token += 1
            self.push(self.t + self.pool.shape.keep_alive_s, PoolEventKind.GANG_IDLE, g, gang.token)
        job = self.jobs[j]
        job.iteration += 1
        job.version += 1  # new weights: every loaded copy of the old ones is stale
        if job.iteration == job.p.iterations:
            job.end = self.t
            if self.elastic and self.pool.release_on_finish:
                self.release_finished(j)
        else:
            self.start_rollout(j)
        self.start_trains()

    def release_finished(self, j: int) -> None:
        """Job ``j`` ended: hand back at once the idle GPUs of its homes that no unfinished job shares."""
        others = [k for k in self.jobs if k.end < 0]
        for i in set(self.jobs[j].homes) - {i for k in others for i in k.homes}:
            x = self.inst[i]
            if x.held_since is not None and x.current is None and x.n == 0:
                x.idle_token += 1
                self.on_instance_idle(i, x.idle_token)
        for g in set(self.jobs[j].gangs) - {g for k in others for g in k.gangs}:
            gang = self.gangs[g]
            if gang.free:
                gang.token += 1
                self.on_gang_idle(g, gang.token)

    def on_arrival(self, j: int, _: int) -> None:
        self.start_rollout(j)

    def on_instance_ready(self, i: int, _: int) -> None:
        self.kick.add(i)

    def on_instance_idle(self, i: int, token: int) -> None:
        x = self.inst[i]
        if token == x.idle_token and x.current is None and x.n == 0 and x.held_since is not None:
            self.give("rollout", i, x.held_since, self.t)
            x.held_since = None
            x.resident.clear()
            x.swap_due.clear()

    def on_gang_idle(self, g: int, token: int) -> None:
        gang = self.gangs[g]
        if token == gang.token and gang.free and gang.held_since is not None:
            self.give("trainer", g, gang.held_since, self.t)
            gang.held_since, gang.last = None, -1

    # ------------------------------------------------------------------ the loop

    def run(self) -> ServiceResult:
        """Handle events in time order until none is left; the result of :func:`simulate_services`."""
        handlers = {
            PoolEventKind.CHUNK_END: self.on_chunk_end,
            PoolEventKind.TURN_REQUEST: self.on_turn_request,
            PoolEventKind.ROLLOUT_DONE: self.on_rollout_done,
            PoolEventKind.TRAIN_END: self.on_train_end,
            PoolEventKind.ARRIVAL: self.on_arrival,
            PoolEventKind.INSTANCE_READY: self.on_instance_ready,
            PoolEventKind.INSTANCE_IDLE: self.on_instance_idle,
            PoolEventKind.GANG_IDLE: self.on_gang_idle,
            PoolEventKind.BATCH_TURN: self.on_batch_turn,
        }
        for j in range(len(self.jobs)):
            self.push(self.arrive[j], PoolEventKind.ARRIVAL, j)
        while True:
            for i in sorted(self.kick):
                if self.inst[i].current is None:
                    self.start_chunk(i)
            self.kick.clear()
            if not self.events:
                break
            self.t, _, kind, a, b = heapq.heappop(self.events)
            handlers[kind](a, b)
        return self.result()

    def result(self) -> ServiceResult:
        """Totals of the finished run."""
        jobs, res = self.jobs, self.res
        if any(j.end < 0 for j in jobs) or (self.elastic and self.held_now):
            raise RuntimeError(
                "service simulation stalled with unfinished jobs or held GPUs (a bug in the event loop)."
            )
        res.makespan_s = max(j.end for j in jobs) - min(self.arrive)
        static_gpus = self.pool.shape.rollout_gpus + self.pool.shape.trainer_gpus
        res.reserved_gpu_s = self.held_gpu_s if self.elastic else static_gpus * res.makespan_s
        res.peak_gpus = self.peak
        res.busy_gpu_s = sum(j.charged for j in jobs)
        res.jobs = {
            j.p.name: {
                "jct_s": j.end - self.arrive[j.index],
                "charged_gpu_s": j.charged,
                "swap_gpu_s": j.swapped,
            }
            for j in jobs
        }
        return res


def simulate_services(
    profiles: list[JobProfile],
    hw: Hardware,
    pool: ServicePool,
    seed: int,
    *,
    arrivals: Sequence[float] | None = None,
    pace: Mapping[str, float] | None = None,
    demand: Mapping[str, tuple[float, float]] | None = None,
    trace: bool = False,
) -> ServiceResult:
    """Request-level multiplexing: every job's generation requests and train steps run on shared services.

    - Rollout requests: each turn of each sequence is one request. The router sends it to an
      instance on one of the job's home nodes (its weights are in their host memory), in order of
      preference: the instance still holding the sequence's KV cache (then only the new tool
      tokens are prefilled, else the whole context is); an instance with the job's weights loaded
      and fewer than ``ceil(batch / gpus)`` sequences (the job's dedicated per-GPU batch), least
      loaded first; an idle instance (one with the job's current weights first); any instance with
      room (under ``capacity``, a free weight slot) least loaded first; else the request waits in
      the job's FIFO queue, served when an instance frees up (jobs in order of their oldest wait).
    - A rollout instance runs *chunks* of continuous batching, taking turns among its resident
      jobs: a chunk prefills the sequences that arrived and decodes ``min(chunk, shortest
      remaining)`` steps, ``decode_step_s + decode_s_per_seq * sequences`` each (same costs as
      :func:`infra.llm.sim.phased.simulate_group`). Loading a job's weights onto an instance (first
      use, after another job evicted them, or after a train step updated them) costs
      ``2 * params / pcie`` before its next chunk and evicts the least recently used resident job
      with no sequences there.
    - Reward: the CPU verifier, as in ``simulate_group``. Train: FIFO over trainer gangs of
      ``gpus`` GPUs on the job's home trainer nodes; a gang that last trained another job swaps
      the state in and out first (``2 * 16 * params / gpus / pcie``, as a train slice of
      ``simulate_group``); the train time is the same as a dedicated job's.
    - Charging: a job is charged the GPU-time of its chunks and train steps, swaps included.
    - Arrivals: job ``k`` starts at ``arrivals[k]`` (default: all at 0); its JCT counts from there,
      and a static pool is reserved from the first arrival to the last end.
    - Elastic pools (``pool.shape.keep_alive_s`` set): every GPU starts handed back. The router prefers a
      held idle instance to taking a new GPU, and a train step a held free gang; taking one costs
      ``provision_s`` before its first function, and a GPU idle for ``keep_alive_s`` is handed back,
      losing its weights, KV caches and training state. Reserved time is the time GPUs were held.
    - Priority: by default, queued requests are served in order of their oldest wait and train
      steps first-come first-served. With ``pace`` (each job's estimated seconds per iteration
      when alone, e.g. from :func:`infra.llm.sim.sizing.estimate_pace` on other draws), both go
      earliest deadline first, a job's deadline being its arrival + (iterations done + 1) x pace:
      the job furthest behind its dedicated schedule is served first.
    - Options that model the running pool (:class:`ServicePool`): ``turn_sync`` (a batch's next turn
      waits for its slowest sequence and tool call), ``homes=HomeRule.DEMAND`` with ``demand`` (each
      job's expected share of time generating and training alone: homes by least demand),
      ``trainer_home_nodes``, ``release_on_finish`` and ``held_from_ready`` (see their docs).
    """
    gpus = profiles[0].gpus
    if any(p.gpus != gpus for p in profiles):
        raise ValueError(
            "jobs sharing trainer gangs must ask for the same number of GPUs; run groups of equal size."
        )
    pool.validate()
    trainer = pool.shape.trainer_gpus
    if trainer < gpus or trainer % gpus or pool.node_gpus % gpus:
        raise ValueError(f"pool shape.trainer_gpus={trainer} and node_gpus={pool.node_gpus} must each be a multiple of "
                         f"the jobs' {gpus} GPUs; round them to a multiple of {gpus}.")
    if len({p.name for p in profiles}) != len(profiles):
        raise ValueError("job names must be unique.")
    arrive = [0.0] * len(profiles) if arrivals is None else [float(a) for a in arrivals]
    if len(arrive) != len(profiles) or min(arrive) < 0:
        raise ValueError(f"arrivals {arrivals}: give one start time >= 0 per job ({len(profiles)} jobs).")
    if pool.homes is HomeRule.DEMAND and (demand is None or any(p.name not in demand for p in profiles)):
        raise ValueError("ServicePool(homes=HomeRule.DEMAND) needs demand={job name: (generate share, train share)} "
                         "for every job.")
    return ServiceSim(profiles, hw, pool, seed, arrive, pace, trace, demand).run()

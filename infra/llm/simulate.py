"""Discrete-event simulation of RLVR jobs: dedicated placement vs phase-sliced GPU groups vs
request-level shared services, and of request routing across rollout instances.

Workload (all distributions stated here and in docs/llm_jobs.md; times in seconds):

- A job runs ``iterations`` synchronous RLVR iterations: rollout (GPU), reward (CPU), train (GPU).
- Rollout: ``batch`` sequences with ``LogNormal(prompt_median, prompt_sigma)`` prompt tokens; each has ``1 + Geometric`` turns (mean ``turns_mean``; 1 for
  single-turn jobs); each turn decodes ``LogNormal(median=out_median, sigma=out_sigma)`` tokens
  (capped at ``out_cap``); between turns the sequence waits on a tool call for
  ``LogNormal(median=tool_median_s, sigma=tool_sigma)`` seconds (capped at ``tool_cap_s``) and
  then prefills the tool's ``LogNormal(median=tool_tokens_median, sigma=0.5)`` output tokens.
- Rollout cost model (continuous batching, simulated in chunks of ``chunk`` tokens): a decode
  step takes ``decode_step_s + decode_s_per_seq * active`` (memory-bound: it reads the weights
  once per step); prefill costs ``2 * params / (gpus * peak_flops * prefill_mfu)`` per token.
- Reward: ``LogNormal(median=reward_median_s, sigma=0.5)`` on CPU (verifier or sandbox tests).
- Train: ``10 * params * generated_tokens / (gpus * peak_flops * train_mfu)`` (forward+backward, and the
  old-policy and reference log-probs).

Placement:

- *dedicated*: every job holds its own ``gpus`` GPUs from start to end; rollout and trainer are
  colocated and stay resident (no swap cost is charged to dedicated jobs).
- *multiplexed*: jobs are admitted to GPU groups of the same size; a group runs one job's slice
  at a time (a rollout slice lasts while that job has a sequence not waiting on a tool; a train
  slice is one update), granted first-come first-served. Switching the group to another job
  costs a host-to-device copy of the incoming job's state over PCIe (weights for a rollout
  slice; weights, gradients and Adam state in and out for a train slice), and the KV cache of a
  job whose slice was taken by another job is gone: its sequences re-prefill their whole context.
  A job joins a group only if a *profile* simulation of that group (different random draws from
  the same distributions, what the scheduler can know before running) predicts no member slowed
  by more than ``max_slowdown``.

- *request-level* (:func:`simulate_services`, PlexRL/RollMux-style services): the jobs share a
  rollout service of single-GPU instances behind a router and a trainer service of GPU gangs;
  each generation request (one turn of one sequence) and each train step is scheduled on its own,
  on instances of the nodes holding the job's weights, swapping weights in from host memory when
  an instance switches job. :func:`size_service_pool` finds the smallest pool that keeps every
  job within a slowdown bound of its dedicated JCT.

Billing: user GPU-hours = GPUs held x time held (dedicated: until the job ends; a group or a
service pool: until its last job ends); for services also the GPU-time charged (what the jobs'
functions occupied, swaps included).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from infra.llm.router import EngineCost, InstanceLoad, Router


@dataclass(frozen=True)
class JobProfile:
    """Distributions and size of one RLVR job (see the module docstring)."""

    name: str
    kind: str
    params: float = 7e9
    gpus: int = 4
    iterations: int = 10
    batch: int = 256
    prompt_median: float = 400.0
    prompt_sigma: float = 0.5
    turns_mean: float = 1.0
    out_median: float = 1000.0
    out_sigma: float = 0.8
    out_cap: int = 16384
    tool_median_s: float = 0.0
    tool_sigma: float = 1.0
    tool_cap_s: float = 120.0
    tool_tokens_median: float = 300.0
    reward_median_s: float = 20.0


@dataclass(frozen=True)
class Hardware:
    """Cost model of one GPU (H100-class defaults) and its host link."""

    peak_flops: float = 989e12
    train_mfu: float = 0.35
    prefill_mfu: float = 0.5
    decode_step_s: float = 0.012
    decode_s_per_seq: float = 0.00004
    pcie_bytes_per_s: float = 25e9
    chunk: int = 64


def mixed_workload(n_jobs: int = 8, iterations: int = 8) -> list[JobProfile]:
    """Half single-turn math jobs (long-tailed answers), half multi-turn tool-using agent jobs."""
    jobs = []
    for i in range(n_jobs):
        if i % 2 == 0:
            jobs.append(
                JobProfile(
                    f"math{i}",
                    "math",
                    iterations=iterations,
                    batch=512,
                    prompt_median=300,
                    out_median=1200,
                    out_sigma=0.9,
                    reward_median_s=30.0,
                )
            )
        else:
            jobs.append(
                JobProfile(
                    f"agent{i}",
                    "agent",
                    iterations=iterations,
                    batch=256,
                    prompt_median=800,
                    turns_mean=4.0,
                    out_median=250,
                    out_sigma=0.8,
                    out_cap=4096,
                    tool_median_s=6.0,
                    tool_sigma=1.0,
                    reward_median_s=60.0,
                )
            )
    return jobs


@dataclass
class _Part:
    """One rollout instance's share of a job's batch (arrays over its sequences)."""

    remaining: np.ndarray  # tokens left in the current turn
    turns_left: np.ndarray  # tool calls still to come
    ready_at: np.ndarray  # time the sequence may decode again (its tool call returned)
    prefill: np.ndarray  # tokens to prefill before decoding resumes
    context: np.ndarray  # tokens in the sequence so far
    done: np.ndarray
    rng: np.random.Generator
    kv_valid: bool = True
    tokens: float = 0.0

    def next_ready(self) -> float:
        return float(self.ready_at[~self.done].min()) if not self.done.all() else np.inf


@dataclass
class _Job:
    p: JobProfile
    seed: int
    instances: int
    rng: np.random.Generator = field(init=False)
    iteration: int = 0
    phase: str = "rollout"
    ready_at: float = 0.0
    parts: list[_Part] = field(default_factory=list)
    rollout_end: float = 0.0
    end: float = -1.0
    gpu_busy_s: float = 0.0

    def start_rollout(self, t: float) -> None:
        """New batch, split evenly over the job's rollout instances (data parallel).

        Draws come from streams keyed by (seed, job, iteration, instance), so a job sees the same
        workload whether it runs alone or shared (common random numbers).
        """
        key = [self.seed, sum(ord(c) * 31**k for k, c in enumerate(self.p.name)) % 2**31, self.iteration]
        self.rng = np.random.default_rng(key)
        p, n = self.p, self.p.batch
        extra = (
            self.rng.geometric(1.0 / p.turns_mean, n) - 1 if p.turns_mean > 1 else np.zeros(n, dtype=np.int64)
        )
        prompt = np.maximum(1, _lognormal(self.rng, p.prompt_median, p.prompt_sigma, n))
        remaining = _turn_len(p, self.rng, n)
        self.parts = []
        for i in range(self.instances):
            sl = slice(i, None, self.instances)
            m = len(prompt[sl])
            self.parts.append(
                _Part(
                    remaining[sl].copy(),
                    extra[sl].copy(),
                    np.full(m, t),
                    prompt[sl].copy(),
                    prompt[sl].copy(),
                    np.zeros(m, dtype=bool),
                    np.random.default_rng([*key, i]),
                )
            )
        self.phase, self.rollout_end = "rollout", t

    def tokens(self) -> float:
        return sum(part.tokens for part in self.parts)


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int | None = None) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(size))


def _turn_len(p: JobProfile, rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(_lognormal(rng, p.out_median, p.out_sigma, n), 1, p.out_cap)


def _run_part(job: _Job, part: _Part, t: float, hw: Hardware) -> float:
    """Decode one instance's share from ``t`` while some sequence is not waiting on a tool; returns the slice end."""
    p = job.p
    prefill_per_tok = 2 * p.params * job.instances / (p.gpus * hw.peak_flops * hw.prefill_mfu)
    if not part.kv_valid:  # another job's slice evicted the KV cache: sequences re-prefill their context
        part.prefill = np.where(part.done, 0.0, np.maximum(part.prefill, part.context))
        part.kv_valid = True
    while True:
        active = (~part.done) & (part.ready_at <= t)
        n = int(active.sum())
        if n == 0:
            return t
        pre = float(part.prefill[active].sum())
        part.prefill[active] = 0.0
        step = min(hw.chunk, max(1, int(np.ceil(part.remaining[active].min()))))
        dt = prefill_per_tok * pre + step * (hw.decode_step_s + hw.decode_s_per_seq * n)
        t += dt
        job.gpu_busy_s += dt
        part.remaining[active] -= step
        part.context[active] += step
        part.tokens += step * n
        ended = active & (part.remaining <= 0)
        if ended.any():
            tool = ended & (part.turns_left > 0)
            part.done |= ended & ~tool
            k = int(tool.sum())
            if k:
                part.ready_at[tool] = t + np.minimum(
                    _lognormal(part.rng, p.tool_median_s, p.tool_sigma, k), p.tool_cap_s
                )
                part.turns_left[tool] -= 1
                part.remaining[tool] = _turn_len(p, part.rng, k)
                toks = np.maximum(1, _lognormal(part.rng, p.tool_tokens_median, 0.5, k))
                part.prefill[tool] = toks
                part.context[tool] += toks
        if part.done.all():
            return t


def simulate_group(
    profiles: list[JobProfile], hw: Hardware, seed: int, tp: int = 1
) -> dict[str, dict[str, float]]:
    """Run ``profiles`` sharing one GPU group (a single profile = dedicated placement).

    The group's GPUs form ``gpus / tp`` rollout instances; each instance runs one job's rollout
    slice at a time (that job's share of its batch on this instance); a train slice takes all GPUs.
    A job waiting to train has priority: no new rollout slice starts until it has the whole group.

    Returns per job ``jct_s`` and ``gpu_busy_s``; and ``_group``: ``makespan_s``, ``busy_gpu_s``
    (GPU-seconds spent executing anything, swaps included), ``swap_gpu_s``.
    """
    gpus = profiles[0].gpus
    if any(p.gpus != gpus for p in profiles):
        raise ValueError("jobs sharing a group must ask for the same number of GPUs.")
    n_inst = gpus // tp
    jobs = [_Job(p, seed, n_inst) for p in profiles]
    for j in jobs:
        j.start_rollout(0.0)
    shared = len(jobs) > 1
    free_at = [0.0] * n_inst
    on_device: list[tuple[str, str] | None] = [None] * n_inst
    busy = swaps = 0.0
    t = 0.0

    def swap_in(i: int, job: _Job, phase: str, t0: float) -> float:
        nonlocal swaps
        if not shared or on_device[i] == (job.p.name, phase):
            return 0.0
        per_gpu = job.p.params / job.p.gpus
        s = (2 * per_gpu * tp if phase == "rollout" else 2 * 16 * per_gpu) / hw.pcie_bytes_per_s
        prev = on_device[i]
        if prev is not None and prev[0] != job.p.name:
            for other in jobs:
                if other.p.name == prev[0] and other.phase == "rollout":
                    other.parts[i].kv_valid = False
        on_device[i] = (job.p.name, phase)
        swaps += s * tp
        return s

    while any(j.phase != "done" for j in jobs):
        for j in jobs:  # the CPU verifier finished: the job now waits to train
            if j.phase == "reward" and j.ready_at <= t:
                j.phase = "train"
        trainers = sorted((j for j in jobs if j.phase == "train"), key=lambda j: (j.ready_at, j.p.name))
        if trainers:
            if max(free_at) <= t:
                job = trainers[0]
                start = t + max(swap_in(i, job, "train", t) for i in range(n_inst))
                end = start + 10 * job.p.params * job.tokens() / (gpus * hw.peak_flops * hw.train_mfu)
                job.gpu_busy_s += end - start
                busy += gpus * (end - t)
                free_at = [end] * n_inst
                job.iteration += 1
                if job.iteration == job.p.iterations:
                    job.phase, job.end = "done", end
                else:
                    job.start_rollout(end)
        else:
            for i in range(n_inst):
                if free_at[i] > t:
                    continue
                ready = [j for j in jobs if j.phase == "rollout" and j.parts[i].next_ready() <= t]
                if not ready:
                    continue
                job = min(ready, key=lambda j: (j.parts[i].next_ready(), j.p.name))
                start = t + swap_in(i, job, "rollout", t)
                end = _run_part(job, job.parts[i], start, hw)
                busy += tp * (end - t)
                free_at[i] = end
                job.rollout_end = max(job.rollout_end, end)
                if all(part.done.all() for part in job.parts):
                    job.phase = "reward"
                    job.ready_at = job.rollout_end + float(_lognormal(job.rng, job.p.reward_median_s, 0.5))
        # advance to the next event
        candidates = [f for f in free_at if f > t]
        for j in jobs:
            if j.phase == "reward":
                candidates.append(j.ready_at)
            elif j.phase == "rollout":
                candidates += [part.next_ready() for i, part in enumerate(j.parts) if part.next_ready() > t]
        pending = [c for c in candidates if c > t and np.isfinite(c)]
        if not pending:
            if (
                any(j.phase not in ("done",) for j in jobs)
                and not any(j.phase == "train" for j in jobs)
                and all(f <= t for f in free_at)
            ):
                raise RuntimeError("simulation stalled: no job can progress (a bug in the event loop).")
            if not any(j.phase != "done" for j in jobs):
                break
            t = max(free_at) if max(free_at) > t else t
            continue
        t = min(pending)
    out = {j.p.name: {"jct_s": j.end, "gpu_busy_s": j.gpu_busy_s} for j in jobs}
    makespan = max(j.end for j in jobs)
    out["_group"] = {"makespan_s": makespan, "busy_gpu_s": busy, "swap_gpu_s": swaps}
    return out


@dataclass
class PlacementResult:
    """Outcome of one placement of a workload."""

    groups: list[list[str]]
    jobs: dict[str, dict[str, float]] = field(default_factory=dict)
    gpu_hours: float = 0.0
    gpus_used: int = 0
    utilisation: float = 0.0


def _evaluate(groups: list[list[JobProfile]], hw: Hardware, seed: int) -> PlacementResult:
    res = PlacementResult([[p.name for p in g] for g in groups])
    busy_gpu_s = held_gpu_s = 0.0
    for g in groups:
        out = simulate_group(g, hw, seed)
        grp = out.pop("_group")
        res.jobs.update(out)
        gpus = g[0].gpus
        held_gpu_s += gpus * grp["makespan_s"]
        busy_gpu_s += grp["busy_gpu_s"]
        res.gpus_used += gpus
    res.gpu_hours = held_gpu_s / 3600
    res.utilisation = busy_gpu_s / held_gpu_s
    return res


def plan_groups(
    profiles: list[JobProfile], hw: Hardware, *, max_slowdown: float, max_gpus: int, seed: int
) -> list[list[JobProfile]]:
    """Greedy admission: each job (longest GPU demand first) joins the first group whose profile
    simulation keeps every member within ``max_slowdown`` of its dedicated JCT, else opens a group.

    Raises ``ValueError`` when the jobs need more than ``max_gpus`` GPUs even when shared.
    """
    alone = {p.name: simulate_group([p], hw, seed)[p.name] for p in profiles}
    order = sorted(profiles, key=lambda p: -alone[p.name]["gpu_busy_s"])
    groups: list[list[JobProfile]] = []
    for p in order:
        for g in groups:
            if g[0].gpus != p.gpus:
                continue
            trial = simulate_group([*g, p], hw, seed)
            if all(trial[q.name]["jct_s"] <= max_slowdown * alone[q.name]["jct_s"] for q in [*g, p]):
                g.append(p)
                break
        else:
            groups.append([p])
    need = sum(g[0].gpus for g in groups)
    if need > max_gpus:
        raise ValueError(
            f"the workload needs {need} GPUs even when multiplexed, more than the cluster's {max_gpus}."
        )
    return groups


def dedicated_placement(
    profiles: list[JobProfile], hw: Hardware, *, cluster_gpus: int, seed: int = 0
) -> PlacementResult:
    """Every job on its own GPUs (evaluated on ``seed``)."""
    need = sum(p.gpus for p in profiles)
    if need > cluster_gpus:
        raise ValueError(
            f"dedicated placement needs {need} GPUs but the cluster has {cluster_gpus}; add GPUs or run fewer jobs."
        )
    return _evaluate([[p] for p in profiles], hw, seed)


def multiplexed_placement(
    profiles: list[JobProfile],
    hw: Hardware,
    dedicated: PlacementResult,
    *,
    cluster_gpus: int,
    max_slowdown: float,
    seed: int = 0,
    profile_seed: int = 1,
    profile_iterations: int = 3,
) -> PlacementResult:
    """Jobs packed into shared GPU groups by :func:`plan_groups` (planned on a short profile run with
    ``profile_seed``, evaluated on ``seed``); each job's ``slowdown`` is its JCT over its dedicated JCT."""
    profile = [replace(p, iterations=min(p.iterations, profile_iterations)) for p in profiles]
    plan = plan_groups(profile, hw, max_slowdown=max_slowdown, max_gpus=cluster_gpus, seed=profile_seed)
    by_name = {p.name: p for p in profiles}
    mux = _evaluate([[by_name[p.name] for p in g] for g in plan], hw, seed)
    for name, r in mux.jobs.items():
        r["slowdown"] = r["jct_s"] / dedicated.jobs[name]["jct_s"]
    return mux


# ------------------------------------------------------------------------------------- routing


@dataclass(frozen=True)
class RouterWorkload:
    """Requests to a pool of rollout instances (Poisson arrivals)."""

    requests: int = 4000
    rate_per_s: float = 40.0
    short_prompt_median: float = 300.0
    long_prompt_median: float = 6000.0
    long_fraction: float = 0.15
    """Share of requests with a long prompt (multi-turn agent contexts)."""
    out_median: float = 400.0
    out_sigma: float = 1.0
    out_cap: int = 8192


def simulate_routing(
    router: Router, instances: int, wl: RouterWorkload, cost: EngineCost, seed: int
) -> dict[str, float]:
    """Route ``wl`` over ``instances`` engines with continuous batching and chunked prefill (see
    :mod:`infra.llm.router`); returns TTFT percentiles and mean end-to-end latency."""
    rng = np.random.default_rng(seed)
    n = wl.requests
    arrivals = np.cumsum(rng.exponential(1.0 / wl.rate_per_s, n))
    long = rng.random(n) < wl.long_fraction
    prompt = np.where(long, wl.long_prompt_median, wl.short_prompt_median) * np.exp(
        0.5 * rng.standard_normal(n)
    )
    prompt = np.maximum(1, prompt).astype(np.int64)
    out = np.clip(wl.out_median * np.exp(wl.out_sigma * rng.standard_normal(n)), 1, wl.out_cap).astype(
        np.int64
    )
    queue: list[list[list[int]]] = [[] for _ in range(instances)]  # [request, prompt tokens left]
    running: list[dict[int, int]] = [{} for _ in range(instances)]  # request -> tokens left
    step_end = [np.inf] * instances
    step_plan: list[tuple[list[tuple[int, int]], list[int]]] = [([], [])] * instances
    ttft = np.zeros(n)
    finish = np.zeros(n)
    events: list[tuple[float, int, int]] = [(float(arrivals[i]), 0, i) for i in range(n)]  # (time, kind, id)
    heapq.heapify(events)

    def start_step(k: int, t: float) -> None:
        budget, plan = cost.chunk_tokens, []
        for item in queue[k]:
            if budget == 0:
                break
            take = min(budget, item[1])
            plan.append((item[0], take))
            budget -= take
        decoding = list(running[k])
        if not plan and not decoding:
            step_end[k] = np.inf
            return
        step_plan[k] = (plan, decoding)
        step_end[k] = t + cost.step_time(cost.chunk_tokens - budget, len(decoding))
        heapq.heappush(events, (step_end[k], 1, k))

    def load(k: int) -> InstanceLoad:
        return InstanceLoad(
            len(queue[k]) + len(running[k]), int(sum(q[1] for q in queue[k])), len(running[k])
        )

    while events:
        t, kind, i = heapq.heappop(events)
        if kind == 0:
            k = router.choose(int(prompt[i]), [load(j) for j in range(instances)])
            queue[k].append([i, int(prompt[i])])
            if step_end[k] == np.inf:
                start_step(k, t)
            continue
        k = i
        plan, decoding = step_plan[k]
        for r in decoding:
            running[k][r] -= 1
            if running[k][r] == 0:
                del running[k][r]
                finish[r] = t
        for r, take in plan:
            item = next(q for q in queue[k] if q[0] == r)
            item[1] -= take
            if item[1] == 0:
                queue[k].remove(item)
                ttft[r] = t - arrivals[r]  # the prefill step emits the first token
                if out[r] > 1:
                    running[k][r] = int(out[r]) - 1
                else:
                    finish[r] = t
        start_step(k, t)
    return {
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "ttft_mean_s": float(ttft.mean()),
        "e2e_mean_s": float((finish - arrivals).mean()),
    }


# ------------------------------------------------------------- request-level service multiplexing


@dataclass(frozen=True)
class ServicePool:
    """Shared LLM services for request-level multiplexing (see :func:`simulate_services`).

    The rollout service is ``rollout_gpus`` single-GPU instances on nodes of ``node_gpus``; the
    trainer service is ``trainer_gpus`` GPUs cut into gangs of the jobs' ``gpus``.
    """

    rollout_gpus: int
    trainer_gpus: int
    node_gpus: int = 8
    home_nodes: int = 2
    """Nodes of each service whose host memory holds a job's state; its functions run only there."""
    capacity: int = 256
    """Concurrent sequences per rollout instance (KV-cache memory of a 7B GQA model on 80 GB)."""
    max_resident: int = 1
    """Jobs' weights on one rollout GPU at once (more than 1: their decode steps take turns)."""
    swap: bool = True
    """Charge host-to-device swaps; False models dedicated GPUs whose state stays resident."""
    keep_alive_s: float | None = None
    """None: a static pool, every GPU held from the first arrival to the last job's end. A number:
    an *elastic* pool whose sizes are caps: a GPU is taken from the cluster when a function needs it
    and handed back once it has been idle for ``keep_alive_s`` (losing its weights and KV caches)."""
    provision_s: float = 2.0
    """Elastic pools: seconds from taking a GPU to its first function (engine start); the job's weights
    are then copied in from host memory like any swap. Charged to the job that needed the GPU."""


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
class _SJob:
    p: JobProfile
    index: int
    seed: int
    homes: list[int]
    gangs: list[int]
    target: int
    iteration: int = 0
    version: int = 0
    end: float = -1.0
    charged: float = 0.0
    swapped: float = 0.0
    tokens: float = 0.0
    done: int = 0

    def start_iteration(self) -> float:
        """Draw the iteration's batch (streams keyed like :meth:`_Job.start_rollout`); returns its reward time."""
        p, n = self.p, self.p.batch
        key = [self.seed, sum(ord(c) * 31**k for k, c in enumerate(p.name)) % 2**31, self.iteration]
        rng = np.random.default_rng(key)
        extra = rng.geometric(1.0 / p.turns_mean, n) - 1 if p.turns_mean > 1 else np.zeros(n, dtype=np.int64)
        prompt = np.maximum(1, _lognormal(rng, p.prompt_median, p.prompt_sigma, n))
        first = _turn_len(p, rng, n)
        reward_s = float(_lognormal(rng, p.reward_median_s, 0.5))
        turns_rng = np.random.default_rng([*key, 1000])
        width = max(1, int(extra.max()))
        self.turn_len = np.column_stack([first, _turn_len(p, turns_rng, n * width).reshape(n, width)])
        self.tool_s = np.minimum(
            _lognormal(turns_rng, p.tool_median_s, p.tool_sigma, n * width), p.tool_cap_s
        ).reshape(n, width)
        self.tool_tokens = np.maximum(1, _lognormal(turns_rng, p.tool_tokens_median, 0.5, n * width)).reshape(
            n, width
        )
        self.n_turns = extra + 1
        self.turn = np.zeros(n, dtype=np.int64)
        self.remaining = first.copy()
        self.context = prompt.copy()
        self.delta = prompt.copy()  # tokens to prefill when the KV cache of the sequence is still there
        self.prefill = np.zeros(n)
        self.kv = np.full((n, 2), -1, dtype=np.int64)  # (instance, load id) holding the sequence's KV cache
        self.tokens, self.done = 0.0, 0
        return reward_s


def _homes(index: int, n_nodes: int, k: int) -> list[int]:
    k = min(k, n_nodes)
    return sorted({(index * k + m) % n_nodes for m in range(k)})


def simulate_services(
    profiles: list[JobProfile],
    hw: Hardware,
    pool: ServicePool,
    seed: int,
    *,
    arrivals: Sequence[float] | None = None,
    pace: Mapping[str, float] | None = None,
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
      :func:`simulate_group`). Loading a job's weights onto an instance (first use, after another
      job evicted them, or after a train step updated them) costs ``2 * params / pcie`` before its
      next chunk and evicts the least recently used resident job with no sequences there.
    - Reward: the CPU verifier, as in :func:`simulate_group`. Train: FIFO over trainer gangs of
      ``gpus`` GPUs on the job's home trainer nodes; a gang that last trained another job swaps
      the state in and out first (``2 * 16 * params / gpus / pcie``, as a train slice of
      :func:`simulate_group`); the train time is the same as a dedicated job's.
    - Charging: a job is charged the GPU-time of its chunks and train steps, swaps included.
    - Arrivals: job ``k`` starts at ``arrivals[k]`` (default: all at 0); its JCT counts from there,
      and a static pool is reserved from the first arrival to the last end.
    - Elastic pools (``pool.keep_alive_s`` set): every GPU starts handed back. The router prefers a
      held idle instance to taking a new GPU, and a train step a held free gang; taking one costs
      ``provision_s`` before its first function, and a GPU idle for ``keep_alive_s`` is handed back,
      losing its weights, KV caches and training state. Reserved time is the time GPUs were held.
    - Priority: by default, queued requests are served in order of their oldest wait and train
      steps first-come first-served. With ``pace`` (each job's estimated seconds per iteration
      when alone, e.g. from :func:`estimate_pace` on other draws), both go earliest deadline first,
      a job's deadline being its arrival + (iterations done + 1) x pace: the job furthest behind
      its dedicated schedule is served first.
    """
    gpus = profiles[0].gpus
    if any(p.gpus != gpus for p in profiles):
        raise ValueError(
            "jobs sharing trainer gangs must ask for the same number of GPUs; run groups of equal size."
        )
    if pool.capacity < 1 or pool.max_resident < 1:
        raise ValueError(f"pool {pool}: capacity and max_resident must be >= 1.")
    elastic = pool.keep_alive_s is not None
    if elastic and (pool.keep_alive_s < 0 or pool.provision_s < 0):
        raise ValueError(f"pool {pool}: keep_alive_s and provision_s must be >= 0 seconds.")
    if pool.rollout_gpus < 1 or pool.trainer_gpus < gpus or pool.trainer_gpus % gpus or pool.node_gpus % gpus:
        raise ValueError(
            f"pool {pool}: needs >= 1 rollout GPU and trainer GPUs (and node size) a multiple of the jobs' {gpus} GPUs."
        )
    if len({p.name for p in profiles}) != len(profiles):
        raise ValueError("job names must be unique.")
    arrive = [0.0] * len(profiles) if arrivals is None else [float(a) for a in arrivals]
    if len(arrive) != len(profiles) or min(arrive) < 0:
        raise ValueError(f"arrivals {arrivals}: give one start time >= 0 per job ({len(profiles)} jobs).")
    n_rnodes = -(-pool.rollout_gpus // pool.node_gpus)
    inst = [
        _Instance(i // pool.node_gpus, pool.max_resident, held_since=None if elastic else 0.0)
        for i in range(pool.rollout_gpus)
    ]
    by_node = [[i for i, x in enumerate(inst) if x.node == nd] for nd in range(n_rnodes)]
    n_gangs = pool.trainer_gpus // gpus
    per_tnode = pool.node_gpus // gpus
    n_tnodes = -(-n_gangs // per_tnode)
    jobs = []
    for k, p in enumerate(profiles):
        homes = [i for nd in _homes(k, n_rnodes, pool.home_nodes) for i in by_node[nd]]
        gangs = [
            g
            for nd in _homes(k, n_tnodes, pool.home_nodes)
            for g in range(nd * per_tnode, min(n_gangs, (nd + 1) * per_tnode))
        ]
        jobs.append(_SJob(p, k, seed, homes, gangs, -(-p.batch // p.gpus)))
    gang_free = [True] * n_gangs
    gang_last = [-1] * n_gangs
    gang_since: list[float | None] = [None if elastic else 0.0] * n_gangs
    gang_token = [0] * n_gangs
    held_now = 0 if elastic else pool.rollout_gpus + pool.trainer_gpus  # GPUs the pool holds
    held_gpu_s = 0.0  # GPU-time of holds that ended (elastic pools)
    peak = held_now
    res = ServiceResult(
        {}, 0.0, 0.0, 0.0, homes={j.p.name: tuple(sorted({inst[i].node for i in j.homes})) for j in jobs}
    )
    events: list[tuple[float, int, int, int, int]] = []
    counter = 0
    loads = 0
    queues: list[list[int]] = [[] for _ in jobs]
    queued_at: list[list[float]] = [[] for _ in jobs]
    train_queue: list[int] = []
    kick: set[int] = set()
    rewards = [0.0] * len(jobs)
    roll_swap = 2 * profiles[0].params / hw.pcie_bytes_per_s if pool.swap else 0.0

    def push(t: float, kind: int, a: int, b: int = 0) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (t, counter, kind, a, b))

    def take(n: int) -> None:
        nonlocal held_now, peak
        held_now += n
        peak = max(peak, held_now)

    def give(service: str, index: int, since: float, t: float) -> None:
        nonlocal held_now, held_gpu_s
        n = 1 if service == "rollout" else gpus
        held_now -= n
        held_gpu_s += n * (t - since)
        if trace:
            res.holds.append((service, index, since, t))

    def route(j: int, s: int) -> int | None:
        job = jobs[j]
        ki, kl = job.kv[s]
        if ki >= 0 and inst[ki].resident.get(j, (-1, -1)) == (kl, job.version) and inst[ki].n < pool.capacity:
            return int(ki)
        best, key = None, None
        for i in job.homes:
            x = inst[i]
            if x.n >= pool.capacity:
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

    def assign(j: int, s: int, i: int, t: float) -> None:
        nonlocal loads
        job, x = jobs[j], inst[i]
        x.idle_token += 1  # cancels a pending hand-back
        if x.held_since is None:
            take(1)
            x.held_since, x.ready_at = t, t + pool.provision_s
            job.charged += pool.provision_s
            push(x.ready_at, 5, i)
        if not x.holds(j, job.version):
            if j not in x.resident and len(x.resident) >= pool.max_resident:
                victim = next(k for k in x.resident if not x.seqs.get(k))
                del x.resident[victim]
                x.swap_due.discard(victim)
            loads += 1
            x.resident[j] = (loads, job.version)
            if pool.swap:
                x.swap_due.add(j)
        x.resident[j] = x.resident.pop(j)  # most recently used last
        hit = tuple(job.kv[s]) == (i, x.resident[j][0])
        job.prefill[s] = job.delta[s] if hit else job.context[s]
        x.seqs.setdefault(j, set()).add(s)
        x.n += 1
        if trace:
            res.served.append((job.p.name, job.iteration, s, int(job.turn[s]), i))
        if x.current is None:
            kick.add(i)

    def request(j: int, s: int, t: float) -> None:
        i = route(j, s) if not queues[j] else None
        if i is None:
            queues[j].append(s)
            queued_at[j].append(t)
        else:
            assign(j, s, i, t)

    def urgency(j: int, waited_since: float) -> float:
        if pace is None:
            return waited_since
        return arrive[j] + (jobs[j].iteration + 1) * pace[jobs[j].p.name]

    def dispatch(t: float) -> None:
        for j in sorted(
            (j for j in range(len(jobs)) if queues[j]), key=lambda j: urgency(j, queued_at[j][0])
        ):
            while queues[j]:
                i = route(j, queues[j][0])
                if i is None:
                    break
                queued_at[j].pop(0)
                assign(j, queues[j].pop(0), i, t)

    def start_chunk(i: int, t: float) -> None:
        x = inst[i]
        if t < x.ready_at:
            return  # still starting; the ready event kicks it
        busy = [k for k in sorted(x.seqs) if x.seqs[k]]
        if not busy:
            x.current = None
            if elastic and x.held_since is not None:
                x.idle_token += 1
                push(t + pool.keep_alive_s, 6, i, x.idle_token)
            return
        j = busy[x.rr % len(busy)]
        x.rr += 1
        job = jobs[j]
        ids = np.fromiter(x.seqs[j], dtype=np.int64)
        pre = float(job.prefill[ids].sum())
        job.prefill[ids] = 0.0
        step = min(hw.chunk, max(1, int(np.ceil(job.remaining[ids].min()))))
        swap = roll_swap if j in x.swap_due else 0.0
        x.swap_due.discard(j)
        dt = (
            swap
            + 2 * job.p.params / (hw.peak_flops * hw.prefill_mfu) * pre
            + step * (hw.decode_step_s + hw.decode_s_per_seq * len(ids))
        )
        job.charged += dt
        job.swapped += swap
        x.current = (j, ids, step)
        if trace:
            res.chunks.append(
                (i, job.p.name, t, t + dt, len(ids), x.n, tuple(jobs[k].p.name for k in x.resident))
            )
        push(t + dt, 0, i)

    def end_chunk(i: int, t: float) -> None:
        x = inst[i]
        assert x.current is not None
        j, ids, step = x.current
        x.current = None
        job = jobs[j]
        job.remaining[ids] -= step
        job.context[ids] += step
        job.tokens += step * len(ids)
        for s in ids[job.remaining[ids] <= 0].tolist():
            x.seqs[j].discard(s)
            x.n -= 1
            turn = job.turn[s]
            if turn + 1 < job.n_turns[s]:
                job.turn[s] += 1
                job.remaining[s] = job.turn_len[s, turn + 1]
                job.delta[s] = job.tool_tokens[s, turn]
                job.context[s] += job.delta[s]
                job.kv[s] = (i, x.resident[j][0])
                push(t + float(job.tool_s[s, turn]), 1, j, s)
            else:
                job.done += 1
                if job.done == job.p.batch:
                    push(t + rewards[j], 2, j)
        if any(queues):
            dispatch(t)
        kick.add(i)

    def start_trains(t: float) -> None:
        for j in sorted(train_queue, key=lambda j: urgency(j, 0.0)):
            job = jobs[j]
            free = [g for g in job.gangs if gang_free[g]]
            if not free:
                continue
            g = min(free, key=lambda g: (gang_since[g] is None, gang_last[g] != j, g))
            train_queue.remove(j)
            start = 0.0
            if gang_since[g] is None:
                take(gpus)
                gang_since[g], start = t, pool.provision_s
            gang_token[g] += 1
            swap = (
                2 * 16 * job.p.params / gpus / hw.pcie_bytes_per_s if pool.swap and gang_last[g] != j else 0.0
            )
            dt = start + swap + 10 * job.p.params * job.tokens / (gpus * hw.peak_flops * hw.train_mfu)
            gang_free[g], gang_last[g] = False, j
            job.charged += gpus * dt
            job.swapped += gpus * swap
            push(t + dt, 3, g, j)

    def start_rollout(j: int, t: float) -> None:
        rewards[j] = jobs[j].start_iteration()
        for s in range(jobs[j].p.batch):
            request(j, s, t)

    for j in range(len(jobs)):
        push(arrive[j], 4, j)
    t = 0.0
    while True:
        for i in sorted(kick):
            if inst[i].current is None:
                start_chunk(i, t)
        kick.clear()
        if not events:
            break
        t, _, kind, a, b = heapq.heappop(events)
        if kind == 0:
            end_chunk(a, t)
        elif kind == 1:
            request(a, b, t)
        elif kind == 2:
            train_queue.append(a)
            start_trains(t)
        elif kind == 4:
            start_rollout(a, t)
        elif kind == 5:
            kick.add(a)
        elif kind == 6:
            x = inst[a]
            if b == x.idle_token and x.current is None and x.n == 0 and x.held_since is not None:
                give("rollout", a, x.held_since, t)
                x.held_since = None
                x.resident.clear()
                x.swap_due.clear()
        elif kind == 7:
            since = gang_since[a]
            if b == gang_token[a] and gang_free[a] and since is not None:
                give("trainer", a, since, t)
                gang_since[a], gang_last[a] = None, -1
        else:
            gang_free[a] = True
            if elastic:
                gang_token[a] += 1
                push(t + pool.keep_alive_s, 7, a, gang_token[a])
            job = jobs[b]
            job.iteration += 1
            job.version += 1
            if job.iteration == job.p.iterations:
                job.end = t
            else:
                start_rollout(b, t)
            start_trains(t)
    if any(j.end < 0 for j in jobs) or (elastic and held_now):
        raise RuntimeError(
            "service simulation stalled with unfinished jobs or held GPUs (a bug in the event loop)."
        )
    res.makespan_s = max(j.end for j in jobs) - min(arrive)
    res.reserved_gpu_s = held_gpu_s if elastic else (pool.rollout_gpus + pool.trainer_gpus) * res.makespan_s
    res.peak_gpus = peak
    res.busy_gpu_s = sum(j.charged for j in jobs)
    res.jobs = {
        j.p.name: {"jct_s": j.end - arrive[j.index], "charged_gpu_s": j.charged, "swap_gpu_s": j.swapped}
        for j in jobs
    }
    return res


@dataclass
class PoolSizing:
    """Result of :func:`size_service_pool`: the chosen pool, its run on the first seed, each job's
    worst slowdown over the seeds, and every size tried (worst slowdown over the seeds run)."""

    pool: ServicePool
    result: ServiceResult
    slowdown: dict[str, float]
    tried: list[dict[str, float]]


def dedicated_service_jct(profiles: list[JobProfile], hw: Hardware, seed: int) -> dict[str, ServiceResult]:
    """Each job alone on its own ``gpus`` GPUs (rollout and trainer colocated, state resident, no swaps),
    in the same engine as :func:`simulate_services`: the baseline its slowdowns are measured against."""
    return {
        p.name: simulate_services(
            [p], hw, ServicePool(p.gpus, p.gpus, node_gpus=max(8, p.gpus), swap=False), seed
        )
        for p in profiles
    }


def estimate_pace(profiles: list[JobProfile], hw: Hardware, seed: int) -> dict[str, float]:
    """Each job's seconds per iteration alone (:func:`dedicated_service_jct`) on the draws ``seed``: a
    profile the scheduler can take before the jobs run (use draws other than the evaluated ones)."""
    alone = dedicated_service_jct(profiles, hw, seed)
    return {p.name: alone[p.name].jobs[p.name]["jct_s"] / p.iterations for p in profiles}


def size_service_pool(
    profiles: list[JobProfile],
    hw: Hardware,
    base: ServicePool,
    *,
    max_slowdown: float,
    seeds: Sequence[int],
    max_gpus: int,
    arrivals: Sequence[float] | None = None,
    pace: Mapping[str, float] | None = None,
) -> PoolSizing:
    """Cheapest pool (other fields from ``base``) whose runs on every seed in ``seeds`` keep every
    job's JCT within ``max_slowdown`` of its dedicated JCT on that seed (:func:`dedicated_service_jct`).
    Cheapest: fewest ``rollout_gpus + trainer_gpus`` for a static pool; least reserved GPU-time on
    ``seeds[0]`` for an elastic one (its sizes are caps).

    For each trainer size (multiples of the jobs' ``gpus``), binary search for the fewest rollout GPUs
    that pass (slowdown assumed non-increasing in pool size); a static search skips sizes that cannot
    beat the best found. The result
    holds the run on ``seeds[0]`` and each job's worst slowdown over the seeds; ``arrivals`` and
    ``pace`` as in :func:`simulate_services`. Raises ``ValueError``
    if no pool of at most ``max_gpus`` GPUs meets the bound.
    """
    if not seeds:
        raise ValueError("size_service_pool needs at least one seed.")
    gpus = profiles[0].gpus
    dedicated = {
        sd: {n: r.jobs[n]["jct_s"] for n, r in dedicated_service_jct(profiles, hw, sd).items()}
        for sd in seeds
    }
    tried: list[dict[str, float]] = []
    cache: dict[tuple[int, int], tuple[ServiceResult, dict[str, float]] | None] = {}

    def run(r: int, t: int) -> tuple[ServiceResult, dict[str, float]] | None:
        if (r, t) not in cache:
            worst: dict[str, float] = {}
            first = None
            for sd in seeds:
                out = simulate_services(
                    profiles,
                    hw,
                    replace(base, rollout_gpus=r, trainer_gpus=t),
                    sd,
                    arrivals=arrivals,
                    pace=pace,
                )
                first = first or out
                for n in out.jobs:
                    worst[n] = max(worst.get(n, 0.0), out.jobs[n]["jct_s"] / dedicated[sd][n])
                if max(worst.values()) > max_slowdown:
                    break
            tried.append({"rollout_gpus": r, "trainer_gpus": t, "max_slowdown": max(worst.values())})
            cache[(r, t)] = (first, worst) if max(worst.values()) <= max_slowdown else None
        return cache[(r, t)]

    elastic = base.keep_alive_s is not None

    def cost(size: tuple[int, int]) -> float:
        hit = cache[size]
        assert hit is not None
        return hit[0].reserved_gpu_s if elastic else sum(size)

    best: tuple[int, int] | None = None
    for t in range(gpus, max_gpus, gpus):
        hi = (sum(best) - 1 if best and not elastic else max_gpus) - t
        if hi < 1 or run(hi, t) is None:
            continue
        lo = 1  # smallest R that might pass; hi passes
        while lo < hi:
            mid = (lo + hi) // 2
            if run(mid, t) is None:
                lo = mid + 1
            else:
                hi = mid
        if best is None or cost((hi, t)) < cost(best):
            best = (hi, t)
    if best is None:
        near = min(tried, key=lambda x: x["max_slowdown"])
        raise ValueError(
            f"no service pool of at most {max_gpus} GPUs keeps every job within {max_slowdown:.2f}x its dedicated JCT "
            f"(closest tried: {near['rollout_gpus']} rollout + {near['trainer_gpus']} trainer GPUs, worst slowdown "
            f"{near['max_slowdown']:.3f}); raise max_gpus or the bound."
        )
    hit = cache[best]
    assert hit is not None
    return PoolSizing(replace(base, rollout_gpus=best[0], trainer_gpus=best[1]), hit[0], hit[1], tried)

"""Phase-sliced multiplexing: RLVR jobs sharing fixed GPU groups one slice at a time.

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

Billing: user GPU-hours = GPUs held x time held (dedicated: until the job ends; a group: until its
last job ends). The workload and cost model are in :mod:`infra.llm.sim.workload`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from infra.llm.sim.workload import Hardware, JobProfile, batch_key, extra_turns, lognormal, turn_lengths


class Phase(Enum):
    """Where a job of a group is in its iteration."""

    ROLLOUT = "rollout"
    REWARD = "reward"
    TRAIN = "train"
    DONE = "done"


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
    phase: Phase = Phase.ROLLOUT
    ready_at: float = 0.0
    parts: list[_Part] = field(default_factory=list)
    rollout_end: float = 0.0
    end: float = -1.0
    gpu_busy_s: float = 0.0

    def start_rollout(self, t: float) -> None:
        """New batch (draws keyed by :func:`batch_key` and the instance), split evenly over the
        job's rollout instances (data parallel)."""
        key = batch_key(self.seed, self.p.name, self.iteration)
        self.rng = np.random.default_rng(key)
        p, n = self.p, self.p.batch
        extra = extra_turns(p, self.rng, n)
        prompt = np.maximum(1, lognormal(self.rng, p.prompt_median, p.prompt_sigma, n))
        remaining = turn_lengths(p, self.rng, n)
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
        self.phase, self.rollout_end = Phase.ROLLOUT, t

    def tokens(self) -> float:
        return sum(part.tokens for part in self.parts)


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
                    lognormal(part.rng, p.tool_median_s, p.tool_sigma, k), p.tool_cap_s
                )
                part.turns_left[tool] -= 1
                part.remaining[tool] = turn_lengths(p, part.rng, k)
                toks = np.maximum(1, lognormal(part.rng, p.tool_tokens_median, 0.5, k))
                part.prefill[tool] = toks
                part.context[tool] += toks
        if part.done.all():
            return t


class _GroupRun:
    """One GPU group's run: ``gpus / tp`` rollout instances, each running one job's slice at a time;
    a train slice takes every GPU, and a job waiting to train has priority over new rollout slices."""

    def __init__(self, profiles: list[JobProfile], hw: Hardware, seed: int, tp: int) -> None:
        self.gpus = profiles[0].gpus
        if any(p.gpus != self.gpus for p in profiles):
            raise ValueError("jobs sharing a group must ask for the same number of GPUs.")
        self.hw, self.tp = hw, tp
        self.n_inst = self.gpus // tp
        self.jobs = [_Job(p, seed, self.n_inst) for p in profiles]
        for j in self.jobs:
            j.start_rollout(0.0)
        self.shared = len(self.jobs) > 1  # a job alone keeps its state resident: no swaps
        self.free_at = [0.0] * self.n_inst
        self.on_device: list[tuple[str, Phase] | None] = [None] * self.n_inst
        self.busy = self.swaps = 0.0
        self.t = 0.0

    def swap_in(self, i: int, job: _Job, phase: Phase) -> float:
        """Seconds to copy ``job``'s state for ``phase`` onto instance ``i``; the previous job's KV cache there is lost."""
        if not self.shared or self.on_device[i] == (job.p.name, phase):
            return 0.0
        per_gpu = job.p.params / job.p.gpus
        s = (2 * per_gpu * self.tp if phase is Phase.ROLLOUT else 2 * 16 * per_gpu) / self.hw.pcie_bytes_per_s
        prev = self.on_device[i]
        if prev is not None and prev[0] != job.p.name:
            for other in self.jobs:
                if other.p.name == prev[0] and other.phase is Phase.ROLLOUT:
                    other.parts[i].kv_valid = False
        self.on_device[i] = (job.p.name, phase)
        self.swaps += s * self.tp
        return s

    def train(self, job: _Job) -> None:
        """A train slice of ``job`` on the whole group, from now."""
        t, hw = self.t, self.hw
        start = t + max(self.swap_in(i, job, Phase.TRAIN) for i in range(self.n_inst))
        end = start + 10 * job.p.params * job.tokens() / (self.gpus * hw.peak_flops * hw.train_mfu)
        job.gpu_busy_s += end - start
        self.busy += self.gpus * (end - t)
        self.free_at = [end] * self.n_inst
        job.iteration += 1
        if job.iteration == job.p.iterations:
            job.phase, job.end = Phase.DONE, end
        else:
            job.start_rollout(end)

    def rollouts(self) -> None:
        """On each free instance, the slice of the job whose sequence there is ready first."""
        t = self.t
        for i in range(self.n_inst):
            if self.free_at[i] > t:
                continue
            ready = [j for j in self.jobs if j.phase is Phase.ROLLOUT and j.parts[i].next_ready() <= t]
            if not ready:
                continue
            job = min(ready, key=lambda j: (j.parts[i].next_ready(), j.p.name))
            start = t + self.swap_in(i, job, Phase.ROLLOUT)
            end = _run_part(job, job.parts[i], start, self.hw)
            self.busy += self.tp * (end - t)
            self.free_at[i] = end
            job.rollout_end = max(job.rollout_end, end)
            if all(part.done.all() for part in job.parts):
                job.phase = Phase.REWARD
                job.ready_at = job.rollout_end + float(lognormal(job.rng, job.p.reward_median_s, 0.5))

    def next_event(self) -> float | None:
        """The earliest time after now at which something can change; None when nothing is pending."""
        t = self.t
        candidates = [f for f in self.free_at if f > t]
        for j in self.jobs:
            if j.phase is Phase.REWARD:
                candidates.append(j.ready_at)
            elif j.phase is Phase.ROLLOUT:
                candidates += [part.next_ready() for part in j.parts if part.next_ready() > t]
        pending = [c for c in candidates if c > t and np.isfinite(c)]
        return min(pending) if pending else None

    def stalled(self) -> bool:
        """With nothing pending: a job is unfinished, yet none waits to train and every instance is free."""
        jobs = self.jobs
        return (
            any(j.phase is not Phase.DONE for j in jobs)
            and not any(j.phase is Phase.TRAIN for j in jobs)
            and all(f <= self.t for f in self.free_at)
        )

    def run(self) -> dict[str, dict[str, float]]:
        """Advance from event to event until every job is done; the result of :func:`simulate_group`."""
        jobs = self.jobs
        while any(j.phase is not Phase.DONE for j in jobs):
            for j in jobs:  # the CPU verifier finished: the job now waits to train
                if j.phase is Phase.REWARD and j.ready_at <= self.t:
                    j.phase = Phase.TRAIN
            trainers = sorted(
                (j for j in jobs if j.phase is Phase.TRAIN), key=lambda j: (j.ready_at, j.p.name)
            )
            if trainers:
                if max(self.free_at) <= self.t:
                    self.train(trainers[0])
            else:
                self.rollouts()
            t = self.next_event()
            if t is not None:
                self.t = t
            elif self.stalled():
                raise RuntimeError("simulation stalled: no job can progress (a bug in the event loop).")
        out = {j.p.name: {"jct_s": j.end, "gpu_busy_s": j.gpu_busy_s} for j in jobs}
        makespan = max(j.end for j in jobs)
        out["_group"] = {"makespan_s": makespan, "busy_gpu_s": self.busy, "swap_gpu_s": self.swaps}
        return out


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
    return _GroupRun(profiles, hw, seed, tp).run()


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

"""Sizing a shared service pool: the dedicated baseline in the service engine, the jobs' paces, and
the cheapest pool that keeps every job within a slowdown bound (:func:`size_service_pool`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infra.llm.pool_shape import PoolShape
from infra.llm.sim.service_pool import ServicePool, ServiceResult, simulate_services
from infra.llm.sim.workload import Hardware, JobProfile


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
            [p], hw, ServicePool(PoolShape(p.gpus, p.gpus), node_gpus=max(8, p.gpus), swap=False), seed
        )
        for p in profiles
    }


def estimate_pace(profiles: list[JobProfile], hw: Hardware, seed: int) -> dict[str, float]:
    """Each job's seconds per iteration alone (:func:`dedicated_service_jct`) on the draws ``seed``: a
    profile the scheduler can take before the jobs run (use draws other than the evaluated ones)."""
    alone = dedicated_service_jct(profiles, hw, seed)
    return {p.name: alone[p.name].jobs[p.name]["jct_s"] / p.iterations for p in profiles}


class _SizeTrials:
    """Runs of pool sizes ``(rollout_gpus, trainer_gpus)`` on every seed, cached; a size passes when
    no job's JCT exceeds ``max_slowdown`` times its dedicated JCT on any seed."""

    def __init__(
        self,
        profiles: list[JobProfile],
        hw: Hardware,
        base: ServicePool,
        max_slowdown: float,
        seeds: Sequence[int],
        arrivals: Sequence[float] | None,
        pace: Mapping[str, float] | None,
    ) -> None:
        self.profiles, self.hw, self.base, self.max_slowdown = profiles, hw, base, max_slowdown
        self.seeds, self.arrivals, self.pace = seeds, arrivals, pace
        self.dedicated = {
            sd: {n: r.jobs[n]["jct_s"] for n, r in dedicated_service_jct(profiles, hw, sd).items()}
            for sd in seeds
        }
        self.tried: list[dict[str, float]] = []
        self.cache: dict[tuple[int, int], tuple[ServiceResult, dict[str, float]] | None] = {}

    def run(self, r: int, t: int) -> tuple[ServiceResult, dict[str, float]] | None:
        """The run on the first seed and each job's worst slowdown if the size passes, else None.
        Seeds after the first failing one are not run."""
        if (r, t) not in self.cache:
            worst: dict[str, float] = {}
            first = None
            pool = self.base.with_shape(rollout_gpus=r, trainer_gpus=t)
            for sd in self.seeds:
                out = simulate_services(
                    self.profiles, self.hw, pool, sd, arrivals=self.arrivals, pace=self.pace
                )
                first = first or out
                for n in out.jobs:
                    worst[n] = max(worst.get(n, 0.0), out.jobs[n]["jct_s"] / self.dedicated[sd][n])
                if max(worst.values()) > self.max_slowdown:
                    break
            self.tried.append({"rollout_gpus": r, "trainer_gpus": t, "max_slowdown": max(worst.values())})
            self.cache[(r, t)] = (first, worst) if max(worst.values()) <= self.max_slowdown else None
        return self.cache[(r, t)]

    def cost(self, size: tuple[int, int]) -> float:
        """What the search minimises over passing sizes: GPUs of a static pool, reserved GPU-time of an elastic one."""
        hit = self.cache[size]
        assert hit is not None
        return hit[0].reserved_gpu_s if self.base.shape.elastic else sum(size)


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
    beat the best found. The result holds the run on ``seeds[0]`` and each job's worst slowdown over
    the seeds; ``arrivals`` and ``pace`` as in :func:`simulate_services`. Raises ``ValueError`` if no
    pool of at most ``max_gpus`` GPUs meets the bound.
    """
    if not seeds:
        raise ValueError("size_service_pool needs at least one seed.")
    trials = _SizeTrials(profiles, hw, base, max_slowdown, seeds, arrivals, pace)
    best: tuple[int, int] | None = None
    for t in range(profiles[0].gpus, max_gpus, profiles[0].gpus):
        hi = (sum(best) - 1 if best and not base.shape.elastic else max_gpus) - t
        if hi < 1 or trials.run(hi, t) is None:
            continue
        lo = 1  # smallest R that might pass; hi passes
        while lo < hi:
            mid = (lo + hi) // 2
            if trials.run(mid, t) is None:
                lo = mid + 1
            else:
                hi = mid
        if best is None or trials.cost((hi, t)) < trials.cost(best):
            best = (hi, t)
    if best is None:
        near = min(trials.tried, key=lambda x: x["max_slowdown"])
        raise ValueError(
            f"no service pool of at most {max_gpus} GPUs keeps every job within {max_slowdown:.2f}x its dedicated JCT "
            f"(closest tried: {near['rollout_gpus']} rollout + {near['trainer_gpus']} trainer GPUs, worst slowdown "
            f"{near['max_slowdown']:.3f}); raise max_gpus or the bound."
        )
    hit = trials.cache[best]
    assert hit is not None
    return PoolSizing(base.with_shape(rollout_gpus=best[0], trainer_gpus=best[1]), hit[0], hit[1], trials.tried)

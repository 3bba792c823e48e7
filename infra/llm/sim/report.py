"""The simulated multiplexing benchmark: N concurrent RLVR jobs on M GPUs, dedicated placement vs
phase-sliced groups vs request-level shared services (static and elastic pools), and routers over
rollout instances. :func:`run_simulated` runs a :class:`BenchConfig` and returns the figures that
``scripts/bench_multiplex.py`` prints and writes; every figure is simulated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

from infra.common.typed_config import ConfigError
from infra.llm.pool_shape import PoolShape
from infra.llm.router import EngineCost, load_router
from infra.llm.sim.phased import PlacementResult, dedicated_placement, multiplexed_placement
from infra.llm.sim.routing import RouterWorkload, simulate_routing
from infra.llm.sim.service_pool import ServicePool, simulate_services
from infra.llm.sim.sizing import PoolSizing, dedicated_service_jct, estimate_pace, size_service_pool
from infra.llm.sim.workload import Hardware, JobProfile, mixed_workload

ROUTERS = ("round_robin", "least_loaded", "prefill_decode_aware")
"""Routers compared, in the order of the report; the last is measured against the first."""

TARGET_SLOWDOWN = 1.10
"""The slowdown target: every job at most 10 % slower than on dedicated GPUs."""

T = TypeVar("T")
Progress = Callable[[Sequence[T], str], Iterable[T]]
"""Wraps a loop over items with a description (e.g. ``rich.progress.track``)."""


@dataclass(frozen=True)
class Targets:
    """What the benchmark checks its figures against."""

    gpu_hours_saving_pct: float = 40.0
    """GPU-hours saved against dedicated placement."""
    max_slowdown: float = TARGET_SLOWDOWN
    """Worst job's JCT over its dedicated JCT, for phase-sliced groups planned for this bound."""


@dataclass(frozen=True)
class BenchConfig:
    """One run of the simulated benchmark. :meth:`validate` before :func:`run_simulated`."""

    jobs: int = 8
    """Concurrent RLVR jobs (:func:`mixed_workload`: half math, half agent)."""
    gpus: int = 32
    """GPUs in the cluster."""
    iterations: int = 8
    """RLVR iterations per job."""
    slowdowns: tuple[float, ...] = (1.10, 1.25, 1.5, 3.0)
    """Admission bounds (``max_slowdown``) at which phase-sliced groups are planned."""
    seed: int = 0
    """Evaluation draws; phase-sliced groups are profiled on ``seed + 1``, paces on ``seed + 10``."""
    service_slowdown: float = TARGET_SLOWDOWN
    """Slowdown bound the shared service pools are sized for."""
    home_nodes: int = 2
    """Nodes holding each job's state (request-level affinity)."""
    stagger_s: float = 0.0
    """Request-level runs only: job k arrives at k x this (0: all start together, as the other placements)."""
    max_resident: int = 1
    """Jobs' weights resident on one rollout GPU at once."""
    keep_alive_s: float = 5.0
    """Elastic pool: seconds a GPU stays idle before it is handed back to the cluster."""
    provision_s: float = 2.0
    """Elastic pool: seconds from taking a GPU to its first function."""
    priority: Literal["edf", "fifo"] = "edf"
    """Request-level queues: earliest deadline first from profiled paces, or first-come first-served."""
    router_instances: int = 4
    """Rollout instances the routers choose among."""
    router_requests: int = 4000
    """Requests of the routing workload."""
    router_rate: float = 40.0
    """Requests per second of the routing workload (Poisson)."""
    targets: Targets = field(default_factory=Targets)

    def validate(self) -> None:
        """Raise :class:`~infra.common.typed_config.ConfigError` naming the bad field and its valid range."""
        for name in (
            "jobs",
            "gpus",
            "iterations",
            "router_instances",
            "router_requests",
            "home_nodes",
            "max_resident",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= 1.")
        bounds = [*self.slowdowns, self.service_slowdown, self.targets.max_slowdown]
        if not self.slowdowns or any(b < 1.0 for b in bounds):
            raise ConfigError(
                f"slowdowns={self.slowdowns}, service_slowdown={self.service_slowdown}: give bounds >= 1.0 "
                "(1.10 = at most 10% slower)."
            )
        if min(self.stagger_s, self.keep_alive_s, self.provision_s) < 0:
            raise ConfigError(
                f"stagger_s={self.stagger_s}, keep_alive_s={self.keep_alive_s}, provision_s={self.provision_s}: "
                "must be >= 0 seconds."
            )
        if self.priority not in ("edf", "fifo"):
            raise ConfigError(f"priority={self.priority!r}: choose 'edf' or 'fifo'.")
        if self.router_rate <= 0:
            raise ConfigError(f"router_rate={self.router_rate}: must be > 0 requests per second.")

    def service_pools(self, gpus: int) -> dict[str, ServicePool]:
        """The base pools sized by the benchmark (sizes are searched), for jobs of ``gpus`` GPUs."""
        base = ServicePool(PoolShape(1, gpus, rollout_homes=self.home_nodes), max_resident=self.max_resident)
        elastic = dataclasses.replace(base.with_shape(keep_alive_s=self.keep_alive_s), provision_s=self.provision_s)
        return {"static": base, "elastic": elastic}


@dataclass
class SimulatedRun:
    """What :func:`run_simulated` returns: ``config`` (workload, cost models, pools) and ``results``."""

    config: dict[str, Any]
    results: dict[str, Any]


def _hours(gpu_s: float) -> float:
    return gpu_s / 3600


def _no_progress(items: Sequence[T], _: str) -> Iterable[T]:
    return items


def _placement_summary(res: PlacementResult) -> dict[str, Any]:
    return {
        "user_gpu_hours": res.gpu_hours,
        "gpus_used": res.gpus_used,
        "gpu_utilisation_pct": 100 * res.utilisation,
        "jct_mean_s": float(np.mean([r["jct_s"] for r in res.jobs.values()])),
        "jct_max_s": float(max(r["jct_s"] for r in res.jobs.values())),
    }


def _phase_sliced(
    cfg: BenchConfig, jobs: list[JobProfile], hw: Hardware, progress: Progress
) -> dict[str, dict[str, Any]]:
    """Dedicated placement and phase-sliced groups planned for each of ``cfg.slowdowns``."""
    dedicated = dedicated_placement(jobs, hw, cluster_gpus=cfg.gpus, seed=cfg.seed)
    out = {
        "dedicated": {
            **_placement_summary(dedicated),
            "jct_per_job_s": {n: r["jct_s"] for n, r in dedicated.jobs.items()},
        }
    }
    for bound in progress(cfg.slowdowns, "planning multiplexed groups"):
        m = multiplexed_placement(
            jobs,
            hw,
            dedicated,
            cluster_gpus=cfg.gpus,
            max_slowdown=bound,
            seed=cfg.seed,
            profile_seed=cfg.seed + 1,
        )
        summary = _placement_summary(m)
        out[f"max_slowdown_{bound:.2f}"] = {
            "groups": m.groups,
            "user_gpu_hours": m.gpu_hours,
            "gpu_hours_saving_pct": 100 * (1 - m.gpu_hours / dedicated.gpu_hours),
            **{k: summary[k] for k in ("gpus_used", "gpu_utilisation_pct", "jct_mean_s", "jct_max_s")},
            "slowdown_max_ratio": float(max(r["slowdown"] for r in m.jobs.values())),
            "slowdown_per_job_ratio": {n: r["slowdown"] for n, r in m.jobs.items()},
        }
    return out


@dataclass(frozen=True)
class _ServiceRun:
    """What every request-level run of the benchmark shares."""

    jobs: list[JobProfile]
    hw: Hardware
    bound: float
    max_gpus: int
    arrivals: list[float]
    pace: dict[str, float] | None

    def evaluate(self, pool: ServicePool, seed: int) -> dict[str, Any]:
        """``pool`` run on the draws ``seed``, against dedicated GPUs on the same draws."""
        ded = dedicated_service_jct(self.jobs, self.hw, seed)
        out = simulate_services(self.jobs, self.hw, pool, seed, arrivals=self.arrivals, pace=self.pace)
        slow = {n: out.jobs[n]["jct_s"] / ded[n].jobs[n]["jct_s"] for n in out.jobs}
        reserved = sum(p.gpus * ded[p.name].jobs[p.name]["jct_s"] for p in self.jobs)
        return {
            "seed": seed,
            "slowdown_max_ratio": max(slow.values()),
            "slowdown_per_job_ratio": slow,
            "saving_reserved_vs_dedicated_reserved_pct": 100 * (1 - out.reserved_gpu_s / reserved),
            "saving_charged_vs_dedicated_reserved_pct": 100 * (1 - out.busy_gpu_s / reserved),
            "peak_gpus": out.peak_gpus,
        }

    def size(self, base: ServicePool, seeds: list[int]) -> PoolSizing:
        """The cheapest pool like ``base`` within the bound on every seed of ``seeds``."""
        return size_service_pool(
            self.jobs,
            self.hw,
            base,
            max_slowdown=self.bound,
            seeds=seeds,
            max_gpus=self.max_gpus,
            arrivals=self.arrivals,
            pace=self.pace,
        )

    def dedicated(self, seed: int) -> tuple[dict[str, Any], float, float]:
        """Dedicated GPUs in the service engine: the summary, reserved and charged GPU-seconds."""
        ded = dedicated_service_jct(self.jobs, self.hw, seed)
        jct = {n: r.jobs[n]["jct_s"] for n, r in ded.items()}
        reserved = sum(p.gpus * jct[p.name] for p in self.jobs)
        busy = sum(r.busy_gpu_s for r in ded.values())
        summary = {
            "gpus_used": sum(p.gpus for p in self.jobs),
            "user_gpu_hours_reserved": _hours(reserved),
            "user_gpu_hours_charged": _hours(busy),
            "gpu_utilisation_pct": 100 * busy / reserved,
            "jct_mean_s": float(np.mean(list(jct.values()))),
            "jct_max_s": max(jct.values()),
            "jct_per_job_s": jct,
        }
        return summary, reserved, busy


def _request_level(run: _ServiceRun, base: ServicePool, seed: int) -> dict[str, Any]:
    """Dedicated baseline and the cheapest shared service pool within the bound on ``seed``, in the
    service engine; that pool re-run on ``seed + 1``; and a pool sized on seeds ``seed, seed + 1``
    evaluated on ``seed + 2`` (how much the size depends on the draws it is sized on)."""
    dedicated, ded_reserved, ded_busy = run.dedicated(seed)
    try:
        sized = run.size(base, [seed])
        robust = run.size(base, [seed, seed + 1])
    except ValueError as e:  # no pool within the cluster meets the bound: a result, not a crash
        return {"dedicated": dedicated, "request_level": None, "error": str(e)}
    out = sized.result
    return {
        "dedicated": dedicated,
        "request_level": {
            "pool": dataclasses.asdict(sized.pool),
            "gpus_used": sized.pool.shape.rollout_gpus + sized.pool.shape.trainer_gpus,
            "peak_gpus": out.peak_gpus,
            "makespan_s": out.makespan_s,
            "user_gpu_hours_reserved": _hours(out.reserved_gpu_s),
            "user_gpu_hours_charged": _hours(out.busy_gpu_s),
            "saving_reserved_vs_dedicated_reserved_pct": 100 * (1 - out.reserved_gpu_s / ded_reserved),
            "saving_charged_vs_dedicated_reserved_pct": 100 * (1 - out.busy_gpu_s / ded_reserved),
            "saving_charged_vs_dedicated_charged_pct": 100 * (1 - out.busy_gpu_s / ded_busy),
            "swap_gpu_hours": _hours(sum(r["swap_gpu_s"] for r in out.jobs.values())),
            "gpu_utilisation_pct": 100 * out.busy_gpu_s / out.reserved_gpu_s,
            "jct_mean_s": float(np.mean([r["jct_s"] for r in out.jobs.values()])),
            "jct_max_s": max(r["jct_s"] for r in out.jobs.values()),
            "jct_per_job_s": {n: r["jct_s"] for n, r in out.jobs.items()},
            "slowdown_max_ratio": max(sized.slowdown.values()),
            "slowdown_per_job_ratio": sized.slowdown,
            "charged_gpu_hours_per_job": {n: _hours(r["charged_gpu_s"]) for n, r in out.jobs.items()},
            "pool_sizes_tried": sized.tried,
        },
        "same_pool_other_draws": run.evaluate(sized.pool, seed + 1),
        "sized_on_two_draws": {
            "sizing_seeds": [seed, seed + 1],
            "pool": dataclasses.asdict(robust.pool),
            "gpus_used": robust.pool.shape.rollout_gpus + robust.pool.shape.trainer_gpus,
            "slowdown_max_ratio_on_sizing_seeds": max(robust.slowdown.values()),
            "pool_sizes_tried": robust.tried,
            "evaluated_on_third_draw": run.evaluate(robust.pool, seed + 2),
        },
    }


def _routing(
    cfg: BenchConfig, wl: RouterWorkload, cost: EngineCost, progress: Progress
) -> dict[str, dict[str, float]]:
    """TTFT and latency of each of :data:`ROUTERS` on the same requests."""
    return {
        name: simulate_routing(load_router(name, cost), cfg.router_instances, wl, cost, cfg.seed)
        for name in progress(ROUTERS, "routing")
    }


def _targets(
    cfg: BenchConfig, phase_sliced: dict[str, Any], services: dict[str, Any], routing: dict[str, Any]
) -> dict[str, Any]:
    """The figures against :class:`Targets`: phase-sliced groups planned for the target bound, pools
    sized on two draws evaluated on a third, and the prefill/decode-aware router against round robin."""
    goal = cfg.targets
    target = phase_sliced.get(f"max_slowdown_{goal.max_slowdown:.2f}")
    held_out = {
        kind: r["sized_on_two_draws"]["evaluated_on_third_draw"] if r["request_level"] else None
        for kind, r in services.items()
    }
    aware, rr = routing[ROUTERS[-1]]["ttft_p99_s"], routing[ROUTERS[0]]["ttft_p99_s"]
    return {
        f"gpu_hours_saving_pct_at_slowdown_{goal.max_slowdown:.2f}".replace(".", "_"): (
            target["gpu_hours_saving_pct"] if target else None
        ),
        "gpu_hours_saving_target_met": bool(
            target
            and target["gpu_hours_saving_pct"] >= goal.gpu_hours_saving_pct
            and target["slowdown_max_ratio"] <= goal.max_slowdown
        ),
        **{
            f"{kind}_pool_sized_on_2_draws_{k}_on_3rd": ev and ev[k]
            for kind, ev in held_out.items()
            for k in (
                "saving_reserved_vs_dedicated_reserved_pct",
                "saving_charged_vs_dedicated_reserved_pct",
                "slowdown_max_ratio",
            )
        },
        "request_level_target_met_on_3rd_draw": {
            kind: bool(
                ev
                and ev["saving_reserved_vs_dedicated_reserved_pct"] >= goal.gpu_hours_saving_pct
                and ev["slowdown_max_ratio"] <= cfg.service_slowdown
            )
            for kind, ev in held_out.items()
        },
        "router_ttft_p99_vs_round_robin_ratio": aware / rr,
        "router_beats_round_robin_p99": aware < rr,
    }


def run_simulated(cfg: BenchConfig, progress: Progress | None = None) -> SimulatedRun:
    """Run the simulated benchmark of ``cfg`` (validated here) on :func:`mixed_workload`.

    ``results`` holds ``multiplex`` (dedicated and phase-sliced placements), ``services`` (per base
    pool, ``static`` and ``elastic``: the dedicated baseline in the service engine and the sized pools),
    ``pace_s_per_iteration`` (None with FIFO priority), ``router`` and ``targets``; ``config`` the
    workload, cost models and pools the figures come from.
    """
    cfg.validate()
    progress = progress or _no_progress
    hw = Hardware()
    jobs = mixed_workload(cfg.jobs, cfg.iterations)
    phase_sliced = _phase_sliced(cfg, jobs, hw, progress)
    bases = cfg.service_pools(jobs[0].gpus)
    pace = estimate_pace(jobs, hw, cfg.seed + 10) if cfg.priority == "edf" else None
    arrivals = [k * cfg.stagger_s for k in range(len(jobs))]
    run = _ServiceRun(jobs, hw, cfg.service_slowdown, cfg.gpus, arrivals, pace)
    services = {
        kind: _request_level(run, bases[kind], cfg.seed)
        for kind in progress(list(bases), "sizing shared service pools (request-level)")
    }
    cost = EngineCost()
    wl = RouterWorkload(requests=cfg.router_requests, rate_per_s=cfg.router_rate)
    routing = _routing(cfg, wl, cost, progress)
    results = {
        "multiplex": phase_sliced,
        "services": services,
        "pace_s_per_iteration": pace,
        "router": routing,
        "targets": _targets(cfg, phase_sliced, services, routing),
    }
    config = {
        "jobs": [dataclasses.asdict(j) for j in jobs],
        "hardware": dataclasses.asdict(hw),
        "service_pools_base": {k: dataclasses.asdict(b) for k, b in bases.items()},
        "router_workload": dataclasses.asdict(wl),
        "engine_cost": dataclasses.asdict(cost),
        "note": "simulation: figures do not depend on this machine's speed",
    }
    return SimulatedRun(config, results)

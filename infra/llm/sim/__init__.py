"""Discrete-event simulation of RLVR jobs: dedicated placement vs phase-sliced GPU groups vs
request-level shared services, and of request routing across rollout instances.

- :mod:`~infra.llm.sim.workload`: job profiles, the GPU cost model, the random draws;
- :mod:`~infra.llm.sim.phased`: dedicated and phase-sliced GPU groups (``simulate_group``, placements);
- :mod:`~infra.llm.sim.services`: request-level shared services (``simulate_services``);
- :mod:`~infra.llm.sim.sizing`: the cheapest service pool within a slowdown bound;
- :mod:`~infra.llm.sim.routing`: routers over rollout instances;
- :mod:`~infra.llm.sim.report`: the simulated benchmark (``BenchConfig``, ``run_simulated``).
"""

from infra.llm.sim.phased import (
    PlacementResult,
    dedicated_placement,
    multiplexed_placement,
    plan_groups,
    simulate_group,
)
from infra.llm.sim.routing import RouterWorkload, simulate_routing
from infra.llm.sim.services import EventKind, ServicePool, ServiceResult, simulate_services
from infra.llm.sim.sizing import PoolSizing, dedicated_service_jct, estimate_pace, size_service_pool
from infra.llm.sim.workload import Hardware, JobProfile, mixed_workload

__all__ = [
    "EventKind",
    "Hardware",
    "JobProfile",
    "PlacementResult",
    "PoolSizing",
    "RouterWorkload",
    "ServicePool",
    "ServiceResult",
    "dedicated_placement",
    "dedicated_service_jct",
    "estimate_pace",
    "mixed_workload",
    "multiplexed_placement",
    "plan_groups",
    "simulate_group",
    "simulate_routing",
    "simulate_services",
    "size_service_pool",
]

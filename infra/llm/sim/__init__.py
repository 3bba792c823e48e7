"""Discrete-event simulation of RLVR jobs: dedicated placement vs phase-sliced GPU groups vs
request-level shared services, and of request routing across rollout instances.

- :mod:`~infra.llm.sim.workload`: job profiles, the GPU cost model, the random draws;
- :mod:`~infra.llm.sim.phased`: dedicated and phase-sliced GPU groups (``simulate_group``, placements);
- :mod:`~infra.llm.sim.service_pool`: request-level shared services (``simulate_services``);
- :mod:`~infra.llm.sim.sizing`: the cheapest service pool within a slowdown bound;
- :mod:`~infra.llm.sim.routing`: routers over rollout instances;
- :mod:`~infra.llm.sim.report`: the simulated benchmark (``BenchConfig``, ``run_simulated``).

Import from the modules: each name has one home.
"""

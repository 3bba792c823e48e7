"""Multiplexing measured on the running system: N RLVR jobs on a local Ray cluster, dedicated vs elastic.

``python scripts/bench_multiplex.py --real --json PATH`` runs this. On one Ray node with logical
GPUs (loopback), with the cluster's scheduler service:

1. *dedicated*: every job gets a slot of its own that leases one GPU at its first call and holds
   it until the job ends (rollout and trainer colocated, nothing shared);
2. *elastic*: the same jobs (same draws) share a pool of rollout and trainer slots
   (:mod:`infra.llm.elastic`) that lease GPUs per call and hand them back after ``keep_alive_s``
   idle, requests queued earliest deadline first, each job's state only on its home slots;
3. the simulation (``infra.llm.sim.service_pool.simulate_services``) of the same jobs, pool and
   keep-alive, with the start-up time the dedicated run measured for one lease, the emulator's own
   draws and the options that model the running pool (:data:`RUNNING_POOL`: turn-synchronous
   rollouts, homes by demand, one trainer slot per job, hand-back when a job ends, holds from placement).

Each job is :func:`infra.llm.rlvr.run_job` on a tiny model, for real. With ``emulate`` (the default)
every generate and train call also holds its GPU for the workload's duration
(:mod:`infra.llm.sim.emulator`, figures labelled "emulated compute"); without it the run is the
real tiny-model compute alone (CPU contention included). GPU-time held is read from the
scheduler's event log (lease gangs placed -> released); slowdown = a job's wall time in the
elastic run / in the dedicated run.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from infra.common.typed_config import ConfigError
from infra.llm.elastic import ElasticPool, PoolConfig
from infra.llm.grpo_trainer import llm_grpo_config
from infra.llm.model import ModelConfig
from infra.llm.pool_shape import PoolShape
from infra.llm.rlvr import JobResult, RLVRConfig, run_job
from infra.llm.router import EngineCost, load_router
from infra.llm.sim.emulator import Emulation, job_work, pace_s
from infra.llm.sim.routing import RouterWorkload, simulate_routing
from infra.llm.sim.service_pool import DrawSource, HomeRule, ServicePool, simulate_services
from infra.llm.sim.workload import Hardware, JobProfile, mixed_workload
from infra.llm.verifiable_tasks import VOCAB_SIZE

RUNNING_POOL: dict[str, Any] = {"turn_sync": True, "homes": HomeRule.DEMAND, "trainer_home_nodes": 1,
                                 "release_on_finish": True, "held_from_ready": True, "draws": DrawSource.EMULATOR}
"""The :class:`ServicePool` options that model what :class:`ElasticPool` does: turn-synchronous agent
rollouts, homes by least expected demand, one trainer slot per job, a finished job's slots handed back at
once, GPU-time held from a lease's placement; and the emulator's draws, so both sides run the same batches."""

TINY = ModelConfig(kind="char", vocab_size=VOCAB_SIZE, max_len=16, d_model=32, n_heads=2, n_layers=1)
"""The model every job trains for real (its compute is what the emulator holds the GPU beyond)."""


@dataclass(frozen=True)
class RealBenchConfig:
    """The real multiplexing benchmark (defaults: the committed run)."""

    jobs: int = 4
    """Concurrent jobs, half math, half agent (``mixed_workload``)."""
    iterations: int = 4
    """RLVR iterations per job."""
    batch_divisor: int = 8
    """The workload's batches divided by this (one GPU per job instead of four)."""
    time_scale: float = 0.04
    """Wall seconds per workload second."""
    seed: int = 0
    """Workload draws of the run; the EDF pace is profiled on seed + 10."""
    pool: PoolShape = field(default_factory=lambda: PoolShape(rollout_gpus=4, trainer_gpus=2, rollout_homes=2,
                                                              keep_alive_s=5.0))
    """The shared pool of both the elastic run (one slot per GPU) and its simulation (one-GPU nodes); its
    ``keep_alive_s`` in workload seconds (the elastic run holds an idle lease ``keep_alive_s * time_scale``)."""
    chunk_s: float = 10.0
    """Longest device hold of one generate request, in workload seconds (``Emulation.chunk_s``)."""
    router: str = "prefill_decode_aware"
    """Router of the elastic run, on the slots' reports."""
    other_routers: tuple[str, ...] = ("round_robin",)
    """Routers of extra elastic runs on the same workload, for their TTFT beside the main router's."""
    emulate: bool = True
    """Emulated compute (False: the tiny model's real compute only)."""
    gpus: int = 8
    """Logical GPUs of the Ray node."""
    job_timeout_s: float = 900.0

    def validate(self) -> None:
        """Raise :class:`~infra.common.typed_config.ConfigError` naming the field and the fix."""
        if self.jobs < 1 or self.iterations < 1 or self.batch_divisor < 1:
            raise ConfigError(f"jobs={self.jobs}, iterations={self.iterations}, batch_divisor={self.batch_divisor}: "
                              "each must be >= 1.")
        if self.chunk_s <= 0:
            raise ConfigError(f"chunk_s={self.chunk_s} must be > 0 (workload seconds per generate request).")
        if self.time_scale <= 0:
            raise ConfigError(f"time_scale={self.time_scale} must be > 0 (wall seconds per workload second).")
        if not self.pool.elastic:
            raise ConfigError("pool.keep_alive_s=None: the benchmark compares an elastic pool with dedicated GPUs; "
                              "give a keep-alive in workload seconds, e.g. 5.")
        need = max(self.jobs, self.pool.rollout_gpus + self.pool.trainer_gpus)
        if self.gpus < need:
            raise ConfigError(f"gpus={self.gpus}: the runs need {need} (jobs, or rollout + trainer slots); raise gpus.")
        for router in (self.router, *self.other_routers):
            PoolConfig(self.pool, router=router).validate()

    def profiles(self) -> list[JobProfile]:
        """The jobs' workload: ``mixed_workload`` on one GPU each, batches divided by ``batch_divisor``."""
        return [dataclasses.replace(p, gpus=1, batch=max(1, p.batch // self.batch_divisor))
                for p in mixed_workload(self.jobs, self.iterations)]

    def job_config(self, name: str, index: int) -> RLVRConfig:
        """The tiny real job behind workload job ``name``."""
        return RLVRConfig(name=name, task="sort", task_size=3, seed=index + 1, iterations=self.iterations,
                          prompts_per_iter=2, grpo=llm_grpo_config(group_size=2), warmup_steps=0, eval_prompts=2,
                          eval_every=self.iterations, threads=1, checkpoint_every=0, model=TINY)


@dataclass
class RunOutcome:
    """One run of the jobs on a pool."""

    wall_s: dict[str, float]
    results: dict[str, JobResult | BaseException]
    held_gpu_s: float
    lease_s: list[float]
    """Seconds from asking for each lease to its placement."""
    logs: dict[str, list]


def demand(p: JobProfile, hw: Hardware, seed: int) -> tuple[float, float]:
    """``p``'s share of time generating and training alone, on draws ``seed`` (a profile, like the pace)."""
    work = job_work(p, hw, seed)
    alone = sum(w.alone_s for w in work)
    return (sum(t.prefill_s + t.decode_s for w in work for t in w.turns) / alone, sum(w.train_s for w in work) / alone)


def start_cluster(gpus: int) -> Any:
    """A one-node Ray cluster on loopback with ``gpus`` logical GPUs, and its scheduler service's client."""
    import ray

    from infra.ray_cluster.realize import LOOPBACK, node_labels, secure_local_ray
    from infra.scheduler import GPU, Node
    from infra.service.client import connect

    node = Node("local", cpu_milli=8000, memory_mib=16384, gpus=(GPU("H100", 81920),) * gpus)
    secure_local_ray()
    ray.init(address="local", num_cpus=8, num_gpus=gpus, labels=node_labels(node), include_dashboard=False,
             log_to_driver=False, _node_ip_address=LOOPBACK)  # "local": a new cluster, never another user's
    return connect()


def held_gpu_seconds(client: Any, prefix: str, since: int) -> tuple[float, int]:
    """GPU-time held by the lease gangs named ``prefix-...`` from the scheduler's events after ``since``
    (placed -> released, per GPU); also the number of leases."""
    from infra.scheduler import EventKind

    placed: dict[str, float] = {}
    held, n = 0.0, 0
    for e in client.events(since, 1_000_000):
        if not e.gang.startswith(prefix) or e.gang.endswith("-slots"):
            continue
        if e.kind is EventKind.PLACED:
            placed[e.gang] = e.time
        elif e.kind is EventKind.RELEASED and e.gang in placed:
            held += e.time - placed.pop(e.gang)
            n += 1
    if placed:
        raise RuntimeError(f"leases never released: {sorted(placed)}")
    return held, n


def run_pool(client: Any, cfg: RealBenchConfig, pool_cfg: PoolConfig, pace: dict[str, float]) -> RunOutcome:
    """Run every job concurrently on one pool of ``pool_cfg``; the pool is closed after."""
    hw = Hardware()
    since = client.events(-1, 1)[-1].seq if client.events(-1, 1) else -1
    pool = ElasticPool(client, TINY, pool_cfg)
    wall: dict[str, float] = {}
    results: dict[str, JobResult | BaseException] = {}

    def work(index: int, p: JobProfile) -> None:
        em = Emulation.of(p, hw, job_work(p, hw, cfg.seed), cfg.time_scale, cfg.chunk_s) if cfg.emulate else None
        job_cfg = cfg.job_config(p.name, index)
        start = time.time()
        try:
            svc = pool.job_services(p.name, pace_s=pace[p.name] * cfg.time_scale, demand=demand(p, hw, cfg.seed + 10),
                                    emulation=em)
            results[p.name] = run_job(p.name, job_cfg, svc)
        except BaseException as e:  # one job's failure is reported, the others run on
            results[p.name] = e
        finally:
            wall[p.name] = time.time() - start
            pool.finish(p.name)

    torch.set_num_threads(1)
    threads = [threading.Thread(target=work, args=(i, p), daemon=True) for i, p in enumerate(cfg.profiles())]
    for t in threads:
        t.start()
    end = time.monotonic() + cfg.job_timeout_s
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    logs = pool.logs()
    pool.close()
    held, _ = held_gpu_seconds(client, pool.prefix, since)
    return RunOutcome(wall, results, held, [r.placed - r.asked for r in logs["leases"]], logs)


def ttft(logs: dict[str, list]) -> dict[str, float]:
    """Time to first token of the run's generate requests (slot receipt -> first token: queue, lease, swap, prefill)."""
    import numpy as np

    t = np.array([r.first_token - r.submitted for r in logs["requests"] if r.fn == "generate"])
    return {"requests": int(t.size), "ttft_p50_s": float(np.percentile(t, 50)), "ttft_p99_s": float(np.percentile(t, 99)),
            "ttft_mean_s": float(t.mean())}


def simulate_same(cfg: RealBenchConfig, provision_s: float, pace: dict[str, float]) -> dict[str, Any]:
    """The simulation of the same jobs, dedicated and on the same elastic pool (workload seconds)."""
    hw = Hardware()
    profiles = cfg.profiles()
    cap = max(p.batch for p in profiles)
    ded = ServicePool(PoolShape(1, 1), node_gpus=1, capacity=cap, swap=False, turn_sync=True, draws=DrawSource.EMULATOR)
    alone = {p.name: simulate_services([p], hw, ded, cfg.seed) for p in profiles}
    pool = ServicePool(cfg.pool, node_gpus=1, capacity=cap, provision_s=provision_s, **RUNNING_POOL)
    shared = simulate_services(profiles, hw, pool, cfg.seed, pace=pace,
                               demand={p.name: demand(p, hw, cfg.seed + 10) for p in profiles})
    dedicated_s = sum(p.gpus * alone[p.name].jobs[p.name]["jct_s"] for p in profiles)
    slowdown = {n: shared.jobs[n]["jct_s"] / alone[n].jobs[n]["jct_s"] for n in shared.jobs}
    return {
        "dedicated_gpu_hours": dedicated_s / 3600,
        "elastic_gpu_hours": shared.reserved_gpu_s / 3600,
        "gpu_hours_saved_pct": 100 * (1 - shared.reserved_gpu_s / dedicated_s),
        "slowdown": slowdown,
        "max_slowdown": max(slowdown.values()),
        "provision_s": provision_s,
    }


def _job_rows(ded: RunOutcome, mux: RunOutcome) -> dict[str, dict[str, Any]]:
    rows = {}
    for name in ded.wall_s:
        a, b = ded.results.get(name), mux.results.get(name)
        same = isinstance(a, JobResult) and isinstance(b, JobResult) and all(
            torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
        rows[name] = {"dedicated_s": ded.wall_s[name], "elastic_s": mux.wall_s.get(name),
                      "slowdown": mux.wall_s.get(name, float("nan")) / ded.wall_s[name],
                      "weights_equal_dedicated": same,
                      "error": None if isinstance(b, JobResult) else repr(b)}
    return rows


def run_real(cfg: RealBenchConfig) -> dict[str, Any]:
    """Dedicated run, elastic run, and the simulation of both; the ``results`` of the report."""
    import ray

    cfg.validate()
    hw = Hardware()
    pace = {p.name: pace_s(p, hw, cfg.seed + 10) for p in cfg.profiles()}
    client = start_cluster(cfg.gpus)
    dedicated = PoolConfig(PoolShape(cfg.jobs, 1, rollout_homes=1), colocated=True)
    try:
        # Warm-up (not measured): the first run of a process pays imports and first calls that later runs do not.
        one = PoolConfig(PoolShape(1, 1, rollout_homes=1), colocated=True)
        run_pool(client, dataclasses.replace(cfg, jobs=1, iterations=1, emulate=False), one, pace)
        t0 = time.time()
        ded = run_pool(client, cfg, dedicated, pace)
        if not cfg.emulate:  # the workload's pace means nothing to the tiny jobs: profile them from their dedicated run
            pace = {n: w / cfg.iterations / cfg.time_scale for n, w in ded.wall_s.items()}
        runs = {}
        for router in (cfg.router, *cfg.other_routers):
            wall_pool = dataclasses.replace(cfg.pool, keep_alive_s=cfg.pool.keep_alive_s * cfg.time_scale)
            runs[router] = run_pool(client, cfg, PoolConfig(wall_pool, router=router), pace)
        wall = time.time() - t0
        free = [g for n in client.status().nodes for g in n.gpu_free]
    finally:
        ray.shutdown()
    mux = runs[cfg.router]
    jobs = _job_rows(ded, mux)
    unit = cfg.time_scale if cfg.emulate else 1.0  # emulated runs report workload hours, real ones wall hours
    real = {
        "dedicated_gpu_hours": ded.held_gpu_s / unit / 3600,
        "elastic_gpu_hours": mux.held_gpu_s / unit / 3600,
        "gpu_hours_saved_pct": 100 * (1 - mux.held_gpu_s / ded.held_gpu_s),
        "max_slowdown": max(j["slowdown"] for j in jobs.values()),
        "leases": len(mux.lease_s),
        "lease_placement_s_median": sorted(mux.lease_s)[len(mux.lease_s) // 2] if mux.lease_s else None,
        "requests": len(mux.logs["requests"]),
        "swaps": sum(r.swapped for r in mux.logs["requests"]),
        "gpus_free_after": free,
        "wall_s": wall,
    }
    sim, err = None, None  # the simulation models the emulated workload, not the tiny jobs' own compute
    if cfg.emulate:
        lease_s = sorted(ded.lease_s)
        sim = simulate_same(cfg, lease_s[len(lease_s) // 2] / cfg.time_scale, pace)  # start-up: the median lease
        err = {name: 100 * abs(sim[key] - real[key]) / real[key]
               for name, key in (("gpu_hours_held", "elastic_gpu_hours"), ("max_slowdown", "max_slowdown"))}
    routers = {name: {**ttft(run.logs), "max_slowdown": max(run.wall_s[n] / ded.wall_s[n] for n in ded.wall_s),
                      "swaps": sum(r.swapped for r in run.logs["requests"])} for name, run in runs.items()}
    sim_routers = {name: simulate_routing(load_router(name, EngineCost()), cfg.pool.rollout_gpus, RouterWorkload(),
                                          EngineCost(), cfg.seed) for name in runs}
    return {"compute": "emulated compute" if cfg.emulate else "real tiny-model compute", "real": real,
            "jobs": jobs, "routers_real_pool": routers, "simulated_same_workload": sim,
            "routers_simulated_router_workload": sim_routers, "sim_vs_real_error_pct": err}

"""Launch and supervise the training job on Ray: place, start, train, restart what dies.

:func:`run_job` connects to (or, for ``fleet.address=local``, starts) a Ray cluster whose nodes are
those of ``fleet.cluster``, places the job's gang with infra's scheduler (:mod:`vla_rl.fleet.job_gang`),
starts every component on its placed node and GPUs with ``infra.ray_backend.RayBackend``, and runs
the unchanged :class:`vla_rl.trainer.Trainer` inside a trainer actor with a
:class:`~vla_rl.fleet.collector.FleetCollector`. If the trainer actor dies, a new one resumes from the
run's latest checkpoint; shards and the server restart on their own (Ray ``max_restarts``) and the
collector recovers the iteration (see :mod:`vla_rl.fleet.collector`).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from infra.ray_backend import RayBackend, node_args, start_local_cluster
from infra.scheduler import Placement, Scheduler
from vla_rl.checkpoint import LATEST
from vla_rl.fleet.collector import FleetCollector, FleetError
from vla_rl.fleet.config import FleetConfig
from vla_rl.fleet.inference import InferenceServer
from vla_rl.fleet.job_gang import JobLayout, cluster_of, place_job
from vla_rl.fleet.worker import RolloutWorker

#: Concurrent calls the inference server's event loop accepts (requests of all stages of all shards).
SERVER_CONCURRENCY = 256


#: Seconds the job waits for its server to remove its socket file at the end.
CLOSE_TIMEOUT_S = 5.0

#: A shard's observation batch (16 envs of 64x64 RGB: ~200 KB) is passed inline with the call rather
#: than through the shared-memory object store (Ray's default limit is 100 KB): one copy less per step.
INLINE_OBJECTS = {"max_direct_call_object_size": 1 << 20}


@contextlib.contextmanager
def ray_cluster(fleet: FleetConfig) -> Iterator[None]:
    """Connect to ``fleet.address``; ``local`` starts ``fleet.cluster``'s nodes here (loopback, logical GPUs).

    A Ray session already open in this process is used as it is (and left open).
    """
    if ray.is_initialized():
        yield
        return
    cluster = cluster_of(fleet.cluster)
    local = None
    if fleet.address != "local":
        ray.init(address=fleet.address, log_to_driver=False)
    elif len(cluster.nodes) == 1:  # one raylet is enough (and cheapest) for one node
        ray.init(
            **node_args(cluster.nodes[0]), include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
            _system_config=INLINE_OBJECTS,
        )
    else:
        local = start_local_cluster(cluster)
    try:
        yield
    finally:
        ray.shutdown()
        if local is not None:
            local.shutdown()


class TrainerActor:
    """The trainer as a Ray actor: :class:`vla_rl.trainer.Trainer` with a fleet collector.

    Args:
        cfg: the run config.
        resume: continue from the run's latest checkpoint.
        workers: shard actor handles, in order.
        server: inference server handle.
        cwd: working directory of the job's driver (relative ``out_dir`` resolves against it).
    """

    def __init__(self, cfg: Any, resume: bool, workers: list[Any], server: Any, cwd: str) -> None:
        os.chdir(cwd)
        from vla_rl.trainer import Trainer

        collector = FleetCollector(cfg.fleet, workers, server, cfg.env.num_envs)
        self.trainer = Trainer(cfg, resume=resume, collector=collector)

    def train(self) -> dict[str, Any]:
        """Train to the end of the run; returns the trainer's summary."""
        try:
            return self.trainer.train()
        finally:
            self.trainer.close()


@dataclass
class Fleet:
    """The started components of one job.

    Attributes:
        backend: infra's Ray backend that placed them.
        placement: the scheduler's placement of the job's gang.
        layout: which bundle is which component.
        workers: shard actors, in order.
        server: the inference server actor.
    """

    backend: RayBackend
    placement: Placement
    layout: JobLayout
    workers: list[Any]
    server: Any

    def start_trainer(self, cfg: Any, resume: bool, attempt: int = 0) -> Any:
        """Start a trainer actor on the trainer's bundle, named ``"<gang>:trainer:<attempt>"``."""
        trainer_cls = ray.remote(max_restarts=0, name=f"{self.placement.gang}:trainer:{attempt}")(TrainerActor)
        return self.backend.start_actor(
            self.placement, self.layout.bundle("trainer"), trainer_cls, cfg, resume, self.workers, self.server,
            os.getcwd(),
        )

    def close(self) -> None:
        """Stop every actor of the job and release its placement."""
        with contextlib.suppress(RayActorError, GetTimeoutError):  # a dead server has no socket to remove
            ray.get(self.server.close_socket.remote(), timeout=CLOSE_TIMEOUT_S)
        self.backend.release(self.placement.gang)


def default_batch(fleet: FleetConfig, num_envs: int) -> int:
    """The server's batch size: ``fleet.server.max_batch`` or N / stages."""
    return fleet.server.max_batch or num_envs // fleet.num_stages


def start_fleet(cfg: Any, name: str | None = None, scheduler: Scheduler | None = None) -> Fleet:
    """Place the job's gang and start its inference server and shards (the trainer comes later).

    Args:
        cfg: the run config.
        name: the gang's name (default: the run name).
        scheduler: the scheduler that owns the Ray cluster's resources, when several jobs share it
            (default: a new one over ``fleet.cluster``, for a cluster this job has alone).

    Raises:
        vla_rl.fleet.job_gang.PlacementError: the job does not fit ``fleet.cluster``.
    """
    fleet: FleetConfig = cfg.fleet
    scheduler, placement, layout = place_job(fleet, name or cfg.run_name, scheduler)
    backend = RayBackend(scheduler)
    timeout = None if fleet.server.timeout_ms is None else fleet.server.timeout_ms / 1000
    server_name = f"{placement.gang}:inference:{uuid.uuid4().hex[:8]}"  # unique, even while a killed one is torn down
    server_cls = ray.remote(
        max_restarts=fleet.max_restarts, max_task_retries=-1, max_concurrency=SERVER_CONCURRENCY, name=server_name
    )(InferenceServer)
    server = backend.start_actor(
        placement, layout.bundle("inference"), server_cls, default_batch(fleet, cfg.env.num_envs), timeout,
        cfg.device, fleet.server.threads,
    )
    worker_cls = ray.remote(max_restarts=fleet.max_restarts, max_task_retries=0)(RolloutWorker)
    per_shard = cfg.env.num_envs // fleet.shards
    shard_threads = max(1, int(fleet.shard.cpus))  # threads of its own, within the CPUs it reserved
    workers = [
        backend.start_actor(
            placement, layout.bundle("shard", k), worker_cls, cfg.env, k, k * per_shard, per_shard, fleet.num_stages,
            cfg.seed, server_name, shard_threads, fleet.server.transport,
        )
        for k in range(fleet.shards)
    ]
    return Fleet(backend, placement, layout, workers, server)


def run_job(cfg: Any, resume: bool = False) -> dict[str, Any]:
    """Run training job ``cfg`` on Ray (``cfg.fleet``); returns the trainer's summary.

    Args:
        cfg: a validated :class:`vla_rl.config.TrainConfig` whose ``fleet.mode`` is not ``inprocess``.
        resume: continue the run from its latest checkpoint.

    Raises:
        FleetError: the trainer died more often than ``fleet.max_restarts``.
    """
    latest = Path(cfg.out_dir) / cfg.run_name / "checkpoints" / LATEST
    with ray_cluster(cfg.fleet):
        fleet = start_fleet(cfg)
        try:
            for attempt in range(cfg.fleet.max_restarts + 1):
                trainer = fleet.start_trainer(cfg, resume or (attempt > 0 and latest.exists()), attempt)
                try:
                    return ray.get(trainer.train.remote())
                except RayActorError as exc:
                    if getattr(exc, "actor_init_failed", False):
                        raise  # a bug or a bad config, not a crash: restarting would fail the same way
                    print(f"trainer actor died (attempt {attempt + 1}); resuming from {latest}", flush=True)
            raise FleetError(f"the trainer died more than fleet.max_restarts={cfg.fleet.max_restarts} times")
        finally:
            fleet.close()

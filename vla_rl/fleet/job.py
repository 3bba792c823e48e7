"""Launch and supervise the training job on Ray through the cluster's scheduler service.

:func:`run_fleet_job` connects to (or, for ``fleet.address=local``, starts) a Ray cluster, submits the
job's gang (:mod:`vla_rl.fleet.job_gang`) to the cluster's scheduler service
(:mod:`infra.service`, shared with every other job there), waits until it is placed, starts
every component on its placed node and GPUs (``infra.service.client.GangBackend``), and runs the
unchanged :class:`vla_rl.trainer.Trainer` inside a trainer actor with a
:class:`~vla_rl.fleet.collector.FleetCollector`.

Preemption follows the service's contract: on the notice the trainer gets SIGTERM, ends the
iteration in progress with a checkpoint, and the job reports ``stopped``; the gang waits in the
queue, and when it is placed again the whole fleet starts on the new placement and the trainer
resumes exactly from its checkpoint. A trainer stopped by force (grace over) resumes from its
latest checkpoint. A trainer actor that dies by itself is restarted on the same fleet (up to
``fleet.max_restarts``), after the shards and the server are restarted (its rollouts would hold
them; :meth:`Fleet.restart_data_plane`). A data-parallel job (:mod:`vla_rl.fleet.data_parallel`)
is supervised the same way: its ranks together play the trainer's part. Shards and the server that die restart on their own
(Ray ``max_restarts``) and the collector recovers the iteration (see :mod:`vla_rl.fleet.collector`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from infra.common.supervisor import Supervisor, SupervisorEvent
from infra.ray_cluster.realize import LOOPBACK, node_args, secure_local_ray, start_local_cluster
from infra.scheduler.requests import RequestError
from infra.service.actor import HandleState
from infra.service.client import GangBackend, GangFailed, GangHandle, connect
from vla_rl.algorithm_registry import algorithm_class
from vla_rl.checkpoint import LATEST
from vla_rl.fleet.collector import FleetCollector, FleetError, await_shards
from vla_rl.fleet.data_parallel import DataParallelFleet
from vla_rl.fleet.inference import InferenceServer
from vla_rl.fleet.job_gang import JobLayout, PlacementError, cluster_of, job_request, place_job
from vla_rl.fleet.notice import NoticeRelay
from vla_rl.fleet.section import FleetConfig
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
    """Connect to ``fleet.address``; ``local`` starts ``fleet.cluster``'s nodes here (loopback, Ray's token
    authentication on, logical GPUs; ``infra.ray_cluster.realize.secure_local_ray``).

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
        secure_local_ray()
        # address="local": a new instance even where /tmp/ray names another (or a dead) cluster.
        ray.init(
            address="local", **node_args(cluster.nodes[0]), include_dashboard=False, log_to_driver=False,
            _node_ip_address=LOOPBACK, _system_config=INLINE_OBJECTS,
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

    def where(self) -> tuple[str, int]:
        """Ray node id and process id (a preemption notice is delivered there as SIGTERM)."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def train(self) -> dict[str, Any]:
        """Train to the end of the run (or to a SIGTERM); returns the trainer's summary."""
        try:
            return self.trainer.train()
        finally:
            self.trainer.close()


@dataclass
class Fleet:
    """The started components of one job on one placement.

    Attributes:
        gang: the job's gang in the scheduler service.
        backend: starts the components on the gang's placement groups.
        layout: which bundle is which component.
        workers: shard actors, in order.
        server: the inference server actor.
    """

    gang: GangHandle
    backend: GangBackend
    layout: JobLayout
    workers: list[Any]
    server: Any

    @property
    def placement(self) -> Any:
        """The scheduler's placement of the job's gang."""
        return self.gang.status.placement

    def start_trainer(self, cfg: Any, resume: bool, attempt: int = 0) -> Any:
        """Start a trainer actor on the trainer's bundle, named ``"<gang>:trainer:<attempt>"``."""
        trainer_cls = ray.remote(max_restarts=0, name=f"{self.gang.name}:trainer:{attempt}")(TrainerActor)
        return self.backend.start_actor(
            self.layout.bundle("trainer"), trainer_cls, cfg, resume, self.workers, self.server, os.getcwd(),
        )

    def train_once(self, cfg: Any, resume: bool, attempt: int, relay: NoticeRelay) -> dict[str, Any] | None:
        """One trainer actor to its end: its summary, or None if it died (by itself or by a forced stop)."""
        trainer = self.start_trainer(cfg, resume, attempt)
        try:
            relay.arm(*ray.get(trainer.where.remote()))
            return ray.get(trainer.train.remote())
        except RayActorError as exc:
            if getattr(exc, "actor_init_failed", False) and not relay.noticed.is_set():
                raise  # a bug or a bad config, not a crash: restarting would fail the same way
            return None
        finally:
            relay.disarm()

    def restart_data_plane(self, timeout_s: float) -> None:
        """Restart the shards and the server (Ray starts each again) after the trainer died.

        A trainer that dies mid-collection leaves its shards' rollouts running. One that waits for a
        full inference batch whose other requests will never come holds its actor, so the next
        trainer's first call to it never returns. The next trainer restores every shard from its
        checkpoint, so nothing of theirs is lost.
        """
        for actor in (*self.workers, self.server):
            with contextlib.suppress(RayActorError):
                ray.kill(actor, no_restart=False)
        await_shards(self.workers, timeout_s)

    def stop(self) -> None:
        """Let the server remove its socket (its actors stop with the gang's groups)."""
        with contextlib.suppress(RayActorError, GetTimeoutError):  # a dead server has no socket to remove
            ray.get(self.server.close_socket.remote(), timeout=CLOSE_TIMEOUT_S)

    def close(self) -> None:
        """Stop every actor of the job and release its gang."""
        self.stop()
        self.gang.release()


def default_batch(fleet: FleetConfig, num_envs: int) -> int:
    """The server's batch size: ``fleet.server.max_batch`` or N / stages."""
    return fleet.server.max_batch or num_envs // fleet.num_stages


def submit_job(cfg: Any, name: str | None = None) -> tuple[GangHandle, JobLayout]:
    """Submit the job's gang to the cluster's scheduler service (started on first use).

    Raises:
        PlacementError: the service refuses the request (it could never be placed); the reason says why.
    """
    layout = job_request(cfg.fleet, name or cfg.run_name)
    try:
        return connect().submit(layout.gang), layout
    except RequestError as exc:
        raise PlacementError(f"fleet placement of {cfg.fleet.mode!r} mode: {exc} (see the fleet.* placement fields)") from exc


def start_fleet(cfg: Any, name: str | None = None, gang: GangHandle | None = None,
                layout: JobLayout | None = None) -> Fleet | DataParallelFleet:
    """Wait until the job's gang is placed, then start its inference server and shards (the trainer comes later;
    a data-parallel job starts its ranks in each :meth:`DataParallelFleet.train_once`).

    Args:
        cfg: the run config.
        name: the gang's name when a new one is submitted (default: the run name).
        gang, layout: a gang already submitted (``submit_job``) and its layout.

    Raises:
        PlacementError: the gang was refused, or it ended without being placed (timeout, cancel).
    """
    fleet: FleetConfig = cfg.fleet
    if gang is None:
        gang, layout = submit_job(cfg, name)
    try:
        gang.wait(timeout_s=fleet.queue_timeout_s)
    except (GangFailed, TimeoutError) as exc:
        raise PlacementError(str(exc)) from exc
    backend = GangBackend(gang, restart=False)
    if fleet.mode == "data_parallel":
        return DataParallelFleet(gang, backend, layout)
    timeout = None if fleet.server.timeout_ms is None else fleet.server.timeout_ms / 1000
    server_name = f"{gang.name}:inference:{uuid.uuid4().hex[:8]}"  # unique, even while a killed one is torn down
    server_cls = ray.remote(
        max_restarts=fleet.max_restarts, max_task_retries=-1, max_concurrency=SERVER_CONCURRENCY, name=server_name
    )(InferenceServer)
    server = backend.start_actor(
        layout.bundle("inference"), server_cls, default_batch(fleet, cfg.env.num_envs), timeout, cfg.device,
        fleet.server.threads,
    )
    worker_cls = ray.remote(max_restarts=fleet.max_restarts, max_task_retries=0)(RolloutWorker)
    per_shard = cfg.env.num_envs // fleet.shards
    shard_threads = max(1, int(fleet.shard.cpus))  # threads of its own, within the CPUs it reserved
    workers = [
        backend.start_actor(
            layout.bundle("shard", k), worker_cls, cfg.env, k, k * per_shard, per_shard, fleet.num_stages,
            cfg.seed, server_name, shard_threads, fleet.server.transport, algorithm_class(cfg.algo).group_size(cfg),
        )
        for k in range(fleet.shards)
    ]
    return Fleet(gang, backend, layout, workers, server)


def run_fleet_job(cfg: Any, resume: bool = False) -> dict[str, Any]:
    """Run training job ``cfg`` on Ray (``cfg.fleet``) through the scheduler service; returns the trainer's summary.

    Args:
        cfg: a validated :class:`vla_rl.config.TrainConfig` whose ``fleet.mode`` is not ``inprocess``.
        resume: continue the run from its latest checkpoint.

    Raises:
        FleetError: the trainer died more often than ``fleet.max_restarts``.
        PlacementError: the job does not fit ``fleet.cluster`` (``address=local``: found before Ray starts), or
            the gang was refused or never placed within ``fleet.queue_timeout_s``.
    """
    latest = Path(cfg.out_dir) / cfg.run_name / "checkpoints" / LATEST
    if cfg.fleet.address == "local":
        place_job(cfg.fleet, cfg.run_name)  # on the cluster it is about to start: a misfit fails before Ray starts
    with ray_cluster(cfg.fleet):
        gang, layout = submit_job(cfg)
        relay = NoticeRelay()
        gang.on_notice(relay.notice)
        try:
            return _supervise(cfg, gang, layout, relay, resume, latest)
        finally:
            gang.release()


def _supervise(cfg: Any, gang: GangHandle, layout: JobLayout, relay: NoticeRelay, resume: bool, latest: Path) -> dict:
    """Place, train, and on a preemption wait and train again, until the run ends.

    A trainer (or a rank) that dies by itself counts against ``fleet.max_restarts`` over the whole run; a
    preemption does not (the gang waits and the trainer resumes from its checkpoint)."""
    who = "a rank" if cfg.fleet.mode == "data_parallel" else "trainer"
    attempt = 0

    def say(event: SupervisorEvent, _detail: str) -> None:
        if event is SupervisorEvent.RESTARTING:
            print(f"{who} actor died (attempt {attempt}); resuming from {latest}", flush=True)

    supervisor = Supervisor(f"{who} actor", cfg.fleet.max_restarts, "fleet.max_restarts", on_event=say, error=FleetError)
    while True:
        fleet = start_fleet(cfg, gang=gang, layout=layout)
        epoch = fleet.placement.epoch
        while True:
            summary = fleet.train_once(cfg, resume or latest.exists(), attempt, relay)
            attempt += 1
            if summary is not None and "stopped_by" not in summary:
                fleet.stop()
                return summary
            now = gang.refresh()
            if relay.noticed.is_set() or now.placement is None or now.placement.epoch != epoch:
                break  # preempted: stopped by itself (a checkpoint at its last iteration) or by force
            if summary is not None:  # SIGTERM from someone else: the run stops here, resumable
                fleet.stop()
                return summary
            supervisor.restart(f"attempt {attempt} ended without a summary",
                               functools.partial(fleet.restart_data_plane, cfg.fleet.collect_timeout_s))
        fleet.stop()
        if gang.refresh().state is HandleState.DRAINING:
            gang.stopped()
        relay.noticed.clear()
        print(f"{gang.name} preempted ({gang.status.reason}); it waits in the queue and resumes from {latest}",
              flush=True)

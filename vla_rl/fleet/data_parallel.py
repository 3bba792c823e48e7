"""``fleet.mode=data_parallel``: N Ray actors, one GPU each, that each do everything and average gradients.

Every rank (:class:`RankActor`) holds its own simulators (``env.backend=warp`` on its GPU, or the
batch backend on its CPUs), renderer, policy, rollout buffer and update: it is the unchanged
:class:`vla_rl.trainer.Trainer` with a :class:`vla_rl.distributed.GradientSync` over a
``torch.distributed`` group (NCCL on GPUs, gloo on CPUs), the scheme of rsl_rl's multi-GPU runner.
Rank r holds environments ``[r n, (r + 1) n)`` of the run's ``env.num_envs`` (``env_offset = r n``),
so the ranks draw the episodes of one environment set of that size. The ranks' weights are equal
after every update (checked each iteration); rank 0 evaluates and writes the checkpoints, which
hold every rank's own state.

The job is one gang of N whole-GPU bundles (:mod:`vla_rl.fleet.job_gang`) in the cluster's
scheduler service; :func:`vla_rl.fleet.job.run_fleet_job` supervises it as any fleet: a preemption
notice reaches rank 0 as SIGTERM and every rank stops with a checkpoint; a rank that dies ends
the attempt, :meth:`DataParallelFleet.train_once` stops every other rank (they would wait in
their next collective) and the job starts all ranks again from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray.exceptions import RayActorError

from infra.service.client import GangBackend, GangHandle
from vla_rl.fleet.job_gang import JobLayout
from vla_rl.fleet.rank import join_rank

if TYPE_CHECKING:
    from vla_rl.fleet.notice import NoticeRelay

class RankActor:
    """One data-parallel rank as a Ray actor: a trainer over its own slice of the environments.

    Args:
        cfg: the run config (``fleet.mode=data_parallel``).
        rank: this rank, ``0 .. fleet.num_gpus - 1``.
        cwd: working directory of the job's driver (relative ``out_dir`` resolves against it).
    """

    def __init__(self, cfg: Any, rank: int, cwd: str) -> None:
        os.chdir(cwd)
        self.cfg = cfg
        self.rank = rank
        self.trainer: Any = None

    def where(self) -> tuple[str, int]:
        """Ray node id and process id (a preemption notice is delivered there as SIGTERM)."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def describe(self) -> dict[str, Any]:
        """This rank's node, process and the GPUs Ray gave it (``CUDA_VISIBLE_DEVICES``)."""
        node, pid = self.where()
        return {"rank": self.rank, "node": node, "pid": pid, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    def rendezvous(self) -> str:
        """The ``tcp://host:port`` every rank joins (rank 0's node, a port free now)."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def join(self, address: str, resume: bool) -> None:
        """Join the process group at ``address`` and build this rank's trainer (all ranks call this together)."""
        self.trainer = join_rank(self.cfg, self.rank, self.cfg.fleet.num_gpus, address, resume,
                                 cpus=self.cfg.fleet.trainer.cpus)

    def train(self) -> dict[str, Any]:
        """Train to the end of the run (or to a SIGTERM to any rank); returns this rank's summary."""
        import torch.distributed as dist

        try:
            return self.trainer.train()
        finally:
            self.trainer.close()
            dist.destroy_process_group()

    def step(self) -> dict[str, float]:
        """One iteration (collect, update) on every rank at once; returns this rank's metrics."""
        return self.trainer.step()

    def weights(self) -> dict[str, torch.Tensor]:
        """This rank's policy ``state_dict``."""
        return self.trainer.policy.state_dict()


def start_ranks(gang: GangHandle, backend: GangBackend, layout: JobLayout, cfg: Any, attempt: int) -> list[Any]:
    """Start one :class:`RankActor` on each rank's bundle, named ``"<gang>:rank<r>:<attempt>"``."""
    ranks = []
    for r in range(cfg.fleet.num_gpus):
        cls = ray.remote(max_restarts=0, max_task_retries=0)(RankActor)
        ranks.append(backend.start_actor(layout.bundle("rank", r), cls, cfg, r, os.getcwd(),
                                         options={"name": f"{gang.name}:rank{r}:{attempt}"}))
    return ranks


def join_ranks(ranks: list[Any], resume: bool) -> None:
    """Form the ranks' process group and build their trainers (raises what a rank raised)."""
    address = ray.get(ranks[0].rendezvous.remote())
    wait_all([rank.join.remote(address, resume) for rank in ranks])


def wait_all(refs: list[Any]) -> list[Any]:
    """The results of ``refs``, raising as soon as any of them fails (the others may wait on it forever)."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ray.get(ready)  # raises a dead rank's RayActorError or a rank's exception now
    return ray.get(refs)


@dataclass
class DataParallelFleet:
    """The placed gang of a data-parallel job; its ranks live for one attempt (:meth:`train_once`).

    Attributes:
        gang: the job's gang in the scheduler service.
        backend: starts the ranks on the gang's placement groups.
        layout: which bundle is which rank.
    """

    gang: GangHandle
    backend: GangBackend
    layout: JobLayout

    @property
    def placement(self) -> Any:
        """The scheduler's placement of the job's gang."""
        return self.gang.status.placement

    def train_once(self, cfg: Any, resume: bool, attempt: int, relay: NoticeRelay) -> dict[str, Any] | None:
        """Start every rank, train to the end; rank 0's summary, or None if a rank died.

        Every rank is stopped at the end: a dead rank's peers would wait for it in their next collective.
        """
        ranks = start_ranks(self.gang, self.backend, self.layout, cfg, attempt)
        try:
            join_ranks(ranks, resume)
            relay.arm(*ray.get(ranks[0].where.remote()))  # rank 0's stop reaches every rank
            return wait_all([rank.train.remote() for rank in ranks])[0]
        except RayActorError:
            return None
        finally:
            relay.disarm()
            for rank in ranks:
                with contextlib.suppress(RayActorError):
                    ray.kill(rank)

    def restart_data_plane(self, timeout_s: float) -> None:
        """Nothing to restart: the ranks are the whole job, and :meth:`train_once` starts them all anew."""

    def stop(self) -> None:
        """Nothing to stop: :meth:`train_once` stops its ranks when it returns."""

    def close(self) -> None:
        """Release the job's gang."""
        self.gang.release()

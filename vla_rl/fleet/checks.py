"""The ``fleet`` section against the rest of the job: the algorithm, the environments, and the sizes of the
cluster a local job starts (:func:`validate_fleet`, which ``TrainConfig.validate`` calls after
:meth:`~vla_rl.fleet.section.FleetConfig.validate`). Imports neither Ray nor torch."""

from __future__ import annotations

from typing import Any, Protocol

from infra.common.typed_config import ConfigError
from vla_rl.fleet.job_gang import check_fits
from vla_rl.fleet.section import FleetConfig


class Job(Protocol):
    """What :func:`validate_fleet` reads of a training job's config (a ``vla_rl.config.TrainConfig``, which imports
    this module for its ``fleet`` section)."""

    algo: str
    fleet: FleetConfig
    env: Any
    """The ``env`` section: ``kind``, ``task``, ``num_envs``, ``backend``, ``warp_device``."""
    grpo: Any
    """The ``grpo`` section: ``group_size``."""


def _check_grpo(cfg: Job, per_shard: int) -> None:
    """GRPO on the fleet: synchronous, one stage, and whole groups on every shard."""
    fleet = cfg.fleet
    if fleet.mode == "pipelined" or fleet.sync.mode != "sync":
        raise ConfigError(f"algo=grpo on the fleet collects whole episodes synchronously in one stage; use "
                          f"fleet.mode=colocated or disaggregated with fleet.sync.mode=sync (not {fleet.mode}/{fleet.sync.mode})")
    if per_shard % cfg.grpo.group_size:
        raise ConfigError(f"grpo.group_size={cfg.grpo.group_size} must divide a shard's {per_shard} environments "
                          "(env.num_envs / fleet.shards), so that no group straddles two shards")


def _check_data_parallel(cfg: Job) -> None:
    """``data_parallel``: PPO and equal environments per rank (synchronous, one whole GPU per rank: the section's)."""
    fleet = cfg.fleet
    if cfg.algo != "ppo":
        raise ConfigError(f"fleet.mode=data_parallel trains PPO (its ranks' batches are equal in size); use "
                          f"fleet.mode=colocated or disaggregated for algo={cfg.algo}")
    if fleet.num_gpus < 1 or cfg.env.num_envs % fleet.num_gpus:
        raise ConfigError(f"fleet.num_gpus={fleet.num_gpus} must be >= 1 and divide env.num_envs={cfg.env.num_envs} "
                          "(each rank holds the same number of environments)")


def validate_fleet(cfg: Job) -> None:
    """Check the ``fleet`` section against the algorithm, the environments and (a local cluster) the declared
    sizes of the cluster it starts, without placing anything (``TrainConfig.validate`` calls it, after
    :meth:`FleetConfig.validate`); raise ``ConfigError`` naming the fix. Never modifies ``cfg``."""
    fleet = cfg.fleet
    if fleet.mode == "inprocess":
        return
    if fleet.address == "local":
        check_fits(fleet)  # against the sizes of the cluster it starts; the placement is computed at job start
    if cfg.algo not in ("ppo", "grpo"):
        raise ConfigError(f"fleet.mode={fleet.mode} runs PPO and GRPO; use fleet.mode=inprocess for algo={cfg.algo}")
    if fleet.mode == "data_parallel":
        _check_data_parallel(cfg)  # each rank simulates on its own GPU: warp on CUDA is its purpose
    elif cfg.env.num_envs % fleet.shards:
        raise ConfigError(
            f"fleet.shards={fleet.shards} must divide env.num_envs={cfg.env.num_envs} "
            "(each shard holds the same number of environments)"
        )
    elif cfg.env.kind == "sims" and cfg.env.backend == "warp" and cfg.env.warp_device != "cpu":
        # Shards and the server exchange numpy arrays (a socket or Ray calls); there is no CUDA IPC path.
        raise ConfigError(
            f"env.backend=warp with env.warp_device={cfg.env.warp_device} and fleet.mode={fleet.mode}: the fleet's "
            "shards hand observations to the inference server through host memory, which a GPU's tensors cannot "
            "take; train in one process to keep the data on the GPU (fleet.mode=inprocess device=cuda:N "
            "env.warp_device=cuda:N, or fleet.mode=data_parallel: one such process per GPU), or set env.warp_device=cpu"
        )
    per_shard = cfg.env.num_envs // fleet.shards
    if cfg.algo == "grpo":
        _check_grpo(cfg, per_shard)
    if fleet.mode == "pipelined" and (fleet.stages < 2 or per_shard % fleet.stages):
        raise ConfigError(
            f"fleet.stages={fleet.stages} must be >= 2 and divide the {per_shard} environments of a shard "
            "(env.num_envs / fleet.shards) in pipelined mode"
        )

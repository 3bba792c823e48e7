"""One data-parallel rank's trainer, joined to its ``torch.distributed`` group (no Ray needed).

:class:`vla_rl.fleet.data_parallel.RankActor` calls :func:`join_rank` on each of its Ray actors;
``scripts/device/dp_one_gpu.py`` calls it from two local processes sharing one GPU, the check of the
all-reduce path on a one-GPU machine (which has no Ray, and where NCCL refuses two ranks on one GPU).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

#: Longest a rank waits in one collective for the others (a rank evaluating or writing a checkpoint
#: keeps the others waiting); a dead rank is noticed by the job long before, by Ray.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=1)


def join_rank(cfg: Any, rank: int, world: int, address: str, resume: bool = False, backend: str | None = None,
              cpus: int = 1) -> Any:
    """Join the process group at ``address`` as ``rank`` of ``world`` and build this rank's ``Trainer`` over
    its slice of ``cfg.env.num_envs`` (environments ``rank * n .. (rank + 1) * n - 1``); all ranks call this
    together.

    Args:
        backend: the ``torch.distributed`` backend; None: NCCL on CUDA, gloo on the CPU. ``"gloo"`` on a
            CUDA device all-reduces CUDA tensors through the host, which lets ranks share one GPU.
        cpus: threads of this rank's CPU simulators.
    """
    import torch.distributed as dist

    from vla_rl.algorithm_registry import algorithm_class
    from vla_rl.device import resolve_device
    from vla_rl.distributed import GradientSync
    from vla_rl.envs import make_env
    from vla_rl.rollout import LocalCollector
    from vla_rl.trainer import Trainer

    device = resolve_device(cfg.device)
    if device.type == "cuda":  # Ray shows a rank only its own GPU: cuda:0 unless named
        torch.cuda.set_device(device.index or 0)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    objects = dist.new_group(backend="gloo") if backend == "nccl" else None  # checkpoints' pickled states
    n = cfg.env.num_envs // world
    env = make_env(cfg.env, seed=cfg.seed, num_envs=n, env_offset=rank * n,
                   group_size=algorithm_class(cfg.algo).group_size(cfg), num_threads=max(1, int(cpus)))
    return Trainer(cfg, resume=resume, collector=LocalCollector(env, device), sync=GradientSync(device, objects))

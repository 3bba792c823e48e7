"""Data-parallel training: R processes (ranks), each with its own environments, that stay identical.

A :class:`GradientSync` is what the trainer and the clipped update talk to; with one rank (the
default, :data:`LOCAL`) every method is the identity, so in-process training is unchanged. With
``torch.distributed`` initialised (``vla_rl.fleet.data_parallel``: NCCL on GPUs, gloo on CPUs) it

- broadcasts rank 0's weights at the start and gives every rank its own sampling RNG stream;
- averages each minibatch's gradients, and the statistics its decisions read (the KL of the early
  stop and of the adaptive learning rate), in one all-reduce, so every rank takes the same step;
- gathers every rank's batch of observations (camera frames excepted) for the observation normaliser;
- agrees on when to stop, and gathers each rank's own state (environments, RNG, episode counters,
  reward normaliser) into rank 0's checkpoint, which every rank resumes from.

Weights are identical on every rank after every update: the same start, the same averaged
gradient and the same optimiser arithmetic (rsl_rl's multi-GPU scheme). :meth:`check_equal`
verifies that each iteration with one small all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict, TensorDictBase
from torch import nn

#: Keys of a checkpoint that hold one rank's own state (the rest is the same on every rank).
RANK_KEYS = ("rng", "collector", "episode_stats", "algorithm")

#: Per-rank seed stride: rank r samples actions from torch's stream seeded ``seed + RANK_SEED_STRIDE * r``.
RANK_SEED_STRIDE = 100_003


class RanksDiverged(RuntimeError):
    """The ranks' weights differ after an update (a non-deterministic op, or a rank that skipped a step)."""


class GradientSync:
    """The collectives data-parallel training needs, over the default ``torch.distributed`` group.

    Args:
        device: Device of the policy (NCCL reduces CUDA tensors; gloo CPU ones).
        objects: Group for pickled objects (a gloo group beside NCCL); ``None``: the default group.
    """

    def __init__(self, device: torch.device | str = "cpu", objects: Any = None) -> None:
        self.device = torch.device(device)
        self.objects = objects
        self.world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world_size > 1 else 0

    @property
    def is_writer(self) -> bool:
        """Whether this rank writes the run's checkpoints, summary and evaluations (rank 0)."""
        return self.rank == 0

    def start(self, policy: nn.Module, seed: int) -> None:
        """Make every rank's ``policy`` rank 0's, then seed this rank's own sampling stream."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            for tensor in (*policy.parameters(), *policy.buffers()):
                dist.broadcast(tensor.data, src=0)
        torch.manual_seed(seed + RANK_SEED_STRIDE * self.rank)

    def reduce_grads(self, params: Iterable[nn.Parameter], stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Average the gradients of ``params`` and the scalar ``stats`` over the ranks, in one all-reduce.

        Args:
            params: Parameters after ``backward`` (those without a gradient are skipped, on every rank alike).
            stats: Scalar tensors of this rank's minibatch (losses, ``approx_kl``).

        Returns:
            ``stats`` averaged over the ranks (the gradients are averaged in place).
        """
        if self.world_size == 1:
            return stats
        grads = [p.grad for p in params if p.grad is not None]
        keys = list(stats)
        dtype = grads[0].dtype if grads else torch.float32
        flat = torch.cat([g.reshape(-1) for g in grads] + [stats[k].detach().reshape(1).to(dtype) for k in keys])
        dist.all_reduce(flat)
        flat /= self.world_size
        sizes = [g.numel() for g in grads] + [1] * len(keys)
        parts = flat.split(sizes)
        for grad, part in zip(grads, parts, strict=False):
            grad.copy_(part.view_as(grad))
        return {k: part.reshape(()) for k, part in zip(keys, parts[len(grads):], strict=True)}

    def gather_obs(self, obs: TensorDictBase) -> TensorDictBase:
        """Every rank's non-image entries of ``obs`` ``[B]``, concatenated in rank order: ``[R * B]``.

        What the observation normalisers read (proprioception, state, indices); uint8 camera frames stay
        behind. Every rank's ``B`` must be equal.
        """
        if self.world_size == 1:
            return obs
        out = {}
        for key, value in obs.items(include_nested=True, leaves_only=True):
            if value.dtype != torch.uint8:
                parts = [torch.empty_like(value) for _ in range(self.world_size)]
                dist.all_gather(parts, value.contiguous())
                out[key] = torch.cat(parts)
        return TensorDict(out, batch_size=[obs.batch_size[0] * self.world_size], device=obs.device)

    def total(self, count: int) -> int:
        """``count`` summed over the ranks (environment steps of one iteration)."""
        if self.world_size == 1:
            return count
        value = torch.tensor([count], dtype=torch.float64, device=self.device)
        dist.all_reduce(value)
        return int(value.item())

    def any(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag or-ed over the ranks (stop decisions every rank must take together)."""
        if self.world_size == 1:
            return flags
        value = torch.tensor([float(f) for f in flags], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return tuple(bool(v) for v in value.tolist())

    def check_equal(self, policy: nn.Module) -> None:
        """Raise :class:`RanksDiverged` unless every rank holds the same weights (per-tensor float64 sums compared).

        Raises:
            RanksDiverged: on every rank whose sums differ from the ranks' maximum.
        """
        if self.world_size == 1:
            return
        with torch.no_grad():
            sums = torch.stack([p.detach().double().sum() for p in policy.parameters()]).to(self.device)
        high, low = sums.clone(), sums.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        if not torch.equal(high, low):
            bad = int((high != low).nonzero()[0])
            raise RanksDiverged(
                f"data-parallel ranks hold different weights after an update (parameter {bad} first); the update is "
                "not deterministic across ranks (use deterministic kernels, the same torch build on every node)"
            )

    def gather_state(self, local: dict[str, Any]) -> dict[str, Any]:
        """This rank's part of a checkpoint (``RANK_KEYS``) as the checkpoint stores it.

        One rank: ``local`` itself. R ranks: rank 0's entries, plus ``ranks``, every rank's ``local`` in
        rank order (on rank 0; the other ranks get ``{}``, since they write nothing).
        """
        if self.world_size == 1:
            return local
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, local, group=self.objects)
        return {**parts[0], "ranks": parts} if self.is_writer else {}

    def local_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """This rank's part (``RANK_KEYS``) of a checkpoint :meth:`gather_state` shaped.

        Raises:
            ValueError: the checkpoint was written by another number of ranks.
        """
        ranks = state.get("ranks")
        count = 1 if ranks is None else len(ranks)
        if count != self.world_size:
            raise ValueError(
                f"the checkpoint holds the state of {count} data-parallel rank(s) and this run has {self.world_size}; "
                f"resume with fleet.num_gpus={count}"
            )
        return state if ranks is None else ranks[self.rank]


#: The single-process sync: every method is the identity.
LOCAL = GradientSync()

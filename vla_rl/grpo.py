"""GRPO: group-relative advantages over G episodes that start from the same initial state.

No critic: each episode's return is compared with the other G - 1 episodes of its group
(Shao et al. 2024, DeepSeekMath; RLinf's embodied GRPO), the normalised difference is the
advantage of every step of that episode, and the update is PPO's clipped surrogate
(:class:`vla_rl.ppo.ClippedUpdate` with ``vf_coef=0``).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict


def group_advantages(returns: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Normalise episode returns within consecutive groups.

    Args:
        returns: ``[E]`` episode returns, consecutive blocks of ``group_size`` share an initial state.
        group_size: G, the episodes per group; ``E`` must be a multiple of it.
        eps: Added to the group's standard deviation (a group of equal returns gets advantage 0).

    Returns:
        ``[E]`` advantages ``(R_i - mean_group) / (std_group + eps)`` with the population std.
    """
    if returns.dim() != 1 or returns.shape[0] % group_size:
        raise ValueError(f"returns must be [E] with E a multiple of group_size={group_size}, got {tuple(returns.shape)}")
    groups = returns.reshape(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, correction=0)
    return ((groups - mean) / (std + eps)).reshape(-1)


def episode_batch(batch: TensorDict, advantage: torch.Tensor) -> TensorDict:
    """Flatten a ``[T, N]`` episode batch to its live steps, each carrying its episode's advantage.

    Args:
        batch: Output of :func:`vla_rl.rollout.collect_episodes` with ``alive`` ``[T, N]``.
        advantage: ``[N]`` advantage of each environment's episode.

    Returns:
        A flat TensorDict ``[B]`` (B = live steps) with ``obs``, ``action``, ``log_prob``, ``advantage``.
    """
    batch = batch.clone(False)
    batch["advantage"] = advantage[None].expand(batch.batch_size).clone()
    flat = batch[batch["alive"]]
    return flat.select("obs", "action", "log_prob", "advantage")

"""Teacher-student distillation (DAgger) from a privileged-state policy into the VLA.

The teacher is a trained policy that reads privileged simulator state (e.g. a state-PPO run of
``configs/reach_state_ppo.yaml``); the student (the VLA) reads camera, instruction and
proprioception. Each iteration collects ``[T, N]`` steps with the teacher acting for the first
``teacher_iterations`` iterations and the student afterwards (so the student is trained on the
states its own mistakes lead to: DAgger, Ross et al. 2011), labels every visited observation
with the teacher's deterministic action, and maximises the student's log-likelihood of those
labels on minibatches drawn from the aggregated data set (the last ``buffer_size`` labelled
observations). The "learning by cheating" recipe of Chen et al. 2019.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict
from torch import nn

import policies
from vla_rl.checkpoint import CheckpointError, load_checkpoint
from vla_rl.config import build_config


def load_teacher(path: str | Path, obs: TensorDict, action_dim: int, device: torch.device) -> nn.Module:
    """Rebuild a trained policy from its checkpoint, for acting on observations like ``obs``.

    Raises:
        CheckpointError: The checkpoint is missing or corrupt, or its policy does not fit ``obs`` / ``action_dim``.
    """
    state = load_checkpoint(path)
    cfg = build_config(state["config"])
    try:
        teacher = policies.make_policy(cfg.policy, obs, action_dim)
        teacher.load_state_dict(state["policy"])
    except (KeyError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"teacher {path} does not fit this environment's observations or actions: {exc}") from exc
    teacher.eval()
    for param in teacher.parameters():
        param.requires_grad_(False)
    return teacher.to(device)


@torch.no_grad()
def label(teacher: nn.Module, obs: TensorDict, chunk: int = 4096) -> torch.Tensor:
    """The teacher's deterministic actions ``[B, ...]`` for a flat observation batch ``[B]``."""
    return torch.cat([teacher.act(obs[i : i + chunk], deterministic=True)["action"] for i in range(0, obs.shape[0], chunk)])


def imitation_update(
    policy: nn.Module, optimizer: torch.optim.Optimizer, buffer: TensorDict, updates: int, batch_size: int,
    max_grad_norm: float,
) -> dict[str, float]:
    """Gradient steps maximising ``log pi(teacher_action | obs)`` on minibatches drawn from the buffer.

    Args:
        policy: The student, with ``evaluate(obs, action) -> (log_prob, entropy, value)``.
        optimizer: The student's optimiser.
        buffer: Flat labelled data ``[B]`` with ``obs`` and ``teacher_action``.
        updates: Gradient steps.
        batch_size: Minibatch size (indices drawn uniformly with torch's global RNG).
        max_grad_norm: Global gradient-norm clip.

    Returns:
        Mean negative log-likelihood, entropy and gradient norm over the steps.
    """
    totals = {"imitation_nll": 0.0, "entropy": 0.0, "grad_norm": 0.0}
    size = buffer.batch_size[0]
    for _ in range(updates):
        mb = buffer[torch.randint(0, size, (min(batch_size, size),))]
        log_prob, entropy, _ = policy.evaluate(mb["obs"], mb["teacher_action"])
        loss = -log_prob.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
        optimizer.step()
        for key, value in (("imitation_nll", loss), ("entropy", entropy.mean()), ("grad_norm", grad_norm)):
            totals[key] += float(value.detach())
    return {k: v / max(updates, 1) for k, v in totals.items()}


def action_agreement(student: torch.Tensor, teacher: torch.Tensor) -> float:
    """Mean cosine similarity of student and teacher actions (1: the same direction)."""
    s, t = student.flatten(1), teacher.flatten(1)
    return float(torch.nn.functional.cosine_similarity(s, t, dim=1, eps=1e-6).mean())


__all__ = ["action_agreement", "imitation_update", "label", "load_teacher"]

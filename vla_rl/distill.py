"""Teacher-student distillation (DAgger) from a privileged-state policy into the VLA.

The teacher is a trained policy that reads privileged simulator state (e.g. a state-PPO run of
``configs/reach_state_ppo.yaml``); the student (the VLA) reads camera, instruction and
proprioception. Each iteration collects ``[T, N]`` steps with the teacher acting for the first
``teacher_iterations`` iterations and the student afterwards (so the student is trained on the
states its own mistakes lead to: DAgger, Ross et al. 2011), labels every visited observation
with the teacher's deterministic action, and maximises the student's log-likelihood of those
labels on minibatches drawn from the aggregated data set (the last ``buffer_size`` labelled
observations). The "learning by cheating" recipe of Chen et al. 2019. :class:`DAgger` is the
algorithm object (``algo=distill``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

import policies
from vla_rl.algorithm import Algorithm, Experience, Setup, chunk_length
from vla_rl.checkpoint import CheckpointError, load_checkpoint
from vla_rl.config import TrainConfig, build_config
from vla_rl.ppo import ClippedUpdate, LossWeights
from vla_rl.rollout import EpisodeStats, Timer, account, valid_steps


def load_teacher(path: str | Path, obs: TensorDict, action_dim: int, device: torch.device) -> nn.Module:
    """Rebuild a trained policy from its checkpoint, for acting on observations like ``obs``.

    Raises:
        CheckpointError: The checkpoint is missing or corrupt, or its policy does not fit ``obs`` / ``action_dim``.
    """
    state = load_checkpoint(path)
    cfg = build_config(state["config"])
    try:
        teacher = policies.make_policy(cfg.policy, obs, action_dim)
        teacher.load_weights(state["policy"])
    except (KeyError, ValueError) as exc:
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
        policy: The student, with ``evaluate_actions(obs, action) -> (log_prob, entropy, value)``.
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
        log_prob, entropy, _ = policy.evaluate_actions(mb["obs"], mb["teacher_action"])
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


class DAgger(Algorithm):
    """Distillation of a privileged-state teacher into the policy on the states the policy visits."""

    name = "distill"

    def __init__(self, cfg: TrainConfig, setup: Setup) -> None:
        self.cfg = cfg.distill
        self.device = setup.device
        self.policy = setup.policy
        # ClippedUpdate serves for its optimiser and learning-rate schedule; the loss is the imitation NLL.
        self.updater = ClippedUpdate(setup.policy, self.cfg.optim, LossWeights(vf_coef=0.0, norm_adv=False))
        self.teacher = load_teacher(self.cfg.teacher, setup.first_obs, setup.action_dim, setup.device)
        self.buffer: TensorDict | None = None  # the aggregated, labelled observations

    def set_progress(self, fraction_done: float) -> float:
        """See :meth:`ClippedUpdate.set_progress`."""
        return self.updater.set_progress(fraction_done)

    def collect(self, collector: Any, stats: EpisodeStats, iteration: int, timer: Timer) -> Experience:
        """T steps driven by the teacher (first iterations) or the student, labelled by the teacher."""
        actor = self.teacher if iteration < self.cfg.teacher_iterations else self.policy
        batch = collector.collect(actor, self.cfg.rollout_steps, timer)
        account(batch, stats, None)
        chunk = chunk_length(batch["action"], batch.batch_dims)
        flat = valid_steps(batch, "obs", "action")
        start = time.perf_counter()
        flat["teacher_action"] = label(self.teacher, flat["obs"].to(self.device)).cpu()
        timer.add("infer", time.perf_counter() - start)
        # How close the acting policy's (sampled) actions were to the teacher's labels.
        metrics = {"action_agreement": action_agreement(flat["action"], flat["teacher_action"])}
        return Experience(flat.select("obs", "teacher_action").to(self.device), batch.numel() * chunk, metrics)

    def update(self, batch: TensorDict) -> dict[str, float]:
        """Aggregate ``batch`` into the data set, then imitation steps on minibatches of it."""
        cfg = self.cfg
        self.buffer = batch if self.buffer is None else torch.cat([self.buffer, batch])[-cfg.buffer_size :]
        return imitation_update(
            self.policy, self.updater.optimizer, self.buffer, cfg.updates, cfg.batch_size, cfg.optim.max_grad_norm
        )

    def state_dict(self) -> dict[str, Any]:
        """Optimiser, learning-rate scale and the aggregated data set."""
        return {"updater": self.updater.state_dict(), "buffer": None if self.buffer is None else self.buffer.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.updater.load_state_dict(state["updater"])
        buffer = state["buffer"]
        self.buffer = None if buffer is None else TensorDict.from_dict(
            buffer, batch_size=[buffer["teacher_action"].shape[0]])

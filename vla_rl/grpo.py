"""GRPO: group-relative advantages over G episodes that start from the same initial state.

No critic: each episode's return is compared with the other G - 1 episodes of its group
(Shao et al. 2024, DeepSeekMath; RLinf's embodied GRPO), the normalised difference is the
advantage of every step of that episode (:func:`rlcore.losses.group_advantages`, shared with the
LLM trainer), and the update is PPO's clipped surrogate
(:class:`vla_rl.ppo.ClippedUpdate` with ``vf_coef=0``). :class:`GRPO` is the algorithm object.

Dynamic sampling (DAPO, Yu et al. 2025; SimpleVLA-RL's accuracy filter): with ``grpo.min_group_success`` /
``max_group_success`` (e.g. 0.1 / 0.9) a group whose success rate falls outside the band is dropped from
the update (:func:`rlcore.losses.group_keep_mask`); its episodes still count as played; ``grpo/groups_dropped``
logs how many. By default the update takes whatever a collection kept, however few groups. With
``grpo.min_groups_per_update`` (DAPO's fill) the kept groups are held until that many have gathered over
successive collections; the policy does not change meanwhile, so the held episodes stay on-policy. A resumed run
collects its held groups again (they are not checkpointed: the same policy plays them, only time is lost).

Anchors (``grpo.anchor_fraction``): a task whose groups all succeed is dropped from every update, and with nothing
in the loss about its states the updates the other tasks drive move the shared network under it (measured on the
six-task suite: a drawer task never kept fell from 97.6 to 72.0 % on held-out phrasings). With a fraction of the
dropped groups' steps in the batch, weight 0 in the surrogate (``weight``), the KL toward the reference holds the
policy there too.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from rlcore.losses import group_advantages, group_keep_mask
from vla_rl.algorithm import Algorithm, Experience, Setup, chunk_length
from vla_rl.config import TrainConfig
from vla_rl.host_syncs import host_side
from vla_rl.ppo import ClippedUpdate, LossWeights
from vla_rl.rollout import EpisodeStats, Timer


def episode_batch(batch: TensorDict, advantage: torch.Tensor, keep: torch.Tensor | None = None,
                  anchors: float = 0.0, generator: torch.Generator | None = None) -> TensorDict:
    """Flatten a ``[T, N]`` episode batch to its live steps, each carrying its episode's advantage.

    Args:
        batch: Output of :func:`vla_rl.rollout.collect_episodes` with ``alive`` ``[T, N]``.
        advantage: ``[N]`` advantage of each environment's episode.
        keep: ``[N]`` bool, the episodes to keep (``None``: all).
        anchors: With ``keep``, the fraction of the other episodes' live steps (drawn with ``generator``) that join
            as anchors: advantage 0 and ``weight`` 0, where the kept steps have ``weight`` 1 (only when > 0).
        generator: The draw's generator (CPU).

    Returns:
        A flat TensorDict ``[B]`` (B = live steps of the kept episodes, then the anchors) with ``obs``, ``action``,
        ``log_prob``, ``advantage`` (and ``weight`` with anchors).
    """
    batch = batch.clone(False)
    batch["advantage"] = advantage[None].expand(batch.batch_size).clone()
    alive = batch["alive"]
    live = alive if keep is None else alive & keep.to(alive.device)[None]
    rows = live.reshape(-1).nonzero().squeeze(1)  # one read of the mask; every field then gathers by index
    fields = ["obs", "action", "log_prob", "advantage"]
    if keep is None or anchors <= 0:
        return batch.select(*fields).reshape(-1)[rows]
    batch["advantage"][:, ~keep.to(alive.device)] = 0.0
    batch["weight"] = live.to(batch["advantage"].dtype)
    dropped = (alive & ~live).reshape(-1).nonzero().squeeze(1).cpu()
    picked = dropped[torch.rand(len(dropped), generator=generator) < anchors].to(rows.device)
    return batch.select(*fields, "weight").reshape(-1)[torch.cat([rows, picked])]


class GRPO(Algorithm):
    """Group-relative policy optimisation: G episodes per initial state, no critic."""

    name = "grpo"

    def __init__(self, cfg: TrainConfig, setup: Setup) -> None:
        self.cfg = cfg.grpo
        self.seed = cfg.seed
        self.device = setup.device
        self.policy = setup.policy
        # No critic, and advantages are already normalised per group.
        self.updater = ClippedUpdate(
            setup.policy, self.cfg.optim, LossWeights(vf_coef=0.0, norm_adv=False), setup.reference
        )
        self.held: list[TensorDict] = []  # kept groups' steps awaiting the fill (min_groups_per_update)
        self.held_groups = 0

    @staticmethod
    def group_size(cfg: TrainConfig) -> int:
        """G: the environments of a group start every episode from one initial state."""
        return cfg.grpo.group_size

    def set_progress(self, fraction_done: float) -> float:
        """See :meth:`ClippedUpdate.set_progress`."""
        return self.updater.set_progress(fraction_done)

    def collect(self, collector: Any, stats: EpisodeStats, iteration: int, timer: Timer) -> Experience:
        """Every environment's next episode (the first iteration from the run's seed), with group advantages."""
        seed = self.seed if iteration == 0 else None
        limit, shape = collector.max_episode_steps, self.policy.action_shape
        decisions = None if limit is None else -(-limit // (shape[0] if len(shape) == 2 else 1))  # K steps each
        batch, returns, success = collector.collect_episodes(self.policy, seed, decisions, timer)
        cfg = self.cfg
        advantage = group_advantages(returns, cfg.group_size, cfg.std_eps)
        chunk = chunk_length(batch["action"], batch.batch_dims)
        task = batch["obs", "task"][0] if ("obs", "task") in batch.keys(True) else torch.full_like(returns, -1)
        # Each episode's figures come to the host once, together (one device read, not one per episode).
        host = torch.stack([returns, batch["alive"].sum(0).to(returns.dtype), success.to(returns.dtype),
                            task.to(returns.dtype)]).cpu()
        with host_side():
            keep = group_keep_mask(host[2] > 0.5, cfg.group_size, cfg.min_group_success, cfg.max_group_success)
            for ret, alive, succeeded, task_index in host.T.tolist():
                stats.add_episode(ret, int(alive) * chunk, succeeded > 0.5, int(task_index))
            kept = int(keep.sum()) // cfg.group_size
        groups = len(returns) // cfg.group_size
        metrics = {"grpo/groups_kept": float(kept), "grpo/groups_dropped": float(groups - kept)}
        anchors = cfg.anchor_fraction if kept else 0.0  # no group kept: no anchors (nor an update of anchors alone)
        # The anchors' draw depends on the seed and the iteration alone, so a resumed run draws the same.
        draw = torch.Generator().manual_seed(self.seed * 1_000_003 + iteration) if anchors else None
        steps = episode_batch(batch, advantage, keep, anchors, draw).to(self.device)
        if steps.get("weight", None) is not None:
            metrics["grpo/anchor_steps"] = float(len(steps) - int(steps["weight"].sum()))
        if cfg.min_groups_per_update:
            steps = self._fill(steps, kept)
            metrics["grpo/groups_held"] = float(self.held_groups)
        return Experience(steps, batch.numel() * chunk, metrics)

    def _fill(self, steps: TensorDict, kept: int) -> TensorDict:
        """Hold ``steps`` (``kept`` groups) until ``min_groups_per_update`` groups have gathered; returns all the
        held steps once they have (and holds nothing more), else an empty batch (no update this iteration)."""
        if kept:  # a collection that kept nothing adds nothing (and no anchors, so it lacks their ``weight``)
            self.held.append(steps)
            self.held_groups += kept
        if self.held_groups < self.cfg.min_groups_per_update:
            return steps[:0]
        steps = torch.cat(self.held)
        self.held, self.held_groups = [], 0
        return steps

    def update(self, batch: TensorDict) -> dict[str, float]:
        """Clipped surrogate (and auxiliary losses) over minibatch epochs; no step when dynamic sampling
        dropped every group."""
        if batch.batch_size[0] == 0:
            return {"minibatch_steps": 0.0, "early_stop": 0.0, "lr_scale": self.updater.lr_scale}
        return self.updater.update(batch)

    def state_dict(self) -> dict[str, Any]:
        """Optimiser and learning-rate scale."""
        return {"updater": self.updater.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.updater.load_state_dict(state["updater"])

"""PPO: GAE, the clipped policy-gradient update (shared with GRPO) and the algorithm object.

Read top to bottom: :func:`compute_gae` turns a [T, N] rollout into advantages and returns;
:func:`rlcore.losses.surrogate_loss` (shared with the LLM trainer) and :func:`value_loss` are the
paper's equations; :class:`ClippedUpdate`
runs minibatch epochs over a flat batch with gradient clipping, KL early stop, KL-adaptive
learning rate and linear learning-rate annealing; :class:`PPO` puts them behind the trainer's
:class:`vla_rl.algorithm.Algorithm` interface.

References: Schulman et al. 2017 (PPO), Schulman et al. 2016 (GAE); the "37 implementation
details" of PPO (Huang et al. 2022) for value clipping, per-minibatch advantage normalisation
and the ``(ratio - 1) - log(ratio)`` KL estimator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from policies.heads import ActionDistribution
from rlcore.losses import surrogate_loss
from rlcore.update_config import OptimConfig
from vla_rl.algorithm import Algorithm, Experience, Setup, chunk_length
from vla_rl.config import TrainConfig
from vla_rl.distributed import LOCAL, GradientSync
from vla_rl.rollout import EpisodeStats, RewardScaler, Timer, account, valid_steps


def per_task_normalized(advantage: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
    """``advantage`` (any shape) normalised to zero mean and unit variance within each task id of ``task`` (its shape)."""
    out = advantage.clone()
    for t in torch.unique(task):
        mask = task == t
        group = advantage[mask]
        if group.numel() > 1:
            out[mask] = (group - group.mean()) / (group.std() + 1e-8)
    return out


def compute_gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates over a rollout.

    Args:
        reward: ``[T, N]`` reward of step t.
        value: ``[T, N]`` V(s_t) of the observation acted on at step t.
        next_value: ``[T, N]`` V(s_{t+1}) of the state reached by step t; where the episode was
            truncated this is the value of its final observation (the bootstrap), where it
            terminated it is ignored.
        terminated: ``[T, N]`` bool, the episode ended in a terminal state at step t (no bootstrap).
        done: ``[T, N]`` bool, terminated or truncated at step t (the recursion restarts).
        gamma: Discount factor.
        lam: GAE lambda.

    Returns:
        ``(advantage, returns)``, both ``[T, N]``; ``returns = advantage + value``.
    """
    if not (reward.shape == value.shape == next_value.shape == terminated.shape == done.shape):
        raise ValueError(
            "compute_gae needs reward, value, next_value, terminated and done of one shape [T, N]; got "
            f"{[tuple(x.shape) for x in (reward, value, next_value, terminated, done)]}"
        )
    not_terminal = 1.0 - terminated.to(reward.dtype)
    not_done = 1.0 - done.to(reward.dtype)
    # TD error: delta_t = r_t + gamma * V(s_{t+1}) * (1 - terminal_t) - V(s_t)
    delta = reward + gamma * next_value * not_terminal - value
    advantage = torch.zeros_like(reward)
    running = torch.zeros_like(reward[0])
    for t in reversed(range(reward.shape[0])):
        # A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}
        running = delta[t] + gamma * lam * not_done[t] * running
        advantage[t] = running
    return advantage, advantage + value


def value_loss(
    value: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor, clip_coef: float | None
) -> torch.Tensor:
    """Squared error of the critic, optionally clipped around the old prediction (``[B]`` inputs)."""
    v_loss_unclipped = (value - returns) ** 2
    if clip_coef is None:
        return 0.5 * v_loss_unclipped.mean()
    v_clipped = old_value + torch.clamp(value - old_value, -clip_coef, clip_coef)
    v_loss_clipped = (v_clipped - returns) ** 2
    return 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()


def reference_kl(reference: nn.Module, obs: TensorDict, dist: ActionDistribution) -> torch.Tensor:
    """Mean KL(pi || reference) over a batch, in closed form per state (``dist`` is pi's, with gradients).

    Not the sampled estimate ``exp(d) - 1 - d`` (``d = log ref(a|s) - log pi(a|s)``, Schulman's
    "k3"): once pi's mean has moved a few of its standard deviations from a recorded action that
    the reference still rates likely, ``exp(d)`` overflows (estimates of 1e9 in suite runs from
    SFT, whose clipped gradient then held nothing but the penalty's direction).
    """
    with torch.no_grad():
        ref_dist = reference.distribution(obs)[0]
    return dist.kl(ref_dist).mean()


@dataclass
class LossWeights:
    """Terms of the total loss beyond the surrogate; GRPO sets ``vf_coef=0`` (no critic)."""

    vf_coef: float = 0.5
    clip_value: bool = False
    norm_adv: bool = True


class ClippedUpdate:
    """Minibatch epochs of the clipped policy-gradient loss, with the optimiser and LR schedule.

    The batch given to :meth:`update` is a flat TensorDict ``[B]`` with ``obs`` (a sub-TensorDict),
    ``action``, ``log_prob``, ``advantage`` and, when the critic is trained, ``value`` and ``returns``.
    With a ``reference`` policy and ``cfg.ref_kl_coef > 0`` the loss adds that weight times
    KL(pi || reference), in closed form per state. The epochs read the observations as
    ``policy.prepare_update_batch`` returns them, the reference too: a policy that keeps its perception
    frozen shares it with the reference, the checkpoint both were loaded from. With data-parallel
    ranks (``sync``) each step's gradients and statistics are averaged over them before the step, so the
    early stop, the KL-adaptive rate and the weights are the same on every rank.
    """

    def __init__(
        self, policy: nn.Module, cfg: OptimConfig, weights: LossWeights, reference: nn.Module | None = None,
        sync: GradientSync = LOCAL,
    ) -> None:
        self.policy = policy
        self.sync = sync
        self.cfg = cfg
        self.weights = weights
        self.reference = reference if cfg.ref_kl_coef > 0 else None
        for model in (policy, self.reference):  # the reference too: KL between the two tempered distributions
            if model is not None:
                model.head.temperature = cfg.rollout_temperature
        # The actor's own parameters, held still while only the critic learns (a trunk it shares included).
        self.actor_params = list(policy.actor().parameters())
        # The fused kernel does one pass over all parameters: the same update, less per-tensor overhead.
        self.params = list(policy.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr, eps=1e-5, fused=True)
        self.lr_scale = 1.0
        """Multiplier of the learning rate kept by the KL-adaptive rule."""

    def set_progress(self, fraction_done: float) -> float:
        """Set the learning rate for the iteration starting at ``fraction_done`` of the run; returns it."""
        lr = self.cfg.lr * self.lr_scale
        if self.cfg.anneal_lr:
            lr *= max(1.0 - fraction_done, 0.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def update(self, batch: TensorDict, critic_only: bool = False) -> dict[str, float]:
        """Run ``epochs x num_minibatches`` gradient steps over ``batch``; returns mean diagnostics.

        ``critic_only``: the loss is the value loss alone, and the actor's parameters (``policy.actor()``'s, a trunk
        it shares with the critic included) are not stepped: only the critic's own parameters learn.
        """
        cfg, w = self.cfg, self.weights
        size = batch.batch_size[0]
        batch = batch.clone(recurse=False).set("obs", self.policy.prepare_update_batch(batch["obs"]))
        mb_size = max(size // cfg.num_minibatches, 1)
        train_critic = w.vf_coef > 0
        # Sums stay tensors until the end: one conversion per statistic, not one per minibatch.
        totals: dict[str, torch.Tensor] = {}
        steps = 0
        stopped_early = False
        stop_kl = 1.5 * cfg.target_kl if cfg.target_kl is not None and cfg.kl_early_stop else None
        for _ in range(cfg.epochs):
            shuffled = batch[torch.randperm(size)]  # one gather per epoch; minibatches are slices of it
            for start in range(0, size - mb_size + 1, mb_size):
                mb = shuffled[start : start + mb_size]
                dist, value, aux_loss = self.policy.evaluate_terms(mb["obs"])
                log_prob, entropy = dist.log_prob(mb["action"]), dist.entropy()
                adv = mb["advantage"]
                if w.norm_adv and adv.numel() > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                weight = mb.get("weight", None)  # GRPO's anchor states: in the KL term only
                pg_loss, stats = surrogate_loss(log_prob, mb["log_prob"], adv, cfg.clip_coef, cfg.clip_coef_high, weight)
                entropy_loss = entropy.mean()
                loss = pg_loss - cfg.ent_coef * entropy_loss
                if self.reference is not None:
                    ref_kl = reference_kl(self.reference, mb["obs"], dist)
                    loss = loss + cfg.ref_kl_coef * ref_kl
                    stats["ref_kl"] = ref_kl.detach()
                if aux_loss is not None:
                    loss = loss + aux_loss
                    stats["aux_loss"] = aux_loss.detach()
                if critic_only:
                    loss = torch.zeros((), device=log_prob.device)
                if train_critic:
                    clip = cfg.clip_coef if w.clip_value else None
                    v_loss = value_loss(value, mb["value"], mb["returns"], clip)
                    loss = loss + w.vf_coef * v_loss
                    stats["value_loss"] = v_loss.detach()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                stats |= {"policy_loss": pg_loss.detach(), "entropy": entropy_loss.detach()}
                stats = self.sync.reduce_grads(self.params, stats)  # every rank's mean: one step for all
                if critic_only:
                    for param in self.actor_params:
                        param.grad = None  # Adam skips it: the value loss must not move a trunk the actor uses
                grad_norm = nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.optimizer.step()
                stats["grad_norm"] = grad_norm
                for key, val in stats.items():
                    totals[key] = totals[key] + val if key in totals else val.clone()
                steps += 1
                if stop_kl is not None and float(stats["approx_kl"]) > stop_kl:
                    stopped_early = True
                    break
            if stopped_early:
                break
        means = (torch.stack([v.float() for v in totals.values()]) / max(steps, 1)).tolist() if totals else []
        out = dict(zip(totals, means))  # one read of every statistic, not one per statistic
        if cfg.kl_adaptive_lr and cfg.target_kl is not None and not critic_only:  # a frozen actor has no KL
            # rsl_rl's rule: shrink the step when the policy moved too far, grow it when it barely moved.
            if out["approx_kl"] > 2.0 * cfg.target_kl:
                self.lr_scale = max(self.lr_scale / 1.5, 1e-3)
            elif out["approx_kl"] < 0.5 * cfg.target_kl:
                self.lr_scale = min(self.lr_scale * 1.5, 1e2)
        out["minibatch_steps"] = float(steps)
        out["early_stop"] = float(stopped_early)
        out["lr_scale"] = self.lr_scale
        return out

    def state_dict(self) -> dict:
        """Optimiser state and the KL-adaptive scale, for checkpoints."""
        return {"optimizer": self.optimizer.state_dict(), "lr_scale": self.lr_scale}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scale = float(state["lr_scale"])


class PPO(Algorithm):
    """Proximal policy optimisation: T steps of every environment per iteration, GAE, clipped updates."""

    name = "ppo"

    def __init__(self, cfg: TrainConfig, setup: Setup) -> None:
        self.cfg = cfg.ppo
        self.device = setup.device
        weights = LossWeights(vf_coef=self.cfg.vf_coef, clip_value=self.cfg.clip_value, norm_adv=self.cfg.norm_adv)
        self.updater = ClippedUpdate(setup.policy, self.cfg.optim, weights, setup.reference, setup.sync)
        self.policy = setup.policy
        self.reward_scaler = RewardScaler(setup.num_envs, self.cfg.gamma) if self.cfg.normalize_reward else None
        self.critic_only = False  # this iteration trains only the critic (warm-up after init_from)

    def set_progress(self, fraction_done: float) -> float:
        """See :meth:`ClippedUpdate.set_progress`."""
        return self.updater.set_progress(fraction_done)

    def collect(self, collector: Any, stats: EpisodeStats, iteration: int, timer: Timer) -> Experience:
        """``rollout_steps`` decisions of every environment, with advantages and returns (GAE)."""
        cfg = self.cfg
        self.critic_only = iteration < cfg.optim.critic_warmup_iterations
        batch = collector.collect(self.policy, cfg.rollout_steps, timer)
        account(batch, stats, self.reward_scaler)
        advantage, returns = compute_gae(
            batch["reward"], batch["value"], batch["next_value"], batch["terminated"], batch["done"],
            cfg.gamma, cfg.gae_lambda,
        )
        batch["advantage"], batch["returns"] = advantage, returns
        chunk = chunk_length(batch["action"], batch.batch_dims)
        flat = valid_steps(batch, "obs", "action", "log_prob", "value", "advantage", "returns")
        if cfg.task_adv_norm:
            flat["advantage"] = per_task_normalized(flat["advantage"], flat["obs"]["task"])
        return Experience(flat.to(self.device), batch.numel() * chunk)

    def update(self, batch: TensorDict) -> dict[str, float]:
        """Clipped surrogate, value and auxiliary losses over minibatch epochs (the value loss alone in warm-up)."""
        return self.updater.update(batch, critic_only=self.critic_only) | {"critic_warmup": float(self.critic_only)}

    def state_dict(self) -> dict[str, Any]:
        """Optimiser, learning-rate scale and the reward normaliser."""
        scaler = None if self.reward_scaler is None else self.reward_scaler.state_dict()
        return {"updater": self.updater.state_dict(), "reward_scaler": scaler}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.updater.load_state_dict(state["updater"])
        if self.reward_scaler is not None:
            self.reward_scaler.load_state_dict(state["reward_scaler"])

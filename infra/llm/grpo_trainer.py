"""GRPO: group-relative advantages, the PPO-clipped surrogate with a KL term, and the update step.

Group Relative Policy Optimisation (Shao et al., 2024, DeepSeekMath) samples ``G`` completions
per prompt, normalises each reward against its own group (no value network), and maximises the
clipped importance-weighted surrogate of PPO minus ``beta * KL(pi || pi_ref)`` against a frozen
reference model. The loss math (``group_advantages``, ``grpo_loss``) is :mod:`rlcore.losses` and the
config is :class:`rlcore.update_config.GRPOConfig`, both shared with the VLA trainer.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from infra.common.typed_config import ConfigError
from infra.llm.engine import left_pad
from infra.llm.lm import CausalLM, build_model, load_codec
from infra.llm.model import ModelConfig
from rlcore.losses import group_advantages, grpo_loss
from rlcore.update_config import GRPO_RANGES, GRPOConfig, OptimConfig, out_of_range, unsupported

SUPPORTED_OPTIM = {"lr", "epochs", "num_minibatches", "clip_coef", "max_grad_norm", "ref_kl_coef"}
"""The fields of :class:`~rlcore.update_config.OptimConfig` this trainer implements; ``check_grpo`` rejects the others."""


def llm_grpo_config(group_size: int = 8, **optim: Any) -> GRPOConfig:
    """The LLM trainer's defaults in the shared GRPO shape: G=8, Adam 1e-3 without annealing, one pass in two
    minibatches, gradient norm 1, KL weight 0.02 toward the warmed-up reference; ``optim`` overrides them."""
    values = {"lr": 1e-3, "anneal_lr": False, "epochs": 1, "num_minibatches": 2, "max_grad_norm": 1.0,
              "ref_kl_coef": 0.02, **optim}
    return GRPOConfig(group_size=group_size, optim=OptimConfig(**values))


def check_grpo(cfg: GRPOConfig, prefix: str = "grpo.") -> None:
    """Raise :class:`~infra.common.typed_config.ConfigError` naming the first value out of range, or a field the
    LLM trainer does not implement (``GRPOConfig`` is rlcore's, shared with the VLA trainer: its LLM checks live here)."""
    message = out_of_range(cfg, GRPO_RANGES, prefix)
    message = message or unsupported(cfg.optim, SUPPORTED_OPTIM, llm_grpo_config().optim, f"{prefix}optim.")
    if not message and (cfg.min_group_success, cfg.max_group_success, cfg.min_groups_per_update,
                        cfg.anchor_fraction) != (0.0, 1.0, 0, 0.0):
        message = (f"{prefix}min_group_success/max_group_success/min_groups_per_update/anchor_fraction (dynamic "
                   "sampling) are not implemented by this trainer; leave them at 0, 1, 0 and 0")
    if message:
        raise ConfigError(message)


def completion_tensors(completions: list[list[int]], eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad completions with EOS to ``[B, C]``; mask True up to and including the first EOS."""
    width = max(len(c) for c in completions)
    tokens = torch.full((len(completions), width), eos_id, dtype=torch.long)
    mask = torch.zeros(len(completions), width, dtype=torch.bool)
    for i, c in enumerate(completions):
        tokens[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[i, : len(c)] = True
    return tokens, mask


class GRPOTrainer:
    """One policy, its frozen reference and its optimiser; ``update`` runs GRPO on a rollout batch."""

    def __init__(self, model: CausalLM, cfg: GRPOConfig, *, pad_id: int, eos_id: int, seed: int = 0) -> None:
        self.model = model
        self.ref = copy.deepcopy(model).eval().requires_grad_(False)
        self.cfg = cfg
        self.pad_id, self.eos_id = pad_id, eos_id
        self.opt = torch.optim.Adam(model.parameters(), lr=cfg.optim.lr)
        self.gen = torch.Generator().manual_seed(seed)
        self.version = 0

    @classmethod
    def from_config(cls, model_cfg: ModelConfig, cfg: GRPOConfig, *, seed: int) -> GRPOTrainer:
        """A trainer over the model of ``model_cfg`` (loaded from its folder, or initialised from ``seed``);
        pad and EOS ids come from the model's tokenizer."""
        codec = load_codec(model_cfg)
        return cls(build_model(model_cfg, seed), cfg, pad_id=codec.pad_id, eos_id=codec.eos_id, seed=seed)

    def update(self, prompts: list[list[int]], completions: list[list[int]], rewards: list[float]) -> dict[str, float]:
        """One GRPO update on ``P * G`` samples ordered prompt-major (the G samples of a prompt adjacent)."""
        n, group_size, optim = len(prompts), self.cfg.group_size, self.cfg.optim
        if not (n == len(completions) == len(rewards)) or n % group_size:
            raise ValueError(
                f"got {len(prompts)} prompts, {len(completions)} completions, {len(rewards)} rewards with "
                f"grpo.group_size={group_size}; all three must have the same length, a multiple of group_size."
            )
        p_tok, p_mask, c_tok, c_mask = self._tensors(prompts, completions)
        adv = group_advantages(torch.tensor(rewards, dtype=torch.float32, device=p_tok.device), group_size, self.cfg.std_eps)
        with torch.no_grad():
            old_logp = self.model.logprobs(p_tok, p_mask, c_tok)
            ref_logp = self.ref.logprobs(p_tok, p_mask, c_tok)
        stats: dict[str, float] = {}
        mb = max(1, n // optim.num_minibatches)
        for _ in range(optim.epochs):
            order = torch.randperm(n, generator=self.gen)
            for start in range(0, n, mb):
                idx = order[start : start + mb].to(p_tok.device)
                logp = self.model.logprobs(p_tok[idx], p_mask[idx], c_tok[idx])
                loss, stats = grpo_loss(
                    logp, old_logp[idx], ref_logp[idx], adv[idx], c_mask[idx], optim.clip_coef, optim.ref_kl_coef
                )
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), optim.max_grad_norm)
                self.opt.step()
        self.version += 1
        return stats

    def supervised_step(self, prompts: list[list[int]], answers: list[list[int]]) -> float:
        """One cross-entropy step on ``answers`` (EOS included) given ``prompts``: the format warm-up."""
        p_tok, p_mask, c_tok, c_mask = self._tensors(prompts, answers)
        logp = self.model.logprobs(p_tok, p_mask, c_tok)
        loss = -(logp * c_mask).sum() / c_mask.sum()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()

    def _tensors(self, prompts: list[list[int]], completions: list[list[int]]) -> tuple[torch.Tensor, ...]:
        """Left-padded prompts, their mask, EOS-padded completions and their mask, on the policy's device
        (the trainer service moves the policy to its device for each slice)."""
        device = next(self.model.parameters()).device
        p_tok, p_mask = left_pad(prompts, self.pad_id, device)
        c_tok, c_mask = completion_tensors(completions, self.eos_id)
        return p_tok, p_mask, c_tok.to(device), c_mask.to(device)

    def sync_reference(self) -> None:
        """Make the reference equal to the current policy and restart the optimiser (after the warm-up)."""
        self.ref.load_state_dict(self.model.state_dict())
        self.opt = torch.optim.Adam(self.model.parameters(), lr=self.cfg.optim.lr)

    def to(self, device: torch.device | str) -> GRPOTrainer:
        """Move policy, reference and optimiser state to ``device`` (in place)."""
        self.model.to(device)
        self.ref.to(device)
        for state in self.opt.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and k != "step":
                    state[k] = v.to(device)
        return self

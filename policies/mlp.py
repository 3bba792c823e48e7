"""State-observation MLP actor-critic, for the simulator's state tasks and any gymnasium Box task.

The policy concatenates the flat float observation keys named in ``obs_keys`` (default
``("state",)``). Gymnasium Box tasks: the trainer puts the flat observation under ``state``, so
the default works unchanged; the suite's state tasks use ``("proprio", "state")``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from tensordict import TensorDictBase

from policies.base import (
    ACTIVATIONS,
    Activation,
    ActorCritic,
    ObsSpec,
    build_mlp,
    require_key,
    spec_shapes,
    value_layer,
)
from policies.heads import HEAD_RANGES, ActionHeadConfig, make_head
from policies.normalization import RunningNorm
from rlcore.update_config import AT_LEAST_1, NON_NEGATIVE, Range, check_choice, out_of_range


@dataclass
class MLPPolicyConfig:
    """Configuration of :class:`MLPActorCritic`."""

    RANGES: ClassVar[dict[str, Range]] = {
        "hidden_sizes": AT_LEAST_1, "obs_clip": NON_NEGATIVE, **{f"head.{k}": r for k, r in HEAD_RANGES.items()},
    }
    """Valid range of every numeric field (dotted keys reach the head); not a field: no config sets it."""

    obs_keys: tuple[str, ...] = ("state",)
    """Flat float observation keys, concatenated in this order (gymnasium Box tasks: ``state``)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the hidden layers of each trunk (CleanRL's PPO uses 64, 64)."""
    activation: Activation = "tanh"
    """Hidden activation: ``tanh``, ``elu``, ``relu`` or ``gelu``."""
    shared_trunk: bool = False
    """One trunk for actor and critic (``True``) or two separate trunks (``False``, CleanRL's choice)."""
    head: ActionHeadConfig = field(default_factory=ActionHeadConfig)
    """Action head: Gaussian or binned, with optional action chunks."""
    normalize_obs: bool = True
    """Normalise observations with running mean/variance (statistics checkpoint with the model)."""
    obs_clip: float = 10.0
    """Clip normalised observations to ``[-obs_clip, obs_clip]`` (0 disables clipping)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field and the fix: no observation key, an unknown
        activation or head, or a number outside :attr:`RANGES`. Run by the policy it builds."""
        if not self.obs_keys:
            raise ValueError("obs_keys is empty; name at least one observation key, e.g. [state]")
        check_choice("activation", self.activation, ACTIVATIONS)
        self.head.validate("head.")
        message = out_of_range(self, self.RANGES)
        if message:
            raise ValueError(message)


class MLPActorCritic(ActorCritic):
    """Gaussian (or binned) MLP actor-critic with orthogonal init over flat observations.

    Args:
        cfg: the policy configuration.
        obs_spec: feature shapes per observation key (or a sample observation TensorDict).
        action_dim: A, the number of action dimensions.
    """

    def __init__(self, cfg: MLPPolicyConfig, obs_spec: ObsSpec, action_dim: int) -> None:
        super().__init__()
        cfg.validate()
        shapes = spec_shapes(obs_spec)
        self.obs_keys = tuple(cfg.obs_keys)
        self.actor_input_names = self.obs_keys
        obs_dim = sum(require_key(shapes, k, 1, "MLPActorCritic")[0] for k in self.obs_keys)
        hidden = tuple(cfg.hidden_sizes)
        out = hidden[-1] if hidden else obs_dim
        self.normalizer = RunningNorm(obs_dim, clip=cfg.obs_clip) if cfg.normalize_obs else None
        self.actor_trunk = build_mlp(obs_dim, hidden, cfg.activation)
        self.critic_trunk = None if cfg.shared_trunk else build_mlp(obs_dim, hidden, cfg.activation)
        self.head = make_head(cfg.head, out, action_dim)
        self.value_head = value_layer(out)

    actor_module_names = ("normalizer", "actor_trunk", "head")

    def flat_obs(self, obs: TensorDictBase) -> torch.Tensor:
        """The raw (unnormalised) concatenated observation ``[N, obs_dim]``."""
        return self._concat(*self.actor_inputs(obs))

    @staticmethod
    def _concat(*inputs: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.float() for x in inputs], dim=-1)

    def _normalized(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalizer(x) if self.normalizer is not None else x

    def actor_features(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Actor trunk output ``[N, hidden]`` from the ``obs_keys`` tensors ``[N, D_k]``, in order."""
        return self.actor_trunk(self._normalized(self._concat(*inputs)))

    def features(self, obs: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._normalized(self.flat_obs(obs))
        actor = self.actor_trunk(x)
        critic = actor if self.critic_trunk is None else self.critic_trunk(x)
        return actor, critic

    @property
    def critic_obs_keys(self) -> tuple[str, ...]:
        """The critic reads the ``obs_keys``, as the actor does."""
        return self.obs_keys

    def critic_features(self, obs: TensorDictBase) -> torch.Tensor:
        x = self._normalized(self.flat_obs(obs))
        return self.actor_trunk(x) if self.critic_trunk is None else self.critic_trunk(x)

    def update_normalization(self, obs: TensorDictBase) -> None:
        if self.normalizer is not None:
            self.normalizer.update(self.flat_obs(obs))

"""Action heads: a feature vector in, a distribution over (chunks of) actions out.

Two heads share one interface (:class:`ActionHead` returning an :class:`ActionDistribution`):

- :class:`GaussianHead`: a diagonal Gaussian whose mean is a linear map of the features and
  whose log standard deviation is a learnable parameter independent of the state (as in
  CleanRL's and rsl_rl's PPO). Samples are not squashed; the environment clips to ``[-1, 1]``.
- :class:`BinnedHead`: OpenVLA-style action tokens. Each action dimension is discretised into
  ``bins`` uniform bins over ``[-1, 1]``; the head predicts one categorical per dimension and
  an action is the bin centre, so every action it emits is inside ``[-1, 1]``.

With ``chunk > 1`` a head predicts ``K = chunk`` future actions per decision: actions are
``[N, K, A]`` instead of ``[N, A]``. Log-probabilities and entropies are summed over the
chunk and action dimensions, so they are always ``[N]``.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import nn
from torch.distributions import Categorical

from rlcore.update_config import AT_LEAST_1, Range, check_choice, out_of_range

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class ActionDistribution(Protocol):
    """What a head returns; every method's result has the batch shape ``[N]`` or the action shape."""

    def sample(self) -> torch.Tensor:
        """Draw an action ``[N, A]`` or ``[N, K, A]``."""
        ...

    def mode(self) -> torch.Tensor:
        """The most likely action (deterministic evaluation)."""
        ...

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """Joint log-probability ``[N]`` of ``action``."""
        ...

    def entropy(self) -> torch.Tensor:
        """Joint entropy ``[N]``."""
        ...

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        """``KL(self || other)`` ``[N]`` in closed form (``other`` of the same kind and shape)."""
        ...


def _action_shape(chunk: int, action_dim: int) -> tuple[int, ...]:
    return (action_dim,) if chunk == 1 else (chunk, action_dim)


def _check_action(action: torch.Tensor, batch: int, shape: tuple[int, ...]) -> None:
    if tuple(action.shape) != (batch, *shape):
        raise ValueError(
            f"action has shape {tuple(action.shape)}, expected {(batch, *shape)} "
            f"([N, A] without chunking, [N, K, A] with chunk K > 1). Pass the `action` that act() returned."
        )


class GaussianActions:
    """Diagonal Gaussian over ``[N, *action_shape]``; joint log-prob and entropy summed per sample.

    Closed-form log-prob and entropy rather than ``torch.distributions.Normal``: the same values
    without its per-call argument checks, which cost more than the maths in small-MLP updates.
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor) -> None:
        self.mean = mean
        self.log_std = log_std.expand_as(mean)
        self.reduce_dims = tuple(range(1, mean.dim()))

    def sample(self) -> torch.Tensor:
        with torch.no_grad():
            return torch.normal(self.mean, self.log_std.exp())

    def mode(self) -> torch.Tensor:
        return self.mean

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        _check_action(action, self.mean.shape[0], tuple(self.mean.shape[1:]))
        z = (action - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.square() - self.log_std - _HALF_LOG_2PI).sum(self.reduce_dims)

    def entropy(self) -> torch.Tensor:
        return (0.5 + _HALF_LOG_2PI + self.log_std).sum(self.reduce_dims)

    def kl(self, other: GaussianActions) -> torch.Tensor:
        log_ratio = self.log_std - other.log_std
        z = (self.mean - other.mean) * torch.exp(-other.log_std)
        return (0.5 * (torch.exp(2.0 * log_ratio) + z.square() - 1.0) - log_ratio).sum(self.reduce_dims)


class BinnedActions:
    """Independent categoricals per action dimension over uniform bins of ``[-1, 1]``.

    ``logits`` is ``[N, *action_shape, bins]``. Actions are bin centres
    ``-1 + 2 * i / (bins - 1)``; :meth:`log_prob` maps an action back to its nearest bin.
    """

    def __init__(self, logits: torch.Tensor) -> None:
        self.bins = logits.shape[-1]
        self.categorical = Categorical(logits=logits)
        self.action_shape = tuple(logits.shape[1:-1])
        self.reduce_dims = tuple(range(1, logits.dim() - 1))

    def to_action(self, index: torch.Tensor) -> torch.Tensor:
        """Bin index (int64) -> bin centre in ``[-1, 1]`` (float32)."""
        return index.to(torch.float32) * (2.0 / (self.bins - 1)) - 1.0

    def to_index(self, action: torch.Tensor) -> torch.Tensor:
        """Action in ``[-1, 1]`` -> nearest bin index (values outside are clamped to the end bins)."""
        scaled = (action.clamp(-1.0, 1.0) + 1.0) * ((self.bins - 1) / 2.0)
        return scaled.round().long()

    def sample(self) -> torch.Tensor:
        return self.to_action(self.categorical.sample())

    def mode(self) -> torch.Tensor:
        return self.to_action(self.categorical.probs.argmax(dim=-1))

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        _check_action(action, self.categorical.logits.shape[0], self.action_shape)
        return self.categorical.log_prob(self.to_index(action)).sum(self.reduce_dims)

    def entropy(self) -> torch.Tensor:
        return self.categorical.entropy().sum(self.reduce_dims)

    def kl(self, other: BinnedActions) -> torch.Tensor:
        p, log_p, log_q = self.categorical.probs, self.categorical.logits, other.categorical.logits
        return (p * (log_p - log_q)).sum(-1).sum(self.reduce_dims)


class ActionHead(nn.Module):
    """Base class: ``head(features [N, F]) -> ActionDistribution``.

    ``temperature`` T (1 unless an RL algorithm sets it, ``*.optim.rollout_temperature``) widens or narrows the
    distribution without moving its mode: the Gaussian's standard deviation times T, the binned head's logits
    divided by T. A plain attribute, not a weight: checkpoints and a policy rebuilt from one hold T=1.
    """

    action_shape: tuple[int, ...]
    temperature: float = 1.0

    def forward(self, features: torch.Tensor) -> ActionDistribution:  # pragma: no cover - interface
        raise NotImplementedError


class GaussianHead(ActionHead):
    """Linear mean (orthogonal init, gain 0.01) and a state-independent learnable log-std.

    Args:
        in_features: feature width F.
        action_dim: A.
        chunk: K future actions per decision (``1`` = no chunking).
        init_log_std: initial log standard deviation of every action dimension.
    """

    def __init__(self, in_features: int, action_dim: int, chunk: int = 1, init_log_std: float = 0.0) -> None:
        super().__init__()
        self.action_shape = _action_shape(chunk, action_dim)
        self.mean = nn.Linear(in_features, chunk * action_dim)
        nn.init.orthogonal_(self.mean.weight, gain=0.01)
        nn.init.zeros_(self.mean.bias)
        self.log_std = nn.Parameter(torch.full(self.action_shape, float(init_log_std)))

    def forward(self, features: torch.Tensor) -> GaussianActions:
        mean = self.mean(features).view(features.shape[0], *self.action_shape)
        log_std = self.log_std if self.temperature == 1.0 else self.log_std + math.log(self.temperature)
        return GaussianActions(mean, log_std)


class BinnedHead(ActionHead):
    """One categorical over ``bins`` per action dimension (and chunk step), OpenVLA-style.

    Args:
        in_features: feature width F.
        action_dim: A.
        chunk: K future actions per decision (``1`` = no chunking).
        bins: bins per dimension over ``[-1, 1]``; odd counts include ``0`` exactly.
    """

    def __init__(self, in_features: int, action_dim: int, chunk: int = 1, bins: int = 21) -> None:
        super().__init__()
        if bins < 2:
            raise ValueError(f"bins={bins}: a discretised head needs at least 2 bins per dimension (try 21).")
        self.bins = bins
        self.action_shape = _action_shape(chunk, action_dim)
        self.logits = nn.Linear(in_features, chunk * action_dim * bins)
        nn.init.orthogonal_(self.logits.weight, gain=0.01)
        nn.init.zeros_(self.logits.bias)

    def forward(self, features: torch.Tensor) -> BinnedActions:
        logits = self.logits(features).view(features.shape[0], *self.action_shape, self.bins)
        return BinnedActions(logits if self.temperature == 1.0 else logits / self.temperature)


HeadKind = Literal["gaussian", "binned"]
"""Names of the action heads."""
HEAD_KINDS: tuple[str, ...] = typing.get_args(HeadKind)


@dataclass
class ActionHeadConfig:
    """Configuration of the action head shared by every policy."""

    kind: HeadKind = "gaussian"
    """``gaussian`` (state-independent learnable log-std) or ``binned`` (OpenVLA-style categorical per dimension)."""
    chunk: int = 1
    """K future actions per decision; ``action`` is ``[N, K, A]`` when K > 1, ``[N, A]`` when K = 1."""
    bins: int = 21
    """Bins per action dimension over ``[-1, 1]`` for the ``binned`` head (odd: 0 is a bin centre)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the ``gaussian`` head."""

    def validate(self, prefix: str = "") -> None:
        """Raise ``ValueError`` naming the first bad field (``prefix``: where the head sits, e.g. ``head.``):
        an unknown kind or a number outside :data:`HEAD_RANGES`."""
        check_choice(f"{prefix}kind", self.kind, HEAD_KINDS)
        message = out_of_range(self, HEAD_RANGES, prefix)
        if message:
            raise ValueError(message)


HEAD_RANGES: dict[str, Range] = {"chunk": AT_LEAST_1, "bins": Range(2), "init_log_std": Range()}
"""Valid range of every numeric field of :class:`ActionHeadConfig` (``init_log_std``: any finite number)."""


def make_head(cfg: ActionHeadConfig, in_features: int, action_dim: int) -> ActionHead:
    """Build the action head ``cfg`` describes on features of width ``in_features``.

    Raises:
        ValueError: ``cfg`` refuses one of its fields (:meth:`ActionHeadConfig.validate`).
    """
    cfg.validate()
    if cfg.kind == "gaussian":
        return GaussianHead(in_features, action_dim, cfg.chunk, cfg.init_log_std)
    return BinnedHead(in_features, action_dim, cfg.chunk, cfg.bins)

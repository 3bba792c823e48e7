"""The settings of the clipped policy-gradient update and of GRPO, one shape for both trainers.

The VLA trainer (``vla_rl``: ``ppo.optim``, ``grpo``) and the LLM trainer (``infra.llm``: the RLVR
job's ``grpo``) read the same dataclasses and check them against the same ranges; each trainer
keeps its own defaults by building them with different values, and rejects a field it does not
implement by name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Range:
    """Valid values of a numeric field: from ``low`` (excluded when ``low_open``) to ``high``; ``None``: unbounded."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def contains(self, value: float) -> bool:
        """Whether ``value`` is a finite number inside the range."""
        if not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        return above and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        if self.low is None:
            return "must be a finite number"
        if self.high is None:
            return f"must be {'greater than' if self.low_open else 'at least'} {self.low}"
        return f"must be in {'(' if self.low_open else '['}{self.low}, {self.high}]"


AT_LEAST_1, NON_NEGATIVE, POSITIVE, FRACTION = Range(1), Range(0), Range(0, low_open=True), Range(0, 1)


@dataclass
class OptimConfig:
    """The clipped policy-gradient update shared by PPO and GRPO."""

    lr: float = 3e-4
    """Adam learning rate at the start of training."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over the run."""
    epochs: int = 4
    """Passes over each batch of experience."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    clip_coef: float = 0.2
    """PPO ratio clip range epsilon: the ratio is clipped to [1 - eps, 1 + eps] (above 1: ``clip_coef_high``)."""
    clip_coef_high: float | None = None
    """Upper clip epsilon (DAPO's clip-higher, e.g. 0.28 with ``clip_coef`` 0.2): the ratio is clipped to
    [1 - clip_coef, 1 + clip_coef_high]. ``None``: ``clip_coef``, the symmetric clip."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """The approximate KL per update the epochs aim at: past 1.5 x this in a minibatch the epochs stop
    (``kl_early_stop``), and ``kl_adaptive_lr`` steers the learning rate toward it (``None``: neither)."""
    kl_adaptive_lr: bool = False
    """Scale the learning rate by 1.5 up or down to keep the KL near ``target_kl`` (needs ``target_kl``)."""
    kl_early_stop: bool = True
    """With ``target_kl``: stop the epochs when a minibatch's KL passes 1.5 x ``target_kl``. False: the KL only
    steers the learning rate (``kl_adaptive_lr``, rsl_rl's rule) and every epoch runs."""
    ref_kl_coef: float = 0.0
    """Weight of a KL penalty toward a frozen reference policy (the VLA: the policy ``init_from`` loaded;
    the LLM: the policy after its format warm-up), k3 estimator ``exp(d) - 1 - d``; 0: none."""
    rollout_temperature: float = 1.0
    """Temperature T of the RL policy's action distribution: the binned head's logits are divided by T, the
    Gaussian head's standard deviation multiplied by T, when collecting and in the update's ratios, entropy
    and reference KL (the ratios are of the distribution that drew the actions). Evaluation takes the mode,
    which T leaves unchanged. 1: the policy as it is."""
    critic_warmup_iterations: int = 0
    """First iterations that train only the critic (value loss), the actor frozen: a critic fitted to
    a pretrained policy before its first policy-gradient step (PPO; needs ``init_from``)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field outside its range (:data:`OPTIM_RANGES`); a trainer's
        own limits (fields it does not implement, ``kl_adaptive_lr`` without ``target_kl``) are its own checks."""
        _raise_out_of_range(self, OPTIM_RANGES)


@dataclass
class GRPOConfig:
    """Group Relative Policy Optimisation: G samples (episodes, completions) from one start, no critic."""

    group_size: int = 8
    """Samples G per initial state or prompt."""
    std_eps: float = 1e-6
    """Added to the group's return standard deviation before dividing."""
    min_group_success: float = 0.0
    """Dynamic sampling (DAPO): a group whose success rate is below this is dropped from the update (its
    episodes still count as played); with ``max_group_success``, e.g. 0.1 and 0.9. 0: none dropped."""
    max_group_success: float = 1.0
    """Dynamic sampling: a group whose success rate is above this is dropped from the update. 1: none dropped."""
    min_groups_per_update: int = 0
    """Dynamic sampling's fill (DAPO samples until its batch is full of kept groups): kept groups are held over
    successive collections until at least this many have gathered, and the update then takes all of them. No
    update happens in between, so every held episode comes from the policy being updated. 0: each collection's
    kept groups are updated on at once, however few."""
    anchor_fraction: float = 0.0
    """Anchors for the groups dynamic sampling drops: this fraction of their steps (drawn per collection from the
    run's seed) joins the update with no weight in the surrogate, so only the KL toward the reference
    (``optim.ref_kl_coef`` > 0) reads them. A task whose groups all succeed is otherwise absent from every update, and
    nothing holds it while the updates other tasks drive move the shared network. 0: none (the update reads the kept
    groups alone)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The clipped update's settings."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field outside its range (:data:`GRPO_RANGES`: G >= 2,
        ``std_eps`` > 0, the update's settings), a band of group success rates that keeps nothing, or anchors
        without a KL term to read them."""
        _raise_out_of_range(self, GRPO_RANGES)
        if self.min_group_success > self.max_group_success:
            raise ValueError(f"min_group_success={self.min_group_success} is above max_group_success="
                             f"{self.max_group_success}: no group would be kept; use e.g. 0.1 and 0.9")
        if self.anchor_fraction > 0 and self.optim.ref_kl_coef <= 0:
            raise ValueError(f"anchor_fraction={self.anchor_fraction} needs optim.ref_kl_coef > 0 (only the KL "
                             "toward the reference reads the anchors), e.g. 0.05")


OPTIM_RANGES: dict[str, Range] = {
    "lr": Range(0, 1, low_open=True), "epochs": AT_LEAST_1, "num_minibatches": AT_LEAST_1,
    "clip_coef": Range(0, 1, low_open=True), "clip_coef_high": Range(0, 1, low_open=True),
    "rollout_temperature": Range(0, 10, low_open=True), "ent_coef": NON_NEGATIVE, "max_grad_norm": POSITIVE,
    "target_kl": POSITIVE, "ref_kl_coef": NON_NEGATIVE, "critic_warmup_iterations": NON_NEGATIVE,
}
"""Valid range of every numeric field of :class:`OptimConfig`."""
GRPO_RANGES: dict[str, Range] = {
    "group_size": Range(2), "std_eps": POSITIVE, "min_group_success": FRACTION, "max_group_success": FRACTION,
    "min_groups_per_update": NON_NEGATIVE, "anchor_fraction": FRACTION,
    **{f"optim.{k}": r for k, r in OPTIM_RANGES.items()},
}
"""Valid range of every numeric field of :class:`GRPOConfig` (dotted keys)."""


DEFAULT_RANGE = NON_NEGATIVE
"""The range of a number no entry of ``ranges`` names: finite and >= 0. A count, a size, a rate, a time or a
coefficient is never negative nor NaN; a field that may be negative says so with its own entry."""


def _numbers(section: Any, key: str = "") -> Any:
    """``(dotted key, where, value)`` of every number of a dataclass ``section`` and its nested sections;
    ``where`` indexes tuple elements (``hidden_sizes[1]``). Booleans, strings and mappings are skipped."""
    for f in dataclasses.fields(section):
        path, value = f"{key}{f.name}", getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            yield from _numbers(value, path + ".")
        elif isinstance(value, tuple):
            yield from ((path, f"{path}[{i}]", v) for i, v in enumerate(value) if _is_number(v))
        elif _is_number(value):
            yield path, path, value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def out_of_range(section: Any, ranges: dict[str, Range], prefix: str = "") -> str | None:
    """The message for the first number of ``section`` outside its range, or ``None``.

    Every number of the dataclass ``section`` is checked, nested sections and tuple elements included: against
    its dotted key's entry in ``ranges``, else against :data:`DEFAULT_RANGE` (finite, >= 0), so a field added
    later is covered without an entry. ``None`` values (optional fields left unset) are not checked.
    """
    for key, where, value in _numbers(section):
        valid = ranges.get(key, DEFAULT_RANGE)
        if not valid.contains(value):
            return f"{prefix}{where}={value!r} {valid}"
    return None


def check_choice(key: str, value: str, valid: Iterable[str]) -> None:
    """Raise ``ValueError`` (``key=value is unknown; valid choices: ...``) when a config's ``value`` is not in ``valid``:
    the check a ``Literal`` field gets when a typed config is read, for a config built by hand."""
    valid = tuple(valid)
    if value not in valid:
        raise ValueError(f"{key}={value!r} is unknown; valid choices: {', '.join(valid)}")


def _raise_out_of_range(section: Any, ranges: dict[str, Range]) -> None:
    message = out_of_range(section, ranges)
    if message:
        raise ValueError(message)


def unsupported(optim: OptimConfig, supported: set[str], default: OptimConfig, prefix: str) -> str | None:
    """The message for the first field of ``optim`` outside ``supported`` that differs from the trainer's
    ``default`` (a trainer that does not implement it would ignore it silently), or ``None``."""
    for name in OptimConfig.__dataclass_fields__:
        if name not in supported and getattr(optim, name) != getattr(default, name):
            return (f"{prefix}{name}={getattr(optim, name)!r} is not implemented by this trainer; "
                    f"leave it at {getattr(default, name)!r} (it supports {', '.join(sorted(supported))})")
    return None

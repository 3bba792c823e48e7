"""Policies by name: ``load(name, obs_spec, action_dim, **overrides)`` and ``make_policy(cfg, ...)``."""

from __future__ import annotations

import dataclasses
from typing import Any

from policies.base import ActorCritic, ObsSpec
from policies.mlp import MLPActorCritic, MLPPolicyConfig
from policies.vla import VLAConfig, VLAPolicy

POLICIES: dict[str, tuple[type, type[ActorCritic]]] = {
    "mlp": (MLPPolicyConfig, MLPActorCritic),
    "vla": (VLAConfig, VLAPolicy),
}
"""Policy name -> (config dataclass, policy class)."""
MODELS: dict[str, type] = {name: config for name, (config, _) in POLICIES.items()}
"""Policy name -> config dataclass (what the trainer's ``policy.name`` chooses)."""


def _entry(name: str) -> tuple[type, type[ActorCritic]]:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; valid choices: {', '.join(sorted(POLICIES))}.")
    return POLICIES[name]


def config_class(name: str) -> type:
    """The config dataclass of the policy called ``name``."""
    return _entry(name)[0]


def make_policy(cfg: Any, obs_spec: ObsSpec, action_dim: int) -> ActorCritic:
    """Build the policy whose config dataclass ``cfg`` is (e.g. a ``VLAConfig`` builds a ``VLAPolicy``)."""
    for config_type, policy_type in POLICIES.values():
        if type(cfg) is config_type:
            return policy_type(cfg, obs_spec, action_dim)
    valid = ", ".join(f"{c.__name__} ({n})" for n, (c, _) in sorted(POLICIES.items()))
    raise TypeError(f"make_policy got a {type(cfg).__name__}; pass one of the policy configs: {valid}.")


def parameter_count(cfg: Any, obs_spec: ObsSpec, action_dim: int) -> int:
    """Parameters of the policy :func:`make_policy` would build, counted on torch's meta device: no memory is
    allocated, so sizes read from a config or a checkpoint can be checked before the real build."""
    import torch

    with torch.device("meta"):
        return sum(p.numel() for p in make_policy(cfg, obs_spec, action_dim).parameters())


def load(name: str, obs_spec: ObsSpec, action_dim: int, **overrides: Any) -> ActorCritic:
    """Build the policy called ``name`` from its default config with ``overrides`` applied."""
    config_type = config_class(name)
    fields = {f.name for f in dataclasses.fields(config_type)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"unknown {config_type.__name__} field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(fields))}."
        )
    return make_policy(config_type(**overrides), obs_spec, action_dim)

"""The ``policy`` section: its dataclass is the named model's own (``policies.MODELS``)."""

from __future__ import annotations

from typing import Any

from infra.common.typed_config import ConfigError, from_dict

DEFAULT_POLICY = "vla"
"""The model of a config whose ``policy`` section names none."""


def _policy_models() -> dict[str, type]:
    """The registry of policy configs (imported lazily: config parsing must not build networks)."""
    import policies

    return dict(policies.MODELS)


def policy_from_dict(data: dict[str, Any] | None, path: str = "policy") -> Any:
    """Build the policy's own config dataclass from ``{"name": ..., <its fields>}``."""
    models = _policy_models()
    data = dict(data or {})
    name = data.pop("name", DEFAULT_POLICY)
    if name not in models:
        raise ConfigError(f"{path}.name={name!r} is not a known model; valid: {', '.join(sorted(models))}")
    cfg = from_dict(models[name], data, path)
    return cfg


def _policy_name(policy_cfg: Any) -> str:
    for name, cls in _policy_models().items():
        if type(policy_cfg) is cls:
            return name
    raise ConfigError(f"policy config of type {type(policy_cfg).__name__} is not in policies.MODELS")

"""Typed dataclass configs from nested dicts and ``key=value`` overrides.

The one loader behind every config of the project: the training job's ``vla_rl.config.TrainConfig``
and the LLM jobs' ``infra.llm.rlvr.RLVRConfig``. A dataclass holds the defaults; a nested dict
(read from YAML, or a config saved with a run) and ``key=value`` arguments (dotted paths, values
read as YAML scalars) name what differs. Every key is checked against the dataclass fields where it
enters and every value against the field's annotation, and a mistake raises :class:`ConfigError`
naming the valid choices.

Validation has one shape across the project: a config dataclass checks its own values in a
``validate(self) -> None`` method that raises :class:`ConfigError` with one line naming the key,
the value and the fix, and calls its sections' ``validate``. It reads no file, device or module
(what depends on the machine is checked where the job starts), so :func:`from_dict` runs it on
every dataclass it builds: a config read from YAML or overrides is checked where it enters. The
packages that cannot import this module (sims, policies, rlcore) raise ``ValueError`` from their
configs' ``validate`` with a message that starts with the field (``lr=-1 must be ...``);
:func:`validate_section` makes that a :class:`ConfigError` naming the section (``ppo.optim.lr=-1 ...``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

import yaml

from infra.common.errors import ConfigError
from infra.common.limits import short


def coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert lists and ints where lossless.

    Raises:
        ConfigError: ``value`` does not fit ``tp`` (the message names the key ``path``).
    """
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError("; ".join(errors))
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}={short(value)} is not a valid choice; valid: {', '.join(map(str, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}={short(value)} must be a list, e.g. {path}=[a,b]")
        item = args[0] if args else Any
        return tuple(coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:  # a free-form section, validated by whoever reads it (e.g. a nested job's overrides)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{path} must be a mapping with string keys, got {short(value)}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a mapping of {tp.__name__} fields, got {short(value)}")
        return from_dict(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}={short(value)} must be true or false")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}={short(value)} must be a number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise ConfigError(f"{path}={short(value)} must be an integer")
        return int(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}={short(value)} must be a string")
        return value
    raise ConfigError(f"{path}: unsupported field type {tp!r}")


def from_dict(cls: type, data: dict[str, Any], path: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and ill-typed values.

    Args:
        cls: A dataclass type whose fields carry type annotations.
        data: Field values; missing fields keep the dataclass defaults.
        path: Dotted prefix used in error messages.

    Raises:
        ConfigError: An unknown key (the message lists the valid keys), a value of the wrong type, or a
            value the dataclass's own ``validate()`` refuses.
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = f" in section '{path}'" if path else ""
        raise ConfigError(f"unknown config key(s) {unknown}{where}; valid keys: {', '.join(names)}")
    cfg = cls(**{name: coerce(value, hints[name], f"{path}.{name}" if path else name) for name, value in data.items()})
    if callable(getattr(cfg, "validate", None)):
        validate_section(cfg, path)
    return cfg


def validate_section(cfg: Any, path: str = "") -> None:
    """Run ``cfg.validate()``; a plain ``ValueError`` (from a package that cannot import :class:`ConfigError`)
    becomes a :class:`ConfigError` whose message starts with the section's dotted ``path``.

    Raises:
        ConfigError: ``cfg`` refuses one of its values.
    """
    try:
        cfg.validate()
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{path}.{exc}" if path else str(exc)) from None


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn ``["ppo.optim.lr=1e-3", "env.task=reach"]`` into a nested dict (values parsed as YAML).

    Raises:
        ConfigError: An argument without ``=``, or a key that is both a value and a section.
    """
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {arg!r} must look like key=value, e.g. seed=1 or section.key=value")
        _set_dotted(out, key.strip(), _parse_scalar(raw))
    return out


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` laid over it, section by section (neither is modified)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(cfg: Any, overrides: list[str]) -> Any:
    """A new dataclass like ``cfg`` with ``key=value`` overrides applied (dotted keys reach nested sections).

    Raises:
        ConfigError: A malformed override, an unknown key or an ill-typed value.
    """
    return from_dict(type(cfg), merge(dataclasses.asdict(cfg), parse_overrides(overrides)))


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


class _NoAliasLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses aliases (``*name``): a few lines of nested aliases expand into
    gigabytes (a "billion laughs"), and no config of this project needs them."""

    where = "YAML"

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(f"{self.where}: YAML alias *{str(event.anchor)[:40]} at line {event.start_mark.line + 1} "
                              "is not read (aliases can expand a small file into gigabytes): write the value out")
        return super().compose_node(parent, index)


def load_yaml(text: str, where: str) -> Any:
    """``text`` read as YAML (safe types only, aliases refused with :class:`ConfigError` naming ``where``).

    Raises:
        ConfigError: an alias, or text that is not YAML.
    """
    loader = _NoAliasLoader(text)
    loader.where = where
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {short(str(exc), 300)}") from None
    finally:
        loader.dispose()


def _parse_scalar(raw: str) -> Any:
    """YAML's reading of one value, with ``1e-3``-style floats (YAML 1.1 wants a dot) fixed."""
    value = load_yaml(raw, f"override value {short(raw)}") if raw else ""
    if isinstance(value, str):
        try:
            return float(value) if any(c in value.lower() for c in "e.") else value
        except ValueError:
            return value
    return value

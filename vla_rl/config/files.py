"""Configs as files: YAML loading with ``key=value`` overrides, building, writing back as dicts, comparing."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import sims
from infra.common.typed_config import ConfigError, from_dict, load_yaml, merge, parse_overrides
from vla_rl.config.env import FLAT_FRAME_KEYS, TrainEnvConfig, check_flat_keys
from vla_rl.config.policy import _policy_name, policy_from_dict
from vla_rl.config.train import TrainConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


INPUT_PATH_KEYS = ("init_from", "sft.dataset", "distill.teacher")
"""Config keys naming files a run reads; inside ``out_dir`` (a recipe's demos/ and sft/), they move with it."""


def run_relative(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a nested dict, as in ``config.yaml``) with each of :data:`INPUT_PATH_KEYS` that lies inside its
    ``out_dir`` written as ``<out_dir>/REST``: two configs of one run directory, before and after it was moved,
    then compare equal."""
    out = copy.deepcopy(config)
    root = Path(config.get("out_dir") or ".").absolute()
    for key in INPUT_PATH_KEYS:
        *sections, leaf = key.split(".")
        node = out
        for part in sections:
            node = node.get(part) or {}
        value = node.get(leaf)
        if value and Path(value).absolute().is_relative_to(root):
            node[leaf] = f"<out_dir>/{Path(value).absolute().relative_to(root).as_posix()}"
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config (tuples become lists), the form written to ``config.yaml``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
            if f.name == "policy":
                value = {"name": _policy_name(cfg.policy), **value}
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict; a missing or malformed file raises :class:`ConfigError`."""
    path = Path(path)
    if not path.is_file():
        known = sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"config file {path} not found; configs shipped in {CONFIG_DIR}: {', '.join(known)}")
    data = load_yaml(path.read_text(), f"config file {path}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Load ``path`` (default ``configs/default.yaml``), apply ``key=value`` overrides, validate.

    Raises:
        ConfigError: Unknown keys, wrong types, an unknown model or task, or inconsistent settings.
    """
    data = read_yaml(path or CONFIG_DIR / "default.yaml")
    data = merge(data, parse_overrides(overrides or []))
    return build_config(data)


def build_config(data: dict[str, Any]) -> TrainConfig:
    """Build a nested dict (as in ``config.yaml``) into a :class:`TrainConfig`, validated (:meth:`TrainConfig.validate`;
    what depends on the machine is :meth:`TrainConfig.check`'s, where the job starts)."""
    data = dict(data)
    check_flat_keys(data.get("env") or {})
    # The policy's dataclass depends on its ``name``: built first, so that TrainConfig.validate sees it.
    data["policy"] = policy_from_dict(data.pop("policy", None))
    return from_dict(TrainConfig, data)


_OLD_NAMES = {"max_episode_steps": "max_steps"}
"""Keys of the ``env`` section before the suite's settings nested whose field in the suite's config had another name."""


def upgrade_saved(data: dict[str, Any]) -> dict[str, Any]:
    """A config saved with a checkpoint (``config.yaml``, a checkpoint's ``config``) in today's form: an ``env`` section
    written before the frame settings nested under ``env.frames`` has them moved there (:func:`_nest_frames`), and one
    written before the suite's own settings nested under ``env.suite`` has those moved there (those other than the
    suite config's defaults; the other suites' settings, which that section held at their defaults, dropped). A
    YAML file or override in an old form is refused instead (:func:`check_flat_keys`, naming the new key).
    """
    env = _nest_frames(dict(data.get("env") or {}))
    known = {f.name for f in dataclasses.fields(TrainEnvConfig)}
    old = {k: env.pop(k) for k in list(env) if k not in known}
    if not old:
        return {**data, "env": env} if "env" in data else data
    sims_env = env.get("kind", TrainEnvConfig.kind) == "sims"
    if sims_env and env.get("max_episode_steps") is not None:  # the old section's name of a suite's episode limit
        old[_OLD_NAMES["max_episode_steps"]] = env.pop("max_episode_steps")
    if sims_env:
        config = sims.suite_of(env.get("task", TrainEnvConfig.task)).config
        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        own = set(sims.suite_settings(config))
        env["suite"] = {**{k: v for k, v in old.items() if k in own and v not in (defaults[k], {})}, **env.get("suite", {})}
    return {**data, "env": env}


def _nest_frames(env: dict[str, Any]) -> dict[str, Any]:
    """A saved ``env`` section with its flat frame settings (:data:`FLAT_FRAME_KEYS`: ``render`` on/off, the square
    ``image_size``, ``cameras``, ``depth``) written as ``frames`` (``None`` where ``render`` was off)."""
    flat = {k: env.pop(k) for k in FLAT_FRAME_KEYS if k in env}
    if not flat or "frames" in env:
        return env
    if flat.get("render", True) is False:
        return {**env, "frames": None}
    size = {"width": flat["image_size"], "height": flat["image_size"]} if "image_size" in flat else {}
    return {**env, "frames": {**size, **{k: flat[k] for k in ("cameras", "depth") if k in flat}}}


def diff_configs(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config dicts."""
    keys = sorted(set(a) | set(b))
    out = []
    for key in keys:
        path = f"{prefix}{key}"
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(diff_configs(va, vb, path + "."))
        elif va != vb:
            out.append(path)
    return out

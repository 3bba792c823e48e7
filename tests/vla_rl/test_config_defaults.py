"""One source of defaults: a YAML under configs/ names only what differs from the dataclasses
(training configs) or from its base config (the recipe's stage sections)."""

import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest

import sims
from infra.common.typed_config import merge
from vla_rl.config import (
    CONFIG_DIR,
    DEFAULT_POLICY,
    TrainConfig,
    TrainEnvConfig,
    _policy_models,
    read_yaml,
    to_dict,
)
from vla_rl.envs import sims_env_config
from vla_rl.recipe import RecipeConfig

_TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainConfig)}
_RECIPE_KEYS = {f.name for f in dataclasses.fields(RecipeConfig)}
TRAINING = sorted(p.name for p in CONFIG_DIR.glob("*.yaml") if set(read_yaml(p)) <= _TRAIN_KEYS)
RECIPES = sorted(p.name for p in CONFIG_DIR.glob("*.yaml")
                 if set(read_yaml(p)) <= _RECIPE_KEYS and not set(read_yaml(p)) <= _TRAIN_KEYS)


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


def repeated_defaults(data: dict, defaults: dict, prefix: str = "") -> list[str]:
    """Dotted ``key=value`` of every leaf of ``data`` equal to the same path in ``defaults``."""
    out = []
    for key, value in data.items():
        if key not in defaults:
            continue
        default = defaults[key]
        if isinstance(value, dict) and isinstance(default, dict):
            out += repeated_defaults(value, default, f"{prefix}{key}.")
        elif _plain(value) == _plain(default):
            out.append(f"{prefix}{key}={value!r}")
    return out


def train_defaults(policy_name: str | None) -> dict:
    """The dataclass defaults as a config dict, with the named policy's own defaults."""
    out = to_dict(TrainConfig())
    out["policy"] = {"name": DEFAULT_POLICY, **to_dict(_policy_models()[policy_name or DEFAULT_POLICY]())}
    return out


def test_the_check_finds_a_repeated_default():
    data = {"env": {"num_envs": to_dict(TrainConfig())["env"]["num_envs"] + 1, "frames": {"width": 64}}, "algo": "ppo"}
    assert repeated_defaults(data, train_defaults(None)) == ["env.frames.width=64", "algo='ppo'"]


def test_the_yaml_lists_cover_every_config():
    names = {p.name for p in CONFIG_DIR.glob("*.yaml")} - {"language_dev.yaml"}  # templates, not a config
    assert names == set(TRAINING) | set(RECIPES)


@pytest.mark.parametrize("name", TRAINING)
def test_training_yaml_names_only_what_differs(name):
    data = read_yaml(CONFIG_DIR / name)
    repeats = repeated_defaults(data, train_defaults(data.get("policy", {}).get("name")))
    assert not repeats, f"configs/{name} repeats dataclass defaults: {repeats}; delete them from the YAML"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_yaml_names_only_what_differs(name):
    data = read_yaml(CONFIG_DIR / name)
    repeats = repeated_defaults({k: v for k, v in data.items() if k not in ("sft", "rl")}, to_dict(RecipeConfig()))
    base_name = data.get("base", RecipeConfig.base)
    base = read_yaml(Path(base_name) if Path(base_name).is_file() else CONFIG_DIR / base_name)
    stage_defaults = merge(train_defaults(base.get("policy", {}).get("name")), base)
    for stage in ("sft", "rl"):
        repeats += repeated_defaults(data.get(stage, {}), stage_defaults, f"{stage}.")
    assert not repeats, f"configs/{name} repeats what its defaults or base already say: {repeats}"


def test_the_env_section_takes_the_simulators_defaults():
    """``env`` holds the settings every suite reads (``sims.shared_settings()``) with sims.VecEnvConfig's defaults,
    the frames as a sims.RenderConfig (``frames``) with its defaults, and the suite's own settings nested under
    ``suite`` (empty: its config class's defaults); no suite's own field or frame field is declared in the section,
    and no name means one thing here and another in the suite's config."""
    section, sim, frames = TrainEnvConfig(), sims.EnvConfig(task="reach"), sims.RenderConfig()
    top = {f.name for f in dataclasses.fields(TrainEnvConfig)}
    own = set(vars(TrainEnvConfig)["__annotations__"])
    assert issubclass(TrainEnvConfig, sims.SharedSettings) and not own & set(sims.shared_settings())  # declared in sims
    vec = {f.name for f in dataclasses.fields(sims.VecEnvConfig)}
    assert top & vec == set(sims.shared_settings())  # the frames are the suite's render, named frames here
    assert not top & {f.name for f in dataclasses.fields(sims.RenderConfig)}  # each frame setting under frames
    for suite in sims.suites():
        assert not top & set(sims.suite_settings(suite.config)), suite.name
    for name in sims.shared_settings():
        assert getattr(section, name) == getattr(sim, name), f"env.{name} has a default of its own"
    assert section.frames == frames
    built = sims_env_config(replace(section, frames=None), num_envs=section.num_envs, seed=sim.seed)
    assert built == sim  # the default section builds the default simulator, field for field
    rendered = sims_env_config(section, num_envs=section.num_envs, seed=0)
    assert rendered.render == frames and rendered.task_weights is None


def test_the_env_section_builds_what_it_names():
    section = TrainEnvConfig(task="suite", num_envs=8, backend="warp", warp_device="cpu", success_bonus=1.5,
                             terminate_on_success=False,
                             frames=sims.RenderConfig(width=32, height=32, cameras=("front", "wrist")),
                             suite={"reward": "progress", "task_weights": {"push": 3.0}, "max_delta": 0.02})
    built = sims_env_config(section, num_envs=4, seed=7, split="validation", group_size=2, env_offset=4, num_threads=1)
    assert (built.task, built.num_envs, built.seed, built.split, built.group_size, built.env_offset) == (
        "suite", 4, 7, "validation", 2, 4)
    assert (built.backend, built.warp_device, built.reward, built.success_bonus, built.terminate_on_success) == (
        "warp", "cpu", "progress", 1.5, False)
    assert (built.render.height, built.render.cameras, built.render.num_contexts) == (32, ("front", "wrist"), 1)
    assert (built.task_weights, built.max_delta) == ({"push": 3.0}, 0.02)

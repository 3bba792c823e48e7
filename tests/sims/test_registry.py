"""The suite registry: every registered suite meets the contract, and a third suite plugs in with one
registration (tests/sims/example_suite.py) and trains with the trainer unchanged."""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields

import numpy as np
import pytest

import sims
from infra.common.typed_config import ConfigError
from sims.registry import unregister
from tests.sims.example_suite import SUITE as POINT
from vla_rl.config import CONFIG_DIR, TrainEnvConfig, load_config
from vla_rl.trainer import Trainer


@pytest.fixture
def point():
    sims.register(POINT)
    yield POINT
    unregister(POINT.name)


def test_each_task_name_has_one_suite():
    assert [s.name for s in sims.suites()][:2] == ["gantry", "libero"]
    assert sims.suite_of("suite").name == "gantry" and sims.suite_of("push").name == "gantry"
    assert sims.suite_of("libero_goal/3").name == "libero"
    with pytest.raises(ValueError, match=r"^unknown task 'pointt'; valid: reach, .*suite, libero_<suite>"):
        sims.suite_of("pointt")
    for suite in (*sims.suites(), POINT):  # every entry's config carries the shared settings, declared once
        assert issubclass(suite.config, sims.VecEnvConfig) and "validation" in suite.splits
        assert not declared_twice(suite.config), suite.name


def declared_twice(cls: type) -> list[str]:
    """The fields of dataclass ``cls`` that more than one class of its MRO declares (annotates)."""
    names = [name for klass in cls.__mro__ for name in vars(klass).get("__annotations__", {})]
    return sorted({name for name in names if names.count(name) > 1})


def test_the_trainers_env_section_declares_no_field_twice():
    """The trainer's env section over sims' classes: the shared settings declared in sims.SharedSettings, the frames
    in sims.RenderConfig (nested as ``frames``, typed as each suite's config types its ``render``), and no name of
    the section also a frame setting or a suite config's field other than a shared one (one meaning per name)."""
    assert not declared_twice(TrainEnvConfig) and issubclass(TrainEnvConfig, sims.SharedSettings)
    section = {f.name for f in fields(TrainEnvConfig)}
    assert not section & {f.name for f in fields(sims.RenderConfig)}
    frames_type = typing.get_type_hints(TrainEnvConfig)["frames"]
    for suite in (*sims.suites(), POINT):
        assert section & {f.name for f in fields(suite.config)} == set(sims.shared_settings()), suite.name
        assert typing.get_type_hints(suite.config)["render"] == frames_type, suite.name


def test_the_check_finds_a_field_declared_twice():
    @dataclass(frozen=True)
    class Redeclared(sims.VecEnvConfig):
        num_envs: int = 8

    assert declared_twice(Redeclared) == ["num_envs"]


def test_a_registered_suite_runs_through_the_shared_vector_env(point):
    env = sims.make_vec_env("point", 4, seed=3)
    obs = env.reset_arrays(seed=3)
    expert = point.expert(env)
    succeeded = np.zeros(4, bool)
    for _ in range(10):
        out = env.step_arrays(expert.act(obs))
        succeeded |= out["success"]
        obs = out["observation"]
    assert succeeded.all()  # the greedy expert reaches every goal within 10 steps of speed 0.2 on [-1, 1]^2
    snapshot = env.get_state()
    again = sims.make_vec_env("point", 4, seed=3)
    again.set_state(snapshot)
    action = np.full((4, 2), 0.5, np.float32)
    a, b = env.step_arrays(action), again.step_arrays(action)
    assert all(np.array_equal(a["observation"][k], b["observation"][k]) for k in a["observation"])
    with pytest.raises(ValueError, match="does not fit this env's"):
        sims.make_vec_env("point", 2).set_state(snapshot)


def test_a_third_suite_trains_for_one_iteration(point, tmp_path):
    cfg = load_config(CONFIG_DIR / "reach_state_ppo.yaml", [
        f"out_dir={tmp_path}", "name=point", "env.task=point", "env.num_envs=4", "ppo.rollout_steps=8",
        "total_env_steps=32", "ppo.optim.num_minibatches=2", "ppo.optim.epochs=1", "eval.every=1",
        "eval.episodes=4", "eval.num_envs=4", "log.wandb=disabled", "log.progress=false", "log.video=false",
        "env.suite.speed=0.3", "env.suite.max_steps=8",  # the suite's own settings, which no trainer line names
    ])
    trainer = Trainer(cfg)
    assert type(trainer.collector.env).__name__ == "PointVectorEnv"
    assert (trainer.collector.env.config.speed, trainer.collector.env.max_episode_steps) == (0.3, 8)
    summary = trainer.train()
    trainer.close()
    assert summary["env_steps"] == 32 and trainer.iteration == 1
    assert 0.0 <= trainer.log.rows[-1]["eval/validation/success"] <= 1.0
    with pytest.raises(ConfigError, match=r"^env.frames: the point suite renders no frames; set env.frames=null$"):
        load_config(CONFIG_DIR / "default.yaml", ["env.task=point"])
    with pytest.raises(ConfigError, match=r"^env.speed is a suite's own setting \(point\): write env.suite.speed=0.3 "):
        load_config(CONFIG_DIR / "reach_state_ppo.yaml", ["env.task=point", "env.speed=0.3"])
    with pytest.raises(ConfigError, match=r"^env.suite.speed='fast' must be a number$"):
        load_config(CONFIG_DIR / "reach_state_ppo.yaml", ["env.task=point", "env.suite.speed=fast"])

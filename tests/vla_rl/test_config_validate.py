"""One validation style: every config dataclass of a training job or recipe checks its own values in
``validate()``, which ``typed_config.from_dict`` runs where the section enters; what depends on the machine
is ``TrainConfig.check``'s, where the job starts."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from infra.common.runlog import LogConfig
from infra.common.typed_config import ConfigError, from_dict
from vla_rl import recipe
from vla_rl.config import (
    CONFIG_DIR,
    DistillConfig,
    EvalConfig,
    PPOConfig,
    SFTConfig,
    TrainConfig,
    TrainEnvConfig,
    load_config,
    policy_from_dict,
)
from vla_rl.fleet.section import FleetConfig
from vla_rl.recipe import DemoSettings, RecipeConfig

SUBSECTIONS = {"optim", "grpo", "cluster", "shard", "inference", "trainer", "server", "sync"}
"""Sections whose keys are named from the section that holds them (``ppo.optim.lr``, ``fleet.shard.node``):
rlcore's ``OptimConfig``/``GRPOConfig`` (their ``validate`` raises a plain ValueError, which ``from_dict``
prefixes with the section's path: rlcore imports nothing of infra) and the fleet's parts."""

# (section class, its key in the job's config, a bad value of it, the key the error must name)
BAD = [
    (TrainEnvConfig, "env", {"num_envs": 0}, "env.num_envs=0"),
    (TrainEnvConfig, "env", {"task": "reachh"}, "env.task='reachh'"),
    (TrainEnvConfig, "env", {"frames": {"cameras": ["top"]}}, "env.frames.cameras"),
    (PPOConfig, "ppo", {"gamma": 2}, "ppo.gamma=2.0"),
    (DistillConfig, "distill", {"batch_size": 0}, "distill.batch_size=0"),
    (SFTConfig, "sft", {"token_dropout": 0.95}, "sft.token_dropout=0.95"),
    (EvalConfig, "eval", {"splits": ["test"]}, "eval.splits"),
    (LogConfig, "log", {"wandb_project": ""}, "log.wandb_project"),
    (FleetConfig, "fleet", {"shards": 0}, "fleet.shards=0"),
    (FleetConfig, "fleet", {"mode": "colocated", "shard": {"node": "node7"}}, "fleet.shard.node='node7'"),
    (DemoSettings, "demos", {"episodes": 0}, "demos.episodes=0"),
    (recipe.TestSettings, "test", {"splits": ["validation"]}, "test.splits"),
]


def _sections(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


def test_every_section_of_a_job_and_a_recipe_has_its_own_validate():
    for top in (TrainConfig, RecipeConfig):
        assert "validate" in vars(top), top.__name__
        for name, cls in _sections(top).items():
            assert name in SUBSECTIONS or callable(getattr(cls, "validate", None)), f"{top.__name__}.{name}"
    for name, cls in _sections(FleetConfig).items():  # the fleet's parts: FleetConfig.validate checks them
        assert name in SUBSECTIONS and not hasattr(cls, "validate"), name


@pytest.mark.parametrize(("cls", "key", "bad", "named"), BAD, ids=[f"{k}-{n}" for _, k, _, n in BAD])
def test_every_section_built_from_a_dict_runs_its_validate_and_names_the_key(cls, key, bad, named):
    with pytest.raises(ConfigError, match="^" + re.escape(named)):
        from_dict(cls, bad)  # the section alone
    top = RecipeConfig if key in ("demos", "test") else TrainConfig
    with pytest.raises(ConfigError, match="^" + re.escape(named)):
        # Within the whole config (no policy given: TrainConfig.validate would refuse that): the section is
        # refused where it enters, before its parent's validate runs.
        from_dict(top, {key: bad})


def test_the_job_config_checks_sections_together_and_needs_its_policy():
    policy = policy_from_dict({"name": "mlp"})
    with pytest.raises(ConfigError, match=r"^env\.num_envs=12 must be a multiple of grpo\.group_size=8"):
        from_dict(TrainConfig, {"algo": "grpo", "env": {"num_envs": 12}, "policy": policy})
    with pytest.raises(ConfigError, match=r"^grpo\.group_size=1 must be at least 2"):  # rlcore's section: checked here
        from_dict(TrainConfig, {"algo": "grpo", "grpo": {"group_size": 1}, "policy": policy})
    with pytest.raises(ConfigError, match=r"^ppo\.optim\.lr=0\.0 must be in \(0, 1\]"):
        from_dict(TrainConfig, {"ppo": {"optim": {"lr": 0}}, "policy": policy})
    with pytest.raises(ConfigError, match=r"^optim\.lr=0\.0 must be in \(0, 1\]"):  # alone: named from the section
        from_dict(PPOConfig, {"optim": {"lr": 0}})
    with pytest.raises(ConfigError, match=r"^policy\.hidden_sizes\[0\]=0 must be at least 1"):
        from_dict(TrainConfig, {"policy": policy_from_dict({"name": "mlp", "hidden_sizes": [0]})})
    with pytest.raises(ConfigError, match=r"^policy=None is not a policy config; build the config with"):
        from_dict(TrainConfig, {})
    with pytest.raises(ConfigError, match=r"^stages=\['rl'\]; use \[sft, rl\]"):
        from_dict(RecipeConfig, {"stages": ["rl"]})


def test_a_section_made_in_code_is_checked_by_the_job_config():
    cfg = load_config(None, [])
    cfg.validate()
    bad = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, suite={"reward": "sparse"}))  # dataclasses don't validate
    with pytest.raises(ConfigError, match=r"^env\.suite\.reward='sparse'; valid rewards"):
        bad.validate()


def test_validate_reads_no_file_and_check_reads_them_before_anything_exists(tmp_path):
    missing = tmp_path / "nothing"
    cfg = load_config(CONFIG_DIR / "reach_state_ppo.yaml", [f"out_dir={tmp_path / 'runs'}", f"init_from={missing}"])
    cfg.validate()  # the checkpoint's existence is the machine's, not the config's
    with pytest.raises(ConfigError, match=r"^init_from=.*nothing' does not exist"):
        cfg.check()
    assert list(tmp_path.iterdir()) == []

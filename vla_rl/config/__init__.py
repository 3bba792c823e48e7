"""Typed run configuration: dataclasses, YAML loading and ``key=value`` overrides.

One source of defaults: the dataclasses below (the ``env`` section's shared simulator settings are
:class:`sims.SharedSettings`' fields, which it inherits; its ``suite`` mapping, the suite's own, its config class's). A YAML file under ``configs/`` only names what
differs from them, and ``key=value`` arguments (dotted paths, values parsed as YAML scalars) are
applied on top. Every key is checked against the dataclass fields where it enters, and an unknown
key, task, algorithm or model raises :class:`ConfigError` naming the valid choices.

Each section checks its own values in its ``validate()``, which ``from_dict`` runs as it builds it;
:meth:`TrainConfig.validate` adds what ties sections together. Neither reads a file, the machine or
gymnasium's registry: :meth:`TrainConfig.check` does, where a job starts, before anything is built.

Each component receives only its own section: the environment factory gets :class:`TrainEnvConfig`,
PPO gets :class:`PPOConfig`, the policy factory gets the policy's own dataclass from ``policies``.
Reading and checking dicts and overrides is :mod:`infra.common.typed_config`'s, shared with the LLM jobs.

By what it configures: :mod:`vla_rl.config.env` (the ``env`` section against its suite), :mod:`vla_rl.config.sections`
(PPO, distillation, SFT, evaluation), :mod:`vla_rl.config.policy` (the ``policy`` section), :mod:`vla_rl.config.ranges`
(every number's range), :mod:`vla_rl.config.train` (the whole job and its cross-section and machine checks) and
:mod:`vla_rl.config.files` (YAML, overrides, dicts). This package re-exports their public names.
"""

from infra.common.typed_config import ConfigError, merge, parse_overrides
from vla_rl.config.env import (
    GYM_SPLITS,
    TrainEnvConfig,
    check_flat_keys,
    check_task_weights,
    env_splits,
    env_suite,
    suite_config,
)
from vla_rl.config.files import (
    CONFIG_DIR,
    INPUT_PATH_KEYS,
    build_config,
    diff_configs,
    load_config,
    read_yaml,
    run_relative,
    to_dict,
)
from vla_rl.config.policy import DEFAULT_POLICY, _policy_models, policy_from_dict
from vla_rl.config.ranges import RANGES
from vla_rl.config.sections import DistillConfig, EvalConfig, PPOConfig, SFTConfig
from vla_rl.config.train import RESUMABLE_KEYS, SIMS_FLAT_KEYS, TrainConfig, algo_optim

__all__ = [
    "CONFIG_DIR", "DEFAULT_POLICY", "GYM_SPLITS", "INPUT_PATH_KEYS", "RANGES", "RESUMABLE_KEYS",
    "SIMS_FLAT_KEYS", "ConfigError", "DistillConfig", "EvalConfig", "PPOConfig", "SFTConfig",
    "TrainConfig", "TrainEnvConfig", "_policy_models", "algo_optim", "build_config", "check_flat_keys", "check_task_weights",
    "diff_configs", "env_splits", "env_suite", "load_config", "merge", "parse_overrides",
    "policy_from_dict", "read_yaml", "run_relative", "suite_config", "to_dict",
]

"""Valid ranges of the run config's numbers, and the checks that read them."""

from __future__ import annotations

from typing import Any

from infra.common.typed_config import ConfigError
from rlcore.update_config import (
    AT_LEAST_1,
    FRACTION,
    GRPO_RANGES,
    NON_NEGATIVE,
    OPTIM_RANGES,
    Range,
    out_of_range,
)
from vla_rl.fleet.section import FLEET_RANGES

RANGES: dict[str, Range] = {
    "seed": Range(0, 2**31 - 1), "total_env_steps": AT_LEAST_1, "stop_success": FRACTION,
    "checkpoint_every": AT_LEAST_1, "torch_threads": AT_LEAST_1, "init_log_std": Range(-10, 2),
    "env.num_envs": AT_LEAST_1, "env.max_episode_steps": AT_LEAST_1,
    "env.success_bonus": Range(0, 100),
    "ppo.rollout_steps": AT_LEAST_1, "ppo.gamma": FRACTION, "ppo.gae_lambda": FRACTION, "ppo.vf_coef": NON_NEGATIVE,
    **{f"grpo.{key}": r for key, r in GRPO_RANGES.items() if not key.startswith("optim.")},
    "distill.rollout_steps": AT_LEAST_1, "distill.teacher_iterations": NON_NEGATIVE,
    "distill.buffer_size": AT_LEAST_1, "distill.updates": AT_LEAST_1, "distill.batch_size": AT_LEAST_1,
    "sft.iterations": AT_LEAST_1, "sft.updates": AT_LEAST_1, "sft.batch_size": AT_LEAST_1,
    "sft.template_mix": Range(0, 4), "sft.instruction_noise": Range(0, 2),
    "sft.token_dropout": Range(0, 0.9),
    "sft.image_shift": Range(0, 32),
    **{f"{algo}.optim.{key}": r for algo in ("ppo", "grpo", "distill", "sft") for key, r in OPTIM_RANGES.items()},
    "eval.every": NON_NEGATIVE, "eval.episodes": AT_LEAST_1, "eval.num_envs": AT_LEAST_1,
    "log.video_every": AT_LEAST_1, **{f"fleet.{key}": r for key, r in FLEET_RANGES.items()},
}
"""Valid range of every numeric field of :class:`TrainConfig` (the policy's: its config's ``RANGES``);
``None`` values (optional fields left unset) are not checked. Tuples are checked element by element, and a
number no entry names must be finite and >= 0 (``rlcore.update_config.DEFAULT_RANGE``)."""



def _check_numbers(section: Any, prefix: str) -> None:
    """Raise :class:`ConfigError` naming the first number of ``section`` (the config's ``prefix`` section, e.g.
    ``env.``) outside its range in :data:`RANGES`."""
    _check_ranges(section, {k.removeprefix(prefix): r for k, r in RANGES.items() if k.startswith(prefix)}, prefix)


def _check_ranges(section: Any, ranges: dict[str, Range], prefix: str = "") -> None:
    """Raise :class:`ConfigError` naming the first field of ``section`` (dotted keys of ``ranges``) out of its range."""
    message = out_of_range(section, ranges, prefix)
    if message:
        raise ConfigError(message)

"""The ``env`` section: which environment to train on, the settings every suite reads, and the suite's own
settings nested under ``env.suite`` (built and checked by the suite's config class, ``sims.suite_of(task).config``)."""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import sims
from infra.common.typed_config import ConfigError, coerce
from sims.registry import task_forms
from vla_rl.config.ranges import _check_numbers

GYM_SPLITS = ("train", "validation")
"""Splits of a gymnasium env (one stream of episodes, evaluated as ``train`` and ``validation``)."""


@dataclass(frozen=True)
class TrainEnvConfig(sims.SharedSettings):
    """The ``env`` section: which environment to train on and how many copies to step at once.

    A ``sims`` environment is its suite's config (``sims.suite_of(task).config``, over :class:`sims.VecEnvConfig`):
    the settings every suite reads are this section's, inherited from :class:`sims.SharedSettings` with their
    defaults (``sims.shared_settings()``: task, num_envs, backend, warp_device, terminate_on_success,
    success_bonus), the suite's own are the mapping ``suite`` (``sims.suite_settings``), and :func:`suite_config`
    builds the two into one. The other fields are the trainer's: ``kind``, the frames it asks for and the gymnasium
    settings. With ``kind=gym``, ``task`` is a gymnasium id (e.g. ``HalfCheetah-v5``) and ``num_envs`` its number of
    copies; the other shared settings are the simulators' only. Frozen like the suite configs it shares its fields
    with (a changed copy: ``dataclasses.replace``).
    """

    kind: Literal["sims", "gym"] = "sims"
    """``sims``: the project's batched MuJoCo tasks; ``gym``: any gymnasium environment id."""
    frames: sims.RenderConfig | None = field(default_factory=sims.RenderConfig)
    """The camera frames in the observation (``sims`` only; the VLA, the default policy, reads them), a
    :class:`sims.RenderConfig` whose fields are this section's keys (``env.frames.cameras=[front,wrist]``,
    ``env.frames.width=128``, ...; unnamed ones keep its defaults); ``null`` (``env.frames=null``): state only.
    The VLA's ``policy.image_size`` must equal the frames' width and height; ``num_contexts=None`` is one GL
    context per thread each env is given."""
    suite: dict[str, Any] = field(default_factory=dict)
    """The suite's own settings (``sims`` only), fields of its config class, e.g. ``{reward: progress, task_weights:
    {push: 3}}`` for the gantry tasks (:class:`sims.EnvConfig`) or ``{controller: osc, starts: regions}`` for
    LIBERO (:class:`sims.libero.vec_env.LiberoEnvConfig`); unnamed ones keep that class's defaults. Overrides:
    ``env.suite.controller=osc``."""
    vectorization: Literal["sync", "async"] = "sync"
    """Gymnasium vectorisation (``gym`` only): one process, or one subprocess per environment."""
    max_episode_steps: int | None = None
    """Gymnasium episode length limit (``gym`` only); ``None`` keeps the environment's own. A ``sims`` suite's limit,
    where it has one, is its own setting under ``suite``."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad value: the numbers, and for ``sims`` the suite's config
        built from this section (:func:`suite_config`) and the frames against the suite's cameras and depth. A
        gymnasium id is looked up by :meth:`TrainConfig.check` (gymnasium's registry)."""
        # Not SharedSettings.validate: the suite's config runs it below (its messages named as env.KEY), and a
        # gymnasium env reads no backend or bonus.
        _check_numbers(self, "env.")
        if self.kind == "sims":
            if self.max_episode_steps is not None:
                raise ConfigError(f"env.max_episode_steps={self.max_episode_steps} limits gymnasium episodes; a sims "
                                  f"suite's own settings go under env.suite ({_settings_hint(env_suite(self))})")
            _check_against_suite(self, env_suite(self))
            suite_config(self)
        elif self.suite:
            raise ConfigError(f"env.suite={self.suite} sets a sims suite's own settings; env.kind={self.kind!r} has "
                              "none: remove it")


def env_suite(env: TrainEnvConfig) -> sims.Suite:
    """The registered suite of a ``sims`` env section's task (``sims.suite_of``).

    Raises:
        ConfigError: no suite claims ``env.task``, listing every suite's task names.
    """
    try:
        return sims.suite_of(env.task)
    except ValueError:
        raise ConfigError(f"env.task={env.task!r} is not a sims task; valid: {', '.join(task_forms())}") from None


def _check_against_suite(env: TrainEnvConfig, suite: sims.Suite) -> None:
    """A ``sims`` env's backend and Warp device, and its frames, against what its suite runs on and renders."""
    if env.backend not in suite.backends:
        raise ConfigError(f"env.backend={env.backend!r} is not a sims backend; valid: {', '.join(suite.backends)} "
                          f"({suite.name} tasks)")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", env.warp_device):
        raise ConfigError(f"env.warp_device={env.warp_device!r}; valid: auto, cpu, cuda, cuda:N")
    if env.frames is None:
        return
    if not suite.cameras:
        raise ConfigError(f"env.frames: the {suite.name} suite renders no frames; set env.frames=null")
    try:
        env.frames.validate(suite.cameras)
    except ValueError as exc:
        raise ConfigError(f"env.frames.{exc}") from None
    if env.frames.depth and not suite.depth:
        raise ConfigError(f"env.frames.depth=true: the {suite.name} suite renders RGB frames only; set "
                          "env.frames.depth=false")


def _settings_hint(suite: sims.Suite) -> str:
    """The suite's own settings, as an error message lists them."""
    own = sims.suite_settings(suite.config)
    return f"the {suite.name} suite's: {', '.join(own)}" if own else f"the {suite.name} suite has none"


def suite_config(env: TrainEnvConfig, **per_env: Any) -> sims.VecEnvConfig:
    """The config of ``env``'s suite (``sims.suite_of(env.task).config``): the section's shared settings
    (``sims.shared_settings()``), its ``suite`` mapping (typed by the suite config's fields) and ``per_env``
    (``num_envs``, ``seed``, ``split``, ``render``, ``group_size``, ... of ``sims.vec_env.PER_ENV_FIELDS``), validated.

    Raises:
        ConfigError: a key of ``env.suite`` the suite has not, a value of the wrong type, or a value the suite's
            config refuses, named as the section's key (``env.backend=...`` or ``env.suite.controller=...``).
    """
    suite = env_suite(env)
    own = sims.suite_settings(suite.config)
    if unknown := sorted(set(env.suite) - set(own)):
        misplaced = [k for k in unknown if k in sims.shared_settings()]
        where = f"; write env.{misplaced[0]}" if misplaced else ""
        raise ConfigError(f"env.suite has unknown key(s) {unknown} for env.task={env.task!r} ({_settings_hint(suite)}){where}")
    hints = typing.get_type_hints(suite.config)
    values = {k: coerce(v, hints[k], f"env.suite.{k}") for k, v in env.suite.items()}
    shared = {k: getattr(env, k) for k in sims.shared_settings()}
    config = suite.config(**(shared | values | per_env))
    try:
        config.validate()
    except ValueError as exc:
        key = re.match(r"\w+", str(exc))
        prefix = "env.suite." if key and key.group() in own else "env."
        raise ConfigError(f"{prefix}{exc}") from None
    return config


FLAT_FRAME_KEYS = ("render", "image_size", "cameras", "depth")
"""The frame settings an ``env`` section held at its top before they nested under ``env.frames``."""


def check_flat_keys(section: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` for a setting written at the top of an ``env`` section that now nests, naming the
    new key, before the section is built: a frame setting (:data:`FLAT_FRAME_KEYS`, now under ``env.frames``) or a
    suite's own setting (``env.controller``, now ``env.suite.controller``).

    Args:
        section: the ``env`` mapping of a YAML file or overrides.
    """
    if key := next((k for k in FLAT_FRAME_KEYS if k in section), None):
        raise ConfigError(f"env.{key} is a frame setting, now under env.frames: {_frames_form(key, section[key])}")
    known = {f.name for f in dataclasses.fields(TrainEnvConfig)}
    task = section.get("task", TrainEnvConfig.task)
    mine = next((s.name for s in sims.suites() if isinstance(task, str) and s.claims(task)), None)
    flat = {k: sorted((s.name for s in sims.suites() if k in sims.suite_settings(s.config)), key=lambda n: n != mine)
            for k in section if k not in known}  # the task's suite named first
    for key, owners in sorted(flat.items(), key=lambda item: mine not in item[1]):  # the task's suite's first
        if owners:
            raise ConfigError(f"env.{key} is a suite's own setting ({', '.join(owners)}): write env.suite.{key}="
                              f"{section[key]} (YAML: env: {{suite: {{{key}: ...}}}})")


def _frames_form(key: str, value: Any) -> str:
    """How to write the old ``env.KEY=VALUE`` frame setting now (its ``env.frames`` override)."""
    shown = f"[{','.join(map(str, value))}]" if isinstance(value, list | tuple) else str(value).lower()
    if key == "render":
        return ("write env.frames=null (YAML: env: {frames: null})" if value is False else
                "frames are on unless env.frames=null: remove env.render")
    if key == "image_size":
        return f"write env.frames.width={shown} env.frames.height={shown} (YAML: env: {{frames: {{width: {shown}, " \
               f"height: {shown}}}}})"
    return f"write env.frames.{key}={shown} (YAML: env: {{frames: {{{key}: {shown}}}}})"


def env_splits(env: TrainEnvConfig) -> tuple[str, ...]:
    """The episode splits ``env``'s task offers (its suite's; a gymnasium env's :data:`GYM_SPLITS`)."""
    return env_suite(env).splits if env.kind == "sims" else GYM_SPLITS


def check_task_weights(weights: dict[str, Any], task: str, key: str) -> None:
    """Raise :class:`ConfigError` unless ``weights`` (config ``key``) weighs tasks of ``task`` by numbers >= 0,
    not all of them 0 (a task not named weighs 1), in a suite that samples its tasks by weight."""
    if not weights:
        return
    suite = sims.suite_of(task)
    if suite.weigh is None:
        raise ConfigError(f"{key} weighs the tasks of a suite that samples them by weight; the {suite.name} suite "
                          "splits its environments evenly over its tasks: remove it")
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in weights.values()):
        raise ConfigError(f"{key}={weights}: each weight must be a number >= 0 (unnamed tasks weigh 1)")
    try:
        suite.weigh(task, weights)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from exc


def _check_gym_id(task: str) -> None:
    """Raise :class:`ConfigError` with the closest ids when ``task`` is not in gymnasium's registry (which
    packages installed on this machine fill)."""
    import gymnasium

    if task not in gymnasium.registry:
        close = difflib.get_close_matches(task, list(gymnasium.registry), n=3, cutoff=0.7)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.registry for valid ids"
        raise ConfigError(f"env.task={task!r} is not a registered gymnasium id{hint}")

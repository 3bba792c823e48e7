"""The ``env`` section: which environment to train on, checked against its suite (``sims.suite_of``)."""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import sims
from infra.common.typed_config import ConfigError
from sims.libero.paraphrase import INSTRUCTION_MODES
from sims.libero.scene import VISUAL_FACES
from sims.libero.vec_env import CONTROLLERS, STARTS, LiberoEnvConfig
from sims.registry import task_forms
from vla_rl.config.ranges import _check_numbers

_SIMS = sims.EnvConfig
_LIBERO = LiberoEnvConfig


_FRAMES = sims.RenderConfig()


GYM_SPLITS = ("train", "validation")
"""Splits of a gymnasium env (one stream of episodes, evaluated as ``train`` and ``validation``)."""


SUITE_ONLY = {"visual_faces": "visual_faces", "max_episode_steps": "max_steps", "warp_deterministic": "warp_deterministic",
              "warp_uncaptured": "warp_uncaptured", "task_weights": "task_weights", "instructions": "instructions",
              "controller": "controller", "starts": "starts"}
"""Settings of :class:`TrainEnvConfig` that only some suites' configs have (the section's key -> the suite config's
field): a suite whose config lacks the field refuses a value other than the section's default."""


@dataclass
class TrainEnvConfig:
    """The ``env`` section: which environment to train on and how many copies to step at once.

    A ``sims`` environment is described by :class:`sims.EnvConfig`: the fields below that it shares take
    its defaults (and :class:`sims.RenderConfig`'s for the frames), and :func:`vla_rl.envs.sims_env_config`
    turns this section into one. The other fields are the trainer's: ``kind``, whether to ``render``, and the
    gymnasium settings.
    """

    kind: Literal["sims", "gym"] = "sims"
    """``sims``: the project's batched MuJoCo tasks; ``gym``: any gymnasium environment id."""
    task: str = "reach"
    """Task name of ``sims`` (or ``suite`` for all tasks; ``libero_<suite>`` or ``libero_<suite>/<i>`` for LIBERO, e.g.
    ``libero_spatial``), or a gymnasium id such as ``HalfCheetah-v5``."""
    num_envs: int = _SIMS.num_envs
    """Environments stepped in parallel (N)."""
    render: bool = True
    """Render RGB camera frames into the observation (``sims`` only; the VLA, the default policy, needs them)."""
    image_size: int = _FRAMES.height
    """Height and width of rendered frames in pixels, 8 to 1024 (``sims`` only; the VLA's
    ``policy.image_size`` must equal it)."""
    cameras: tuple[str, ...] = _FRAMES.cameras
    """Cameras rendered, in this order (``sims`` only): ``front`` and/or ``wrist`` (LIBERO: ``agentview`` and/or
    ``robot0_eye_in_hand``); ``rgb`` is ``[N, cams, 3, H, W]``."""
    depth: bool = _FRAMES.depth
    """Also render linear depth in metres as ``depth`` float ``[N, cams, H, W]`` (``sims`` only)."""
    backend: str = _SIMS.backend
    """Simulator backend of ``sims``, one of ``sims.backends.BACKENDS``: ``batch`` (threaded CPU),
    ``warp`` (MuJoCo Warp: physics, task code and rendering on ``warp_device``), ``mjx``."""
    warp_device: str = _SIMS.warp_device
    """Device of ``backend=warp``: ``cpu`` (Warp's CPU device, for tests), ``cuda:N``, or ``auto`` (the
    first GPU if there is one, else the CPU)."""
    warp_deterministic: bool = _SIMS.warp_deterministic
    """``backend=warp``: run-to-run identical physics on a GPU (mujoco_warp's ``DeterminismType.ALL`` on
    the dense Jacobian; slower, and at most about 4,300 suite worlds, checked before allocation)."""
    warp_uncaptured: bool = _SIMS.warp_uncaptured
    """``backend=warp`` on CUDA: step without CUDA graphs (about 100x slower); otherwise a failed graph
    capture is an error."""
    vectorization: Literal["sync", "async"] = "sync"
    """Gymnasium vectorisation (``gym`` only): one process, or one subprocess per environment."""
    max_episode_steps: int | None = None
    """Episode length limit (gymnasium and LIBERO); ``None`` keeps the environment's own limit (LIBERO's per suite)."""
    visual_faces: int | None = VISUAL_FACES
    """LIBERO only: triangle budget of each visual-only mesh (decimated copies, ``sims.libero.toolchain.lod``; at least
    ``sims.libero.scene.MIN_VISUAL_FACES``); ``null`` draws LIBERO's full meshes. Frames only: physics is the same."""
    instructions: str = INSTRUCTION_MODES[0]
    """LIBERO only: what training and validation episodes are instructed with: ``original`` (the task's own
    instruction, LIBERO's protocol) or ``paraphrase`` (the task's own or one of its training paraphrases, drawn
    per episode, ``sims.libero.paraphrase``; SFT draws one per frame); ``env.instructions`` of the env lists them all."""
    controller: str = _LIBERO.controller
    """LIBERO only: the arm controller (``sims.libero.vec_env.CONTROLLERS``): ``servo`` (joint servos tracking
    LIBERO's end-effector deltas) or ``osc`` (LIBERO's own OSC_POSE on its torque motors, ``sims.libero.osc``)."""
    starts: str = _LIBERO.starts
    """LIBERO only: where ``train`` and ``validation`` episodes start (``sims.libero.vec_env.STARTS``): ``jitter``
    (LIBERO's fixed states, objects shifted by up to 1 cm) or ``regions`` (LIBERO's own placement rules,
    ``sims.libero.regions``: ``scripts/setup_libero.py --region-starts K`` writes them; ``backend=batch``)."""
    terminate_on_success: bool = _SIMS.terminate_on_success
    """End a ``sims`` episode at its first success (else it runs to its step limit)."""
    reward: str = _SIMS.reward
    """What a ``sims`` step pays, one of ``sims.REWARDS`` (LIBERO: ``success`` only): ``dense`` (the shaped reward, positive at every
    step: with ``terminate_on_success`` a near miss held to the step limit can return more than finishing),
    ``progress`` (the change of the shaped reward: an episode returns its final minus its initial
    shaping) or ``success`` (1 at the step the task succeeds)."""
    success_bonus: float = _SIMS.success_bonus
    """Reward added at every step a ``sims`` task succeeds (its shaped reward pays a near miss almost as
    much as a success; a bonus makes finishing the task pay)."""
    task_weights: dict[str, float] = field(default_factory=dict)
    """Relative weight of each named task when a ``sims`` multi-task env samples training episodes, e.g.
    ``{push: 3, stack: 3}`` (a task not named weighs 1; empty: uniform, as ``sims.EnvConfig.task_weights=None``).
    Evaluation splits sample uniformly."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad value: the numbers, a ``sims`` task, backend, reward,
        cameras and task weights. A gymnasium id is looked up by :meth:`TrainConfig.check` (gymnasium's registry)."""
        _check_numbers(self, "env.")
        for key, valid in (("instructions", INSTRUCTION_MODES), ("controller", tuple(CONTROLLERS)), ("starts", STARTS)):
            if getattr(self, key) not in valid:
                raise ConfigError(f"env.{key}={getattr(self, key)!r}; use one of {', '.join(valid)}")
        if self.kind == "sims":
            _check_suite_env(self, env_suite(self))
            return
        if self.visual_faces != VISUAL_FACES:
            raise ConfigError(f"env.visual_faces={self.visual_faces} sets the mesh detail of LIBERO scenes; "
                              f"env.task={self.task!r} has none: remove it")
        if self.instructions != INSTRUCTION_MODES[0]:
            raise ConfigError(f"env.instructions={self.instructions!r} paraphrases LIBERO's instructions; "
                              f"env.task={self.task!r} has none: remove it")
        for key in ("controller", "starts"):
            if getattr(self, key) != getattr(_LIBERO, key):
                raise ConfigError(f"env.{key}={getattr(self, key)!r} is a setting of LIBERO tasks; env.task={self.task!r} "
                                  "has none: remove it")
        if self.task_weights:
            raise ConfigError(f"env.task_weights weighs the tasks of a sims suite; env.kind={self.kind!r} has one "
                              "task: remove it")


def env_suite(env: TrainEnvConfig) -> sims.Suite:
    """The registered suite of a ``sims`` env section's task (``sims.suite_of``).

    Raises:
        ConfigError: no suite claims ``env.task``, listing every suite's task names.
    """
    try:
        return sims.suite_of(env.task)
    except ValueError:
        raise ConfigError(f"env.task={env.task!r} is not a sims task; valid: {', '.join(task_forms())}") from None


def _check_suite_env(env: TrainEnvConfig, suite: sims.Suite) -> None:
    """A ``sims`` env's task name, backend, reward, cameras, task weights and the settings only some suites have,
    against what its suite offers (its cached files: :meth:`TrainConfig.check`)."""
    try:
        suite.resolve(env.task)
    except ValueError as exc:
        raise ConfigError(f"env.task: {exc}") from exc
    if env.backend not in suite.backends:
        raise ConfigError(f"env.backend={env.backend!r} is not a sims backend; valid: {', '.join(suite.backends)} "
                          f"({suite.name} tasks)")
    if env.reward not in suite.rewards:
        raise ConfigError(f"env.reward={env.reward!r} is not a sims reward; valid: {', '.join(suite.rewards)} "
                          f"({suite.name} tasks)")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", env.warp_device):
        raise ConfigError(f"env.warp_device={env.warp_device!r}; valid: auto, cpu, cuda, cuda:N")
    fields = {f.name for f in dataclasses.fields(suite.config)}
    for key in named_suite_settings(env):
        if SUITE_ONLY[key] not in fields:
            raise ConfigError(f"env.{key}={getattr(env, key)} is a setting of another suite; the {suite.name} suite "
                              f"(env.task={env.task}) has none: remove it")
    check_task_weights(env.task_weights, env.task, "env.task_weights")
    if not env.render:  # the frame settings are unused
        return
    unknown = [c for c in env.cameras if c not in suite.cameras]
    if unknown or not env.cameras or len(set(env.cameras)) < len(env.cameras):
        raise ConfigError(f"env.cameras={list(env.cameras)} must name distinct cameras (at least one); valid: "
                          f"{', '.join(suite.cameras)}")
    if env.depth and not suite.depth:
        raise ConfigError(f"env.depth=true: the {suite.name} suite renders RGB frames only; set env.depth=false")


def named_suite_settings(env: TrainEnvConfig) -> dict[str, Any]:
    """The settings of :data:`SUITE_ONLY` that ``env`` sets to other than the section's defaults, by section key."""
    default = TrainEnvConfig()
    return {key: getattr(env, key) for key in SUITE_ONLY if getattr(env, key) != getattr(default, key)}


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

"""LIBERO's entry in the suite registry (:mod:`sims.registry`): task names ``libero_<suite>`` and
``libero_<suite>/<i>``, run by :class:`~sims.libero.vec_env.LiberoVectorEnv`, evaluated on LIBERO's fixed
initial states (:func:`vla_rl.evaluate.libero_protocol`)."""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

import numpy as np

from sims.libero.expert import SETTLE_STEPS, expert_for
from sims.libero.paraphrase import DEV_SETS, libero_training_groups, libero_validation_phrasings
from sims.libero.regions import missing_region_starts
from sims.libero.scene import CAMERAS
from sims.libero.sim import libero_render_config
from sims.libero.suites import MAX_STEPS, is_libero_task, resolve_libero_task
from sims.libero.toolchain.install import missing_variants
from sims.libero.vec_env import BACKENDS, FIXED_STATE_SPLITS, LIBERO_SPLITS, LiberoEnvConfig, LiberoVectorEnv
from sims.registry import EvalProtocol, MemoryModel, Suite, register
from sims.tasks import weights_by_name


class VectorExpert:
    """The suite's experts over a :class:`LiberoVectorEnv` (:class:`sims.registry.Expert`): one per task
    (:func:`~sims.libero.expert.expert_for` on its sim), acting on the simulation's state; each plans per
    batch, so a task's block of environments restarts together once all its episodes have ended.

    Raises:
        ValueError: a task whose goal has a predicate no expert makes hold, naming what the experts do.
    """

    def __init__(self, env: LiberoVectorEnv):
        try:
            self.experts = [expert_for(sim) for sim in env.sims]
        except ValueError as exc:
            raise ValueError(f"{exc}; the experts cover every task of libero_spatial, libero_object, libero_goal and "
                             "libero_10") from None
        self.bounds = env.bounds
        self.num_envs = env.num_envs
        # The env has held still for LIBERO's wait steps before the first observation (outside the step limit,
        # as LIBERO's evaluation): the experts then plan at once instead of waiting again within the episode.
        self.settled = env.config.settle_steps >= SETTLE_STEPS

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Actions float32 [N, 7] (the experts read their sims, not ``obs``)."""
        return np.concatenate([e.act() for e in self.experts]).astype(np.float32)

    def restart(self, ended: np.ndarray) -> np.ndarray:
        """The blocks (tasks) all of whose environments have ended, bool [N]."""
        mask = np.zeros(self.num_envs, bool)
        for k in range(len(self.experts)):
            lo, hi = self.bounds[k], self.bounds[k + 1]
            mask[lo:hi] = ended[lo:hi].all()
        return mask

    def reset(self, mask: np.ndarray | None = None) -> None:
        """Restart the plans of the tasks whose environments ``mask`` covers (default all), after the env reset."""
        for k, expert in enumerate(self.experts):
            if mask is None or mask[self.bounds[k]:self.bounds[k + 1]].any():
                expert.reset(settle=not self.settled)


def missing_files(task: str, with_lan: bool, settings: Mapping[str, Any]) -> str:
    """A one-line error naming the setup command when a task of env task ``task`` is not cached (with ``with_lan``:
    or its ``_lan`` variant), or the suite's own ``settings`` (a run's ``env.suite``) start from region-sampled
    starts some task lacks; "" when all are there (in the settings' ``cache``)."""
    cache = settings.get("cache", LiberoEnvConfig.cache)
    if message := missing_variants(task, with_lan, cache):
        return message
    regions = settings.get("starts", LiberoEnvConfig.starts) == "regions"
    if regions and (message := missing_region_starts(resolve_libero_task(task), cache)):
        return f"starts=regions: {message}"
    return ""


def training_refusal(task: str, settings: Mapping[str, Any]) -> str:
    """Why the suite's own ``settings`` (a run's ``env.suite``) may not start demonstrations, training or validation
    of ``task``: ``starts=jitter`` starts them from LIBERO's fixed initial states, its test states; "" otherwise."""
    if settings.get("starts", LiberoEnvConfig.starts) != "jitter":
        return ""
    tasks = " ".join(resolve_libero_task(task))
    return ("starts=jitter starts demonstrations, training and validation from LIBERO's fixed initial states (its test "
            f"states, shifted by at most 1 cm); use starts=regions (python scripts/setup_libero.py --tasks {tasks} "
            "--region-starts 200)")


def longest_episode(task: str, limit: int | None = None) -> int:
    """Control steps of the longest episode of ``task``: ``limit``, else LIBERO's limit of its suite (:data:`MAX_STEPS`)."""
    return limit or max(MAX_STEPS[task_id.split("/")[0]] for task_id in resolve_libero_task(task))


def _training_groups(config: LiberoEnvConfig) -> list[tuple[str, ...]]:
    """Each task's training instructions under the config's ``instructions`` mode (its own, then its paraphrases)."""
    return libero_training_groups(config.task, config.instructions)


def check_instructions(run_task: str, task: str | None, texts: list[str]) -> None:
    """Raise ValueError unless ``texts`` can instruct a LIBERO evaluation: whole instructions (no ``{a}``/``{b}``:
    those name the gantry suite's entities) for one task, ``task`` (``libero_spatial/4``) or the run's own, that is
    a task of the run's ``run_task``."""
    slotted = [t for t in texts if any(f is not None for _, f, _, _ in string.Formatter().parse(t))]
    if slotted:
        raise ValueError(f"instruction {slotted[0]!r}: a LIBERO instruction is a whole sentence; {{a}} and {{b}} fill "
                         "only the gantry suite's entities, so write the objects out")
    ids = resolve_libero_task(task or run_task)
    if len(ids) > 1:
        raise ValueError(f"an instruction describes one task and {task or run_task} has {len(ids)}; pick one with "
                         f"--task (e.g. --task libero_{ids[0]})")
    if ids[0] not in resolve_libero_task(run_task):
        raise ValueError(f"task {task}: not a task of the run's env.task={run_task}")


SUITE = register(Suite(
    name="libero",
    task_forms=("libero_<suite>", "libero_<suite>/<i>", "libero_<a>+libero_<b>"),
    claims=is_libero_task,
    resolve=resolve_libero_task,
    weigh=lambda task, weights: weights_by_name(resolve_libero_task(task), weights, task),
    config=LiberoEnvConfig,
    make=LiberoVectorEnv,
    splits=LIBERO_SPLITS,
    cameras=CAMERAS,
    backends=BACKENDS,
    frames=libero_render_config(),  # 128x128 RGB of both cameras
    max_steps=longest_episode,
    expert=VectorExpert,
    # A task's compiled scene (textures downscaled to 512 px) is built once per process: 276 MiB for spatial/5 after
    # spatial/0; a GL context of its renderer 439 MiB (VmRSS, 2026-12-04); per environment as the gantry suite's.
    memory=MemoryModel(per_env=220 * 1024, per_task_scene=250 * 2**20, per_task_context=400 * 2**20),
    proprio_names=("eef_x", "eef_y", "eef_z", "eef_ax", "eef_ay", "eef_az", "finger_left", "finger_right"),
    action_names=("dx", "dy", "dz", "drx", "dry", "drz", "gripper"),
    robot_type="panda_libero",
    demo_terminates=False,  # the env would restart a simulation under its expert's running plan
    protocol=EvalProtocol(fixed_states=True, test_splits=FIXED_STATE_SPLITS),
    missing_files=missing_files,
    training_refusal=training_refusal,
    training_instructions=_training_groups,
    template_groups=_training_groups,  # a task's own instruction and its training paraphrases say one thing
    validation_instructions=libero_validation_phrasings,
    dev_sets=DEV_SETS,
    check_instructions=check_instructions,
))

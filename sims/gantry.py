"""The gantry tasks' entry in the suite registry (:mod:`sims.registry`): reach, press, drawer, lift, stack and
push on the primitive scene of :mod:`sims.scene`, or ``suite`` for all of them (:mod:`sims.tasks`)."""

from __future__ import annotations

from sims import scene as S
from sims import tasks as T
from sims.experts import ScriptedExpert
from sims.registry import MemoryModel, Suite, register
from sims.render import RenderConfig
from sims.vec_env import EnvConfig, SimVectorEnv


def longest_episode(task: str, limit: int | None = None) -> int:
    """Control steps of the longest episode of ``task`` (each gantry task has its own limit; ``limit`` unused)."""
    return max(T.TASKS[name].max_steps for name in T.resolve_tasks(task))


SUITE = register(Suite(
    name="gantry",
    task_forms=(*T.TASK_NAMES, "suite"),
    claims=lambda task: task == "suite" or task in T.TASKS,
    resolve=T.resolve_tasks,
    config=EnvConfig,
    make=SimVectorEnv,
    splits=T.SPLITS,
    cameras=S.CAMERAS,
    backends=("batch", "mjx", "warp"),
    frames=RenderConfig(),  # 64x64 RGB of the front camera
    max_steps=longest_episode,
    expert=ScriptedExpert,
    # Measured 2026-12-04 (mujoco.batch, RSS growth from 64 to 1088 environments): 219 MiB per 1024 environments
    # without frames, 366 MiB with 64 x 64 frames of one camera.
    memory=MemoryModel(per_env=220 * 1024, per_rendered_env=150 * 1024),
    weigh=T.task_weight_tuple,
    template_groups=lambda config: T.instruction_groups(T.resolve_tasks(config.task), "train"),
    depth=True,
    proprio_names=("arm_x", "arm_y", "arm_z", "arm_vx", "arm_vy", "arm_vz", "finger_left", "finger_right",
                   "finger_left_v", "finger_right_v", "tip_x", "tip_y", "tip_z"),
    action_names=("dx", "dy", "dz", "gripper"),
    robot_type="sims_xyz_gripper",
))

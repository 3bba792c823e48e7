"""Single environments for ``gymnasium.make``: ``sims/Reach-v0``, ``sims/Push-v0``, ... and ``sims/Suite-v0``.

A :class:`SingleEnv` is a :class:`~sims.vec_env.SimVectorEnv` of one environment seen through
gymnasium's ``Env`` API: observations lose the leading batch axis, and an episode that ends
returns its final observation (call ``reset`` to start the next one).
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from sims.backends import to_numpy
from sims.render import RenderConfig
from sims.tasks import TASK_NAMES
from sims.vec_env import make_vec_env


class SingleEnv(gym.Env):
    """One environment of ``task``; ``render_mode="rgb_array"`` renders the front camera."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 25}

    def __init__(self, task: str = "reach", split: str = "train", render_mode: str | None = None,
                 render: RenderConfig | bool | None = None, backend: str = "batch"):
        """Args: task name or "suite"; instruction set; gymnasium render mode; camera observations; backend."""
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r}; use None or 'rgb_array'")
        self.render_mode = render_mode
        if render_mode == "rgb_array" and not render:
            render = RenderConfig(width=128, height=128)
        self._vec = make_vec_env(task, 1, split=split, render=render, backend=backend,
                                 num_threads=1)
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space
        self.instructions = self._vec.instructions
        self.task_names = self._vec.task_names
        self._last: dict[str, np.ndarray] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode; the same ``seed`` gives the same episode."""
        super().reset(seed=seed)
        if seed is None and self._last is None:
            seed = int(self.np_random.integers(2**31))
        obs = self._vec.reset_arrays(seed=seed)
        self._last = {k: to_numpy(v)[0] for k, v in obs.items()}
        return self._last, {}

    def step(self, action: Any):
        """Step once; at the end of an episode the observation is the episode's final one."""
        out = self._vec.step_arrays(np.asarray(action, dtype=np.float32)[None])
        out = {k: v if isinstance(v, dict) else to_numpy(v) for k, v in out.items()}  # device backends: tensors
        obs = out["final_observation"] if out["terminated"][0] or out["truncated"][0] else out["observation"]
        self._last = {k: to_numpy(v)[0] for k, v in obs.items()}
        info = {"success": bool(out["success"][0])}
        return self._last, float(out["reward"][0]), bool(out["terminated"][0]), bool(out["truncated"][0]), info

    def render(self) -> np.ndarray | None:
        """The front camera frame, [H, W, 3] uint8, with ``render_mode="rgb_array"``."""
        if self.render_mode != "rgb_array" or self._last is None:
            return None
        return self._last["rgb"][0].transpose(1, 2, 0).copy()

    def close(self) -> None:
        """Release the renderer."""
        self._vec.close()


def gym_id(task: str) -> str:
    """The gymnasium id of ``task`` (e.g. ``sims/Reach-v0``)."""
    return f"sims/{task.capitalize()}-v0"


def register_all() -> None:
    """Register every task and the suite with gymnasium (idempotent)."""
    for task in (*TASK_NAMES, "suite"):
        if gym_id(task) not in gym.registry:
            gym.register(id=gym_id(task), entry_point="sims.single:SingleEnv", kwargs={"task": task})

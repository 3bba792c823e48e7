"""A minimal third suite, as docs/sims.md ("Adding a suite") shows it: a point on a plane moves to a goal.

The tests register it (:func:`sims.register`) and train it with the trainer; nothing outside this module
knows its name. A real suite is a package of its own under sims/ whose entry module registers it on import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from sims.registry import MemoryModel, Suite
from sims.vec_env import ArrayVectorEnv, VecEnvConfig

SPLITS = ("train", "validation")
_STREAM = {"train": 0, "validation": 1}


def resolve(task: str) -> tuple[str, ...]:
    """The task ids of ``task`` (one task, ``point``)."""
    if task != "point":
        raise ValueError(f"unknown task {task!r}; valid: point")
    return ("point",)


@dataclass(frozen=True)
class PointConfig(VecEnvConfig):
    """The shared settings and the point suite's own."""

    speed: float = 0.2
    """Largest move per step (an action of 1)."""
    max_steps: int = 20
    """Control steps per episode."""
    radius: float = 0.15
    """Success: the point within this distance of the goal."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        resolve(self.task)
        super().validate()
        if self.split not in SPLITS:
            raise ValueError(f"split={self.split!r}; valid: {', '.join(SPLITS)}")
        if self.render is not None:
            raise ValueError("render: the point suite renders no frames; pass render=None (trainer: env.frames=null)")


class PointVectorEnv(ArrayVectorEnv):
    """N points on the plane [-1, 1]^2; ``proprio`` float32 [N, 2] (the point), ``state`` [N, 4] (point, goal)."""

    _EPISODE_FIELDS = ("_pos", "_goal", "_steps", "_episode")
    control_hz = 10.0

    def __init__(self, config: PointConfig):
        config.validate()
        self.config, self.num_envs, self.device, self._ax = config, config.num_envs, None, np
        self.task_names, self.instructions = ("point",), ["move the point to the goal"]
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        box = {k: gym.spaces.Box(-np.inf, np.inf, (d,), np.float32) for k, d in (("proprio", 2), ("state", 4))}
        self.single_observation_space = gym.spaces.Dict(
            {**box, "instruction": gym.spaces.Discrete(1), "task": gym.spaces.Discrete(1)})
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.max_episode_steps = config.max_steps
        self._seed, self._obs = config.seed, None
        self._pos, self._goal = np.zeros((self.num_envs, 2), np.float32), np.zeros((self.num_envs, 2), np.float32)
        self._steps, self._episode = np.zeros(self.num_envs, np.int64), np.zeros(self.num_envs, np.int64)

    def _start_episodes(self, ids: np.ndarray) -> None:
        for i in ids:
            group = int(i) // self.config.group_size
            rng = np.random.default_rng([self._seed, group, int(self._episode[i]), _STREAM[self.config.split]])
            self._pos[i], self._goal[i] = rng.uniform(-1, 1, (2, 2))
        self._episode[ids] += 1
        self._steps[ids] = 0

    def _observe(self, ids: np.ndarray | None = None, frames: bool = True) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        sel = slice(None) if ids is None else ids
        pos, goal = self._pos[sel], self._goal[sel]
        dist = np.linalg.norm(pos - goal, axis=1)
        zeros = np.zeros(len(pos), np.int64)
        obs = {"proprio": pos.copy(), "state": np.concatenate([pos, goal], 1), "instruction": zeros, "task": zeros}
        return obs, (-dist).astype(np.float32), dist < self.config.radius

    def _observe_reset(self) -> None:
        self._obs = self._observe()[0]

    def step_arrays(self, action: Any) -> dict[str, Any]:
        """Move every point by ``speed x action``; SAME_STEP autoreset as every suite's (the shared base's)."""
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        self._pos = np.clip(self._pos + self.config.speed * self._check_action(action), -1, 1).astype(np.float32)
        self._steps += 1
        final, shaped, success = self._observe()
        reward = shaped + self.config.success_bonus * success
        terminated = success if self.config.terminate_on_success else np.zeros(self.num_envs, bool)
        truncated = (self._steps >= self.config.max_steps) & ~terminated
        self._obs, final, _ = self._autoreset(final, terminated | truncated)
        return {"observation": self._obs, "final_observation": final, "reward": reward,
                "terminated": terminated, "truncated": truncated, "success": success}

    def _physics_state(self) -> dict[str, Any]:
        return {}  # the points and goals are episode arrays

    def _restore_physics(self, state: dict[str, Any]) -> None:
        pass

    def _restored(self, started: bool) -> None:
        self._obs = self._observe()[0] if started else None


class GreedyExpert:
    """Moves each point straight to its goal (the :class:`sims.registry.Expert` interface)."""

    def __init__(self, env: PointVectorEnv):
        self.env = env

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        state = np.asarray(obs["state"])
        return np.clip((state[:, 2:] - state[:, :2]) / self.env.config.speed, -1, 1).astype(np.float32)

    def restart(self, ended: np.ndarray) -> None:
        return None  # nothing planned: the env's autoreset started the next episodes

    def reset(self, mask: np.ndarray | None = None) -> None:
        pass


SUITE = Suite(
    name="point", task_forms=("point",), claims=lambda task: task == "point", resolve=resolve, config=PointConfig,
    make=PointVectorEnv, splits=SPLITS, cameras=(), backends=("batch",),
    max_steps=lambda task, limit: PointConfig.max_steps, expert=GreedyExpert, memory=MemoryModel(per_env=256),
    proprio_names=("x", "y"), action_names=("dx", "dy"),
)
"""The point suite's entry: ``sims.register(SUITE)`` adds it."""

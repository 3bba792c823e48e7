"""Scripted experts: a phase machine per task, reading the privileged state.

They show that every task is solvable with the action interface, drive the videos of
``scripts/render_video.py``, and can provide demonstrations. They read ``state`` (tip, entity
positions) and the episode's entities, so they are not policies a learner could copy from pixels.
"""

from __future__ import annotations

import numpy as np

from sims import scene as S
from sims import tasks as T
from sims.backends import to_numpy
from sims.vec_env import SimVectorEnv

_OPEN, _CLOSED = -1.0, 1.0
# Push: the tip crosses to behind the block this high (lower knocks blocks on the way) and aims
# this far past the block while pushing (at 0.03 m it pushed at a third of full speed, and long
# pushes ran out of steps: 81 % success on validation episodes, 89 % with these values).
_PUSH_TRANSIT_Z = 0.07
_PUSH_LEAD = 0.1


def _z(height: float) -> np.ndarray:
    return np.array([0.0, 0.0, height])


def _move(delta: np.ndarray, grip: float, reach: float = 0.03) -> np.ndarray:
    """Action moving by ``delta`` (metres), saturating at ``reach`` metres per step."""
    return np.concatenate([np.clip(delta / reach, -1.0, 1.0), [grip]]).astype(np.float32)


class ScriptedExpert:
    """Per-environment phase machines for every task of a :class:`SimVectorEnv`."""

    def __init__(self, env: SimVectorEnv):
        """Args: the environments the expert acts in."""
        self.env = env
        self.phase = np.zeros(env.num_envs, np.int64)
        self.timer = np.zeros(env.num_envs, np.int64)

    def reset(self, mask: np.ndarray | None = None) -> None:
        """Restart the phase machines (all, or where ``mask``: episodes that just ended)."""
        sel = slice(None) if mask is None else mask
        self.phase[sel] = 0
        self.timer[sel] = 0

    def restart(self, ended: np.ndarray) -> None:
        """Restart the phase machines of the environments whose episodes ended (``ended``, bool [N]): the
        env's autoreset has already started their next episodes (the :class:`sims.registry.Expert` interface)."""
        self.reset(ended)

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Actions [N, 4] for observation ``obs`` (an observation dict of numpy arrays or tensors)."""
        env = self.env
        obs = {k: to_numpy(obs[k]) for k in ("state", "task")}
        actions = np.empty((env.num_envs, 4), np.float32)
        for i in range(env.num_envs):
            state = obs["state"][i]
            tip = state[6:9]
            ents = state[9:9 + 3 * T.NUM_ENTITIES].reshape(T.NUM_ENTITIES, 3)
            task = env.task_names[obs["task"][i]]
            step = getattr(self, f"_{task}")
            actions[i] = step(i, tip, ents[env._a[i]], ents[env._b[i]])
        return actions

    def _advance(self, i: int, arrived: bool) -> None:
        if arrived:
            self.phase[i] += 1
            self.timer[i] = 0

    def _reach(self, i: int, tip, a, b) -> np.ndarray:
        return _move(a + _z(T.REACH_HOVER) - tip, _OPEN)

    def _press(self, i: int, tip, a, b) -> np.ndarray:
        if self.phase[i] == 0:
            self._advance(i, np.linalg.norm((tip - a)[:2]) < 0.01)
            return _move(a + _z(0.04) - tip, _CLOSED)
        return _move(a - _z(0.03) - tip, _CLOSED)

    def _drawer(self, i: int, tip, a, b) -> np.ndarray:
        hook = a + np.array([0.0, 0.02, 0.0])  # between the handle and the drawer front
        if self.phase[i] == 0:
            self._advance(i, np.linalg.norm(hook + _z(0.06) - tip) < 0.01)
            return _move(hook + _z(0.06) - tip, _CLOSED)
        if self.phase[i] == 1:
            self._advance(i, np.linalg.norm(hook - tip) < 0.01)
            return _move(hook - tip, _CLOSED)
        return _move(np.array([0.0, -0.03, 0.0]), _CLOSED)

    def _grasp(self, i: int, tip, a) -> np.ndarray | None:
        """Phases 0-2: over the block, down, close. None once the block is held."""
        if self.phase[i] == 0:
            self._advance(i, np.linalg.norm(a + _z(0.06) - tip) < 0.01)
            return _move(a + _z(0.06) - tip, _OPEN)
        if self.phase[i] == 1:
            self._advance(i, np.linalg.norm(a + _z(0.005) - tip) < 0.008)
            return _move(a + _z(0.005) - tip, _OPEN)
        if self.phase[i] == 2:
            self.timer[i] += 1
            self._advance(i, self.timer[i] > 5)
            return _move(np.zeros(3), _CLOSED)
        return None

    def _lift(self, i: int, tip, a, b) -> np.ndarray:
        grasp = self._grasp(i, tip, a)
        return grasp if grasp is not None else _move(np.array([0.0, 0.0, 0.03]), _CLOSED)

    def _stack(self, i: int, tip, a, b) -> np.ndarray:
        grasp = self._grasp(i, tip, a)
        if grasp is not None:
            return grasp
        goal = b + _z(2 * S.CUBE_HALF + 0.003)
        if self.phase[i] == 3:
            self._advance(i, np.linalg.norm(goal + _z(0.05) - a) < 0.01)
            return _move(goal + _z(0.05) - a, _CLOSED)
        if self.phase[i] == 4:
            self._advance(i, np.linalg.norm(goal - a) < 0.006)
            return _move(goal - a, _CLOSED, reach=0.05)
        return _move(np.zeros(3), _OPEN)

    def _push(self, i: int, tip, a, b) -> np.ndarray:
        direction = (b - a)[:2] / (np.linalg.norm((b - a)[:2]) + 1e-9)
        behind = a[:2] - 0.065 * direction
        if self.phase[i] == 0:  # over the spot behind the block; coarse, the descent lines up
            target = np.array([*behind, _PUSH_TRANSIT_Z])
            self._advance(i, np.linalg.norm(target - tip) < 0.02)
            return _move(target - tip, _CLOSED)
        if self.phase[i] == 1:
            target = np.array([*behind, 0.03])
            self._advance(i, np.linalg.norm(target - tip) < 0.01)
            return _move(target - tip, _CLOSED)
        # Push along the line to the target; lift off and line up again if the block slid aside.
        contact = a[:2] - (S.CUBE_HALF + 0.02) * direction
        error = tip[:2] - contact
        lateral = error - (error @ direction) * direction
        if np.linalg.norm(lateral) > 0.02:
            self.phase[i] = 0
        # Aim well past the block: a short lead slows the tip as it meets the block's face.
        target = contact + _PUSH_LEAD * direction - lateral
        return _move(np.array([*(target - tip[:2]), 0.03 - tip[2]]), _CLOSED)


def run_expert(env: SimVectorEnv, episodes_per_env: int = 1, seed: int | None = None) -> np.ndarray:
    """Run the expert until every environment finished ``episodes_per_env`` episodes.

    Returns:
        Success of each finished episode, bool [num_envs, episodes_per_env].
    """
    expert = ScriptedExpert(env)
    obs = env.reset_arrays(seed=seed)
    results = np.zeros((env.num_envs, episodes_per_env), bool)
    finished = np.zeros(env.num_envs, np.int64)
    longest = max(T.TASKS[t].max_steps for t in env.task_names)
    for _ in range(longest * episodes_per_env):
        out = env.step_arrays(expert.act(obs))
        obs = out["observation"]
        done = to_numpy(out["terminated"]) | to_numpy(out["truncated"])
        success = to_numpy(out["success"])
        for i in np.flatnonzero(done & (finished < episodes_per_env)):
            results[i, finished[i]] = success[i]
            finished[i] += 1
        expert.reset(done)
        if (finished >= episodes_per_env).all():
            break
    return results

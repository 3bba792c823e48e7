"""Environments as the trainer sees them: the TensorDict view of a vector environment.

Both sources offer the same surface (see docs/ARCHITECTURE.md, "sims -> vla_rl"):
``num_envs``, ``single_action_space``, ``instructions``, ``task_names``, ``reset_td(seed)``,
``step_td(action)`` and optionally ``get_state()``/``set_state()`` for exact resume.

- ``sims`` vector environments provide it themselves (:func:`make_env` only forwards settings).
- Any gymnasium ``VectorEnv`` is adapted by :class:`GymTensorEnv`: a Box observation becomes
  the key ``state`` (a Dict observation keeps its keys), actions in ``[-1, 1]`` are mapped to the
  action space's bounds, and autoreset runs in ``SAME_STEP`` mode so the final observation of a
  truncated episode is kept for bootstrapping.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch
from tensordict import TensorDict

import sims
from vla_rl.config import TrainEnvConfig, suite_config


class GymTensorEnv:
    """TensorDict view of a gymnasium vector environment (``SAME_STEP`` autoreset).

    Args:
        env: A gymnasium ``VectorEnv`` created with ``autoreset_mode=SAME_STEP`` and a Box action space.
        task_name: The environment id, reported as the only task.
        max_episode_steps: The episode length limit, if any.
        env_offset: Index of this env's first environment in a larger, sharded set: reset seeds are
            shifted by it, so shard environments equal those of one unsharded vector env.
    """

    def __init__(
        self, env: gym.vector.VectorEnv, task_name: str, max_episode_steps: int | None, env_offset: int = 0
    ) -> None:
        mode = env.metadata.get("autoreset_mode")
        if mode != gym.vector.AutoresetMode.SAME_STEP:
            raise ValueError(
                f"GymTensorEnv needs a vector env with autoreset_mode=SAME_STEP, got {mode}; create it with "
                "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}"
            )
        space = env.single_action_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(f"GymTensorEnv supports Box action spaces only, got {space}")
        self.env = env
        self.num_envs = env.num_envs
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, space.shape, np.float32)
        self._low = np.asarray(space.low, np.float64)
        self._high = np.asarray(space.high, np.float64)
        self.task_names = [task_name]
        self.instructions = [""]
        self.max_episode_steps = max_episode_steps
        self._render_failed = False
        self._render_started = False
        self.env_offset = env_offset

    def _obs_td(self, obs: Any) -> TensorDict:
        n = self.num_envs
        if isinstance(obs, dict):
            data = {k: torch.as_tensor(np.asarray(v, np.float32)) for k, v in obs.items()}
        else:
            data = {"state": torch.as_tensor(np.asarray(obs, np.float32))}
        data["task"] = torch.zeros(n, dtype=torch.int64)
        data["instruction"] = torch.zeros(n, dtype=torch.int64)
        return TensorDict(data, batch_size=[n])

    def reset_td(self, seed: int | None = None) -> TensorDict:
        """Reset every environment; returns the observation TensorDict ``[N]``."""
        obs, _ = self.env.reset(seed=None if seed is None else seed + self.env_offset)
        return self._obs_td(obs)

    def step_td(self, action: torch.Tensor) -> TensorDict:
        """Step with actions ``[N, A]`` in ``[-1, 1]``; returns the step TensorDict ``[N]`` of the contract."""
        act = action.detach().cpu().numpy().astype(np.float64)
        if act.shape != (self.num_envs, *self.single_action_space.shape):
            raise ValueError(f"action shape {act.shape} != expected {(self.num_envs, *self.single_action_space.shape)}")
        if not np.isfinite(act).all():
            raise ValueError("action contains NaN or inf; check the policy's outputs")
        scaled = self._low + (np.clip(act, -1.0, 1.0) + 1.0) * 0.5 * (self._high - self._low)
        obs, reward, terminated, truncated, info = self.env.step(scaled.astype(np.float32))
        observation = self._obs_td(obs)
        final = observation.clone()
        for i in np.flatnonzero(info.get("_final_obs", [])):
            one = info["final_obs"][i]
            for key, value in (one.items() if isinstance(one, dict) else [("state", one)]):
                final[key][i] = torch.as_tensor(np.asarray(value, np.float32))
        success = np.asarray(info.get("is_success", np.zeros(self.num_envs, bool)), bool)
        return TensorDict(
            {
                "observation": observation,
                "final_observation": final,
                "reward": torch.as_tensor(np.asarray(reward, np.float32)),
                "terminated": torch.as_tensor(np.asarray(terminated, bool)),
                "truncated": torch.as_tensor(np.asarray(truncated, bool)),
                "success": torch.as_tensor(success),
            },
            batch_size=[self.num_envs],
        )

    def render_frame(self) -> np.ndarray | None:
        """Environment 0's ``rgb_array`` render (``None`` unless made with ``render_mode="rgb_array"``).

        A MuJoCo environment renders with fast settings (see :func:`_fast_mujoco_render`).
        """
        envs = getattr(self.env, "envs", None)
        if not envs or envs[0].render_mode != "rgb_array" or self._render_failed:
            return None
        try:
            if not self._render_started:
                self._render_started = True
                _fast_mujoco_render(envs[0])
            return np.asarray(envs[0].render())
        except gym.error.DependencyNotInstalled as exc:
            warnings.warn(f"no evaluation video for {self.task_names[0]}: {exc}", stacklevel=2)
            self._render_failed = True
            return None

    def get_state(self) -> list[dict[str, Any]]:
        """Snapshot of every sub-environment (physics, RNG, time-limit counter) for exact resume.

        Raises:
            NotImplementedError: The vector env runs in subprocesses, or a sub-environment's state is unknown.
        """
        envs = getattr(self.env, "envs", None)
        if envs is None:
            raise NotImplementedError(f"{type(self.env).__name__} runs environments in other processes")
        return [_snapshot(e) for e in envs]

    def set_state(self, state: list[dict[str, Any]]) -> None:
        """Restore what :meth:`get_state` returned."""
        envs = getattr(self.env, "envs", None)
        if envs is None or len(envs) != len(state):
            raise ValueError(f"environment state for {len(state)} envs cannot be restored into {self.num_envs}")
        for e, s in zip(envs, state):
            _restore(e, s)

    def close(self) -> None:
        """Close the underlying vector environment."""
        self.env.close()


VIDEO_SIZE = 256
"""Frame width and height of a gymnasium MuJoCo task's evaluation video (gymnasium's default, 480,
reads back and encodes 3.5x the pixels; 256 is what ``infra.common.runlog`` upscales smaller frames to)."""
# Off in evaluation videos, as in sims/render.py: HalfCheetah's 480x480 frame costs 50 ms with them
# and multisampling, 4 ms without (docs/training.md, "Evaluation cost").
_SLOW_RENDER_FLAGS = (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX)


def _fast_mujoco_render(env: gym.Env) -> None:
    """Before ``env``'s first render (MuJoCo envs only): ``VIDEO_SIZE`` frames, no multisampling,
    shadows, reflections or skybox."""
    base = env.unwrapped
    renderer = getattr(base, "mujoco_renderer", None)
    if renderer is None:
        return
    renderer.width = renderer.height = VIDEO_SIZE  # read with offsamples when the GL context is made
    base.model.vis.quality.offsamples = 0
    env.render()
    for flag in _SLOW_RENDER_FLAGS:
        renderer.viewer.scn.flags[flag] = 0


def _wrappers(env: gym.Env) -> list[gym.Env]:
    chain = [env]
    while hasattr(chain[-1], "env"):
        chain.append(chain[-1].env)
    return chain


def _snapshot(env: gym.Env) -> dict[str, Any]:
    base = env.unwrapped
    state: dict[str, Any] = {
        "np_random": base.np_random.bit_generator.state,
        "elapsed": [w._elapsed_steps for w in _wrappers(env) if isinstance(w, gym.wrappers.TimeLimit)],
    }
    if hasattr(base, "model") and hasattr(base, "data"):
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        buf = np.empty(mujoco.mj_stateSize(base.model, spec))
        mujoco.mj_getState(base.model, base.data, buf, spec)
        state["mujoco"] = buf
    elif isinstance(getattr(base, "state", None), np.ndarray):
        state["array_state"] = base.state.copy()
    else:
        raise NotImplementedError(f"cannot snapshot {type(base).__name__}: neither MuJoCo nor an array `state`")
    return state


def _restore(env: gym.Env, state: dict[str, Any]) -> None:
    base = env.unwrapped
    base.np_random.bit_generator.state = state["np_random"]
    limits = [w for w in _wrappers(env) if isinstance(w, gym.wrappers.TimeLimit)]
    for wrapper, elapsed in zip(limits, state["elapsed"]):
        wrapper._elapsed_steps = elapsed
    if "mujoco" in state:
        mujoco.mj_setState(base.model, base.data, state["mujoco"], mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(base.model, base.data)
    else:
        base.state = state["array_state"].copy()


def sims_env_config(
    cfg: TrainEnvConfig,
    *,
    num_envs: int,
    seed: int,
    split: str = "train",
    group_size: int = 1,
    env_offset: int = 0,
    num_threads: int | None = None,
) -> sims.VecEnvConfig:
    """The config of ``cfg``'s suite (``sims.suite_of(cfg.task).config``, e.g. :class:`sims.EnvConfig`) for a
    ``sims`` env section (:func:`vla_rl.config.suite_config`: its shared settings and ``env.suite``) with the
    frames it asks for (``cfg.frames``, with ``num_threads`` GL contexts unless it names its own, or none).

    The other arguments are :func:`make_env`'s.

    Raises:
        ValueError: ``env_offset`` for a suite whose environments are not sharded.
    """
    suite = sims.suite_of(cfg.task)
    frames = cfg.frames
    render = None if frames is None else dataclasses.replace(frames, num_contexts=frames.num_contexts or num_threads)
    per_env = dict(num_envs=num_envs, seed=seed, split=split, render=render, group_size=group_size,
                   num_threads=num_threads)
    if env_offset:
        if "env_offset" not in {f.name for f in dataclasses.fields(suite.config)}:
            raise ValueError(f"env_offset={env_offset}: {suite.name} environments are not sharded; use "
                             "fleet.mode=inprocess or fleet.mode=data_parallel")
        per_env["env_offset"] = env_offset
    return suite_config(cfg, **per_env)


def make_env(
    cfg: TrainEnvConfig,
    *,
    seed: int,
    num_envs: int | None = None,
    split: str = "train",
    group_size: int = 1,
    video: bool = False,
    env_offset: int = 0,
    num_threads: int | None = None,
) -> Any:
    """Build the environment ``cfg`` names, with the TensorDict view.

    Args:
        cfg: The environment section of the run config.
        seed: Seed of a ``sims`` env's episode streams (gymnasium envs are seeded by the first ``reset_td(seed)``).
        num_envs: Number of environments; default ``cfg.num_envs``.
        split: Episode split of ``sims`` tasks, one of the suite's ``splits`` (the gantry tasks': train, validation,
            paraphrase, composition; LIBERO's: train, validation, fixed, lan, paraphrase).
        group_size: Consecutive environments sharing each episode's initial state (GRPO).
        video: Gymnasium tasks only: render ``rgb_array`` frames for evaluation videos
            (``sims`` videos come from the camera observation).
        env_offset: Index of the first environment within a sharded set (the Ray fleet's shards).
        num_threads: ``sims`` only: physics threads and GL contexts (None: one per CPU core); a
            fleet shard passes the CPUs it reserved, so shards sharing a machine do not oversubscribe it.
    """
    n = num_envs or cfg.num_envs
    if cfg.kind == "sims":
        config = sims_env_config(cfg, num_envs=n, seed=seed, split=split, group_size=group_size,
                                 env_offset=env_offset, num_threads=num_threads)
        return sims.suite_of(cfg.task).make(config)
    limit = cfg.max_episode_steps or gym.spec(cfg.task).max_episode_steps
    render_mode = "rgb_array" if video else None
    fns = [lambda: gym.make(cfg.task, max_episode_steps=limit, render_mode=render_mode) for _ in range(n)]
    vec_cls = gym.vector.SyncVectorEnv if cfg.vectorization == "sync" else gym.vector.AsyncVectorEnv
    vec = vec_cls(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return GymTensorEnv(vec, cfg.task, limit, env_offset)

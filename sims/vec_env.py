"""The vector environment: a gymnasium ``VectorEnv`` (SAME_STEP autoreset) plus a TensorDict view.

Actions are float32 in ``[-1, 1]^4``: the first three move the gripper's position targets by up
to ``max_delta`` metres per step along x, y, z (target = current position + action * max_delta,
clipped to the joint ranges); the fourth sets the gripper (-1 open, +1 closed), mapped to the
finger actuators' range.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from sims import scene as S
from sims import tasks as T
from sims.backends import BACKENDS, make_backend
from sims.render import RenderConfig

ACTION_DIM = 4


@dataclass(frozen=True)
class EnvConfig:
    """Configuration of a :class:`SimVectorEnv`.

    Attributes:
        task: a task name or ``"suite"`` (a task sampled per environment and episode).
        num_envs: number of environments N.
        seed: base seed; episode k of group g is sampled from ``(seed, g, k)``.
        split: the episodes' split (:data:`sims.tasks.SPLITS`): ``train``, ``validation``,
            ``paraphrase`` (held-out templates) or ``composition`` (held-out task x entity x colour
            combinations); each draws from its own seed stream.
        render: camera observations (None: state only).
        backend: ``"batch"`` (mujoco.batch, CPU threads), ``"mjx"`` or ``"mjx-warp"``.
        group_size: consecutive groups of this many environments share every episode's initial
            state (layout, colours, instruction), as GRPO needs; 1 for independent environments.
        env_offset: global index of this set's first environment, when a fleet of shards splits
            one large set: environment i draws its episodes as environment ``env_offset + i`` would,
            so the shards together equal one set of the same total size.
        num_threads: physics threads for the batch backend (None: all CPUs).
        frame_skip: physics substeps per control step (timestep 10 ms: 40 ms per step).
        max_delta: largest gripper move per control step, metres.
        terminate_on_success: end an episode (``terminated``) at its first success.
    """

    task: str = "reach"
    num_envs: int = 16
    seed: int = 0
    split: str = "train"
    render: RenderConfig | None = None
    backend: str = "batch"
    group_size: int = 1
    env_offset: int = 0
    num_threads: int | None = None
    frame_skip: int = 4
    max_delta: float = 0.03
    terminate_on_success: bool = True

    def validate(self) -> tuple[str, ...]:
        """Check the fields; return the resolved task names.

        Raises:
            ValueError: a field out of range, naming the field and the valid values.
        """
        task_names = T.resolve_tasks(self.task)
        T.check_split(self.split, task_names)
        if self.backend not in (*BACKENDS, "mjx-warp"):
            raise ValueError(f"backend={self.backend!r}; valid backends: batch, mjx, mjx-warp")
        if self.num_envs < 1:
            raise ValueError(f"num_envs={self.num_envs}; it must be at least 1")
        if self.group_size < 1 or self.num_envs % self.group_size or self.env_offset % self.group_size:
            raise ValueError(f"group_size={self.group_size} must be >= 1 and divide num_envs={self.num_envs} "
                             f"and env_offset={self.env_offset}")
        if self.env_offset < 0:
            raise ValueError(f"env_offset={self.env_offset}; it must be >= 0")
        if self.frame_skip < 1 or self.max_delta <= 0:
            raise ValueError(f"frame_skip={self.frame_skip} and max_delta={self.max_delta} must be positive")
        return task_names


class SimVectorEnv(gym.vector.VectorEnv):
    """N environments of the tabletop suite on one physics backend (see :class:`EnvConfig`).

    Observations are dicts of arrays with a leading N: ``proprio`` float32 [N, 13], ``state``
    float32 [N, 42], ``instruction`` int64 [N] (index into :attr:`instructions`), ``task`` int64 [N]
    (index into :attr:`task_names`), and with rendering ``rgb`` uint8 [N, cams, 3, H, W] (and
    ``depth`` float32 [N, cams, H, W] when asked for) and ``goal_pixel`` float32 [N, cams, 2]: where
    the point the gripper tip should reach appears in each camera (x right, y down, the image
    spanning [-1, 1]; privileged, like ``state``: for auxiliary losses, never for acting). Autoreset is SAME_STEP: an environment that
    ends is reset within the same ``step``; ``infos["final_obs"]`` holds every environment's
    observation before that reset (equal to the returned one where nothing ended), with
    ``infos["_final_obs"]`` the mask of those that ended.
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"]}

    def __init__(self, config: EnvConfig):
        """Build the scene, the backend and (if asked for) the renderer."""
        self.config = config
        self.task_names: tuple[str, ...] = config.validate()
        self.model, self.layout = S.build_model()
        self.num_envs = config.num_envs
        self.instructions: list[str] = T.instruction_table(self.task_names, config.split)
        self._instruction_index = {s: i for i, s in enumerate(self.instructions)}
        self._backend = make_backend(config.backend, self.model, self.num_envs, config.frame_skip,
                                     config.num_threads)
        xp = self._backend.xp
        self._evaluate = self._backend.compile(
            lambda qpos, qvel, mocap, task, a, b: T.evaluate(xp, qpos, qvel, mocap, task, a, b,
                                                             self.task_names, self.layout))
        self._renderer = None
        if config.render is not None:
            from sims.render import BatchRenderer

            self._renderer = BatchRenderer(self.model, config.render)
        self._max_steps = np.array([T.TASKS[n].max_steps for n in self.task_names])
        self._ctrl_low = self.model.actuator_ctrlrange[:, 0].copy()
        self._ctrl_high = self.model.actuator_ctrlrange[:, 1].copy()

        n = self.num_envs
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        spaces: dict[str, gym.Space] = {
            "proprio": gym.spaces.Box(-np.inf, np.inf, (T.PROPRIO_DIM,), np.float32),
            "state": gym.spaces.Box(-np.inf, np.inf, (T.STATE_DIM,), np.float32),
            "instruction": gym.spaces.Discrete(len(self.instructions)),
            "task": gym.spaces.Discrete(len(self.task_names)),
        }
        if config.render is not None:
            cams, h, w = len(config.render.cameras), config.render.height, config.render.width
            spaces["rgb"] = gym.spaces.Box(0, 255, (cams, 3, h, w), np.uint8)
            spaces["goal_pixel"] = gym.spaces.Box(-np.inf, np.inf, (cams, 2), np.float32)
            if config.render.depth:
                spaces["depth"] = gym.spaces.Box(0.0, np.inf, (cams, h, w), np.float32)
        self.single_observation_space = gym.spaces.Dict(spaces)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)

        self._seed = config.seed
        self._task = np.zeros(n, np.int64)
        self._a = np.zeros(n, np.int64)
        self._b = np.zeros(n, np.int64)
        self._instruction = np.zeros(n, np.int64)
        self._colours = np.zeros((n, T.NUM_COLOURED), np.int64)
        self._steps = np.zeros(n, np.int64)
        self._episode = np.zeros(n, np.int64)
        self._obs: dict[str, np.ndarray] | None = None
        self.timings = {"render": 0.0}  # seconds spent rendering since construction (monotonic)

    # ----------------------------------------------------------------------------- episodes
    def _start_episodes(self, ids: np.ndarray) -> None:
        """Sample and start the next episode of environments ``ids``."""
        nq, nmocap = self.model.nq, self.model.nmocap
        qpos = np.empty((len(ids), nq))
        mocap = np.empty((len(ids), nmocap, 3))
        for k, i in enumerate(ids):
            group = (self.config.env_offset + i) // self.config.group_size
            rng = T.episode_rng(self._seed, group, int(self._episode[i]), self.config.split)
            ep = T.sample_episode(rng, self.task_names, self.config.split, self.layout, nmocap)
            self._task[i], self._a[i], self._b[i] = ep.task, ep.a, ep.b
            self._colours[i] = ep.colours
            self._instruction[i] = self._instruction_index[ep.text]
            qpos[k], mocap[k] = ep.qpos, ep.mocap_pos
        self._episode[ids] += 1
        self._steps[ids] = 0
        ctrl = np.empty((len(ids), self.model.nu))
        ctrl[:, :3] = qpos[:, self.layout.arm_qpos]
        ctrl[:, 3:] = S.FINGER_OPEN
        self._backend.set_state(ids, qpos, mocap, ctrl)

    def _observe(self, ids: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Observation, reward and success of environments ``ids`` (None: all) at the current state.

        The task code runs on every environment (one compiled shape for jitted backends).
        """
        xp, b = self._backend.xp, self._backend
        out = self._evaluate(b.qpos, b.qvel, b.mocap_pos, xp.asarray(self._task), xp.asarray(self._a),
                             xp.asarray(self._b))
        sel = slice(None) if ids is None else ids
        obs = {
            "proprio": np.array(out["proprio"])[sel],  # copies: JAX results are read-only
            "state": np.array(out["state"])[sel],
            "instruction": self._instruction[sel].copy(),
            "task": self._task[sel].copy(),
        }
        if self._renderer is not None:
            qpos, mocap = np.asarray(b.qpos)[sel], np.asarray(b.mocap_pos)[sel]
            state = obs["state"]
            goal = (state[:, T.STATE_TIP_GOAL] + state[:, T.STATE_TIP])[:, None]
            env_ids = self.config.env_offset + np.arange(self.num_envs)[sel]
            start = time.perf_counter()
            frames = self._renderer.render(qpos, mocap, T.PALETTE_RGBA[self._colours[sel]], self.layout, goal,
                                           env_ids=env_ids)
            self.timings["render"] += time.perf_counter() - start
            frames["goal_pixel"] = frames.pop("pixels")[:, :, 0]
            obs.update(frames)
        return obs, np.array(out["reward"])[sel], np.array(out["success"])[sel]

    # ----------------------------------------------------------------------------- core
    def _check_action(self, action: Any) -> np.ndarray:
        """Validate and clip an action batch; raise before touching any environment."""
        expected = (self.num_envs, ACTION_DIM)
        try:
            arr = np.asarray(action, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"action must be a float array of shape {expected}: {exc}") from exc
        if arr.shape != expected:
            raise ValueError(f"action has shape {arr.shape}; expected {expected} (num_envs, action_dim)")
        bad = ~np.isfinite(arr).all(axis=1)
        if bad.any():
            raise ValueError(f"action holds NaN or inf for environments {np.flatnonzero(bad)[:10].tolist()}; "
                             "no environment was stepped — check the policy's outputs")
        return np.clip(arr, -1.0, 1.0)

    def _control(self, action: np.ndarray) -> np.ndarray:
        """Map actions in [-1, 1] to actuator controls, clipped to the actuator ranges."""
        arm = np.asarray(self._backend.qpos)[:, self.layout.arm_qpos]
        ctrl = np.empty((self.num_envs, self.model.nu))
        ctrl[:, :3] = arm + action[:, :3] * self.config.max_delta
        ctrl[:, 3:] = (S.FINGER_OPEN * 0.5 * (1.0 - action[:, 3]))[:, None]
        return np.clip(ctrl, self._ctrl_low, self._ctrl_high)

    def step_arrays(self, action: Any) -> dict[str, Any]:
        """Step all environments; return numpy arrays (the core of ``step`` and ``step_td``).

        Returns:
            ``observation`` and ``final_observation`` (dicts of arrays), ``reward`` float32 [N],
            ``terminated``, ``truncated``, ``success`` bool [N].
        """
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        action = self._check_action(action)
        self._backend.step(self._control(action))
        self._steps += 1
        obs, reward, success = self._observe()
        terminated = success.copy() if self.config.terminate_on_success else np.zeros(self.num_envs, bool)
        truncated = (self._steps >= self._max_steps[self._task]) & ~terminated
        done = terminated | truncated
        final = obs
        if done.any():
            final = {k: v.copy() for k, v in obs.items()}
            ids = np.flatnonzero(done)
            self._start_episodes(ids)
            fresh = self._observe(ids)[0]
            for key, value in fresh.items():
                obs[key][ids] = value
        self._obs = obs
        return {"observation": obs, "final_observation": final, "reward": reward.astype(np.float32),
                "terminated": terminated, "truncated": truncated, "success": success.astype(bool)}

    def reset_arrays(self, seed: int | None = None, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Start new episodes (all, or where ``mask``); ``seed`` restarts the episode streams."""
        if mask is None:
            ids = np.arange(self.num_envs)
        else:
            mask = np.asarray(mask)
            if mask.shape != (self.num_envs,) or mask.dtype != np.bool_:
                raise ValueError(f"reset mask must be a bool array of shape ({self.num_envs},); "
                                 f"got {mask.dtype} {mask.shape}")
            ids = np.flatnonzero(mask)
        if seed is not None:  # restart the episode streams of the environments reset here
            self._seed = int(seed)
            self._episode[ids] = 0
        else:  # group members may have run different numbers of episodes: they restart together
            g = self.config.group_size
            self._episode[ids] = self._episode.reshape(-1, g).max(axis=1)[ids // g]
        if len(ids):
            self._start_episodes(ids)
        self._obs = self._observe()[0]
        return {k: v.copy() for k, v in self._obs.items()}

    def entity_phrases(self) -> list[tuple[str, str]]:
        """Each environment's current episode's entities as instructions name them, ``("red block", "blue target")``."""
        return [(T.entity_phrase(int(a), int(c[a]) if a < T.NUM_COLOURED else 0),
                 T.entity_phrase(int(b), int(c[b]) if b < T.NUM_COLOURED else 0))
                for a, b, c in zip(self._a, self._b, self._colours)]

    # ----------------------------------------------------------------------------- snapshots
    _EPISODE_FIELDS = ("_task", "_a", "_b", "_instruction", "_colours", "_steps", "_episode")

    def get_state(self) -> dict[str, Any]:
        """A snapshot of every environment: physics (with sleep and warm-start state), episodes, counters.

        :meth:`set_state` on an env built with the same :class:`EnvConfig` continues bit for bit.
        """
        return {"backend": self._backend.get_state(), "seed": self._seed, "started": self._obs is not None,
                **{k: getattr(self, k).copy() for k in self._EPISODE_FIELDS}}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s snapshot (taken from an env of the same configuration).

        Raises:
            ValueError: the snapshot is of another number of environments.
        """
        for key in self._EPISODE_FIELDS:
            value = np.asarray(state[key])
            if value.shape != getattr(self, key).shape:
                raise ValueError(f"environment snapshot has {key} of shape {value.shape}, this env "
                                 f"{getattr(self, key).shape}; build the env with the config it was saved with")
        self._backend.restore(state["backend"])
        for key in self._EPISODE_FIELDS:
            setattr(self, key, np.array(state[key], dtype=getattr(self, key).dtype))
        self._seed = int(state["seed"])
        self._obs = self._observe()[0] if state["started"] else None

    # ----------------------------------------------------------------------------- gymnasium
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Gymnasium reset; ``options={"reset_mask": bool[N]}`` resets only those environments."""
        mask = (options or {}).get("reset_mask")
        obs = self.reset_arrays(seed=seed, mask=mask)
        return obs, {}

    def step(self, actions: Any):
        """Gymnasium step: (obs, reward, terminated, truncated, infos); SAME_STEP autoreset."""
        out = self.step_arrays(actions)
        done = out["terminated"] | out["truncated"]
        infos = {"success": out["success"], "_success": np.ones(self.num_envs, bool),
                 "final_obs": out["final_observation"], "_final_obs": done}
        return out["observation"], out["reward"], out["terminated"], out["truncated"], infos

    def render(self) -> np.ndarray | None:
        """The first camera's frame of every environment, [N, H, W, 3] uint8 (with rendering on)."""
        if self._obs is None or "rgb" not in self._obs:
            return None
        return self._obs["rgb"][:, 0].transpose(0, 2, 3, 1)

    def close(self, **kwargs: Any) -> None:
        """Release the renderer's GL contexts."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # ----------------------------------------------------------------------------- TensorDict view
    def reset_td(self, seed: int | None = None, mask: Any = None):
        """Reset (all, or where ``mask``) and return the observation as a TensorDict [N]."""
        if mask is not None and hasattr(mask, "numpy"):
            mask = mask.cpu().numpy()
        return _obs_td(self.reset_arrays(seed=seed, mask=mask), self.num_envs)

    def step_td(self, action: Any):
        """Step with a torch action [N, A]; return a TensorDict [N] (see docs/ARCHITECTURE.md)."""
        import torch
        from tensordict import TensorDict

        if isinstance(action, torch.Tensor):
            action = action.detach().cpu().numpy()
        out = self.step_arrays(action)
        n = self.num_envs
        return TensorDict({
            "observation": _obs_td(out["observation"], n),
            "final_observation": _obs_td(out["final_observation"], n),
            "reward": torch.from_numpy(out["reward"]),
            "terminated": torch.from_numpy(out["terminated"]),
            "truncated": torch.from_numpy(out["truncated"]),
            "success": torch.from_numpy(out["success"]),
        }, batch_size=[n])


def _obs_td(obs: dict[str, np.ndarray], n: int):
    import torch
    from tensordict import TensorDict

    return TensorDict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in obs.items()}, batch_size=[n])


def make_vec_env(task: str, num_envs: int, *, seed: int = 0, split: str = "train",
                 render: RenderConfig | bool | None = None, backend: str = "batch", group_size: int = 1,
                 **kwargs: Any) -> SimVectorEnv:
    """Create N environments of ``task`` (a task name or ``"suite"``); see :class:`EnvConfig`.

    ``render=True`` renders 64x64 RGB from the front camera; pass a :class:`RenderConfig` for more.
    Other keyword arguments are :class:`EnvConfig` fields.
    """
    if render is True:
        render = RenderConfig()
    elif render is False:
        render = None
    config = replace(EnvConfig(), task=task, num_envs=num_envs, seed=seed, split=split,
                     render=render, backend=backend, group_size=group_size, **kwargs)
    return SimVectorEnv(config)

"""The vector environment: a gymnasium ``VectorEnv`` (SAME_STEP autoreset) plus a TensorDict view.

Actions are float32 in ``[-1, 1]^4``: the first three move the gripper's position targets by up
to ``max_delta`` metres per step along x, y, z (target = current position + action * max_delta,
clipped to the joint ranges); the fourth sets the gripper (-1 open, +1 closed), mapped to the
finger actuators' range.

The environment's arrays live where its backend's do: numpy on the host for ``batch``; torch
tensors on the backend's device for ``warp`` (and for ``mjx``, whose JAX arrays reach torch by
DLPack). The core below is written once against that array module (``self._ax``); the gymnasium
API converts to numpy at its edge, the TensorDict view hands the tensors on as they are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from sims import scene as S
from sims import tasks as T
from sims.backends import BACKENDS, MJX_WARP_REMOVED, make_backend, to_numpy
from sims.deferred import DeferredChecks, deferred_checks
from sims.registry import suite_of
from sims.render import RenderConfig

ACTION_DIM = 4


class Restarts(enum.Enum):
    """When an environment whose episode ended starts its next one (:attr:`ArrayVectorEnv.restarts`)."""

    SAME_STEP = "same_step"
    """In the step that ended it (gymnasium's SAME_STEP autoreset): the host must know every end at once."""
    NEVER = "never"
    """Not at all (:meth:`ArrayVectorEnv.first_episodes`: GRPO reads each environment's first episode alone)."""
    ON_REQUEST = "on_request"
    """An episode that reached its step limit at once (the host counts steps), one ended at success when the host
    asks (:meth:`ArrayVectorEnv.deferred_restarts`): success stays on the device between the host's reads."""


#: What a step pays (``EnvConfig.reward``): the shaped reward, its change, or success alone.
REWARDS = ("dense", "progress", "success")


@dataclass(frozen=True)
class SharedSettings:
    """The settings every suite reads that a user chooses for a run, declared once: each suite's config
    (:class:`VecEnvConfig` and its subclasses) and the trainer's env section (``vla_rl.config.TrainEnvConfig``)
    are dataclasses over this one.

    Attributes:
        task: a task name of a suite (``sims.suite_of(task)`` is its suite); ``reach`` (a gantry task) unless named.
        num_envs: number of environments N.
        backend: the physics backend, one of :data:`sims.backends.BACKENDS` the suite runs on.
        warp_device: the Warp backend's device: ``"cpu"``, ``"cuda:N"``, or ``"auto"`` (the first
            GPU Warp finds, else the CPU). Observations come as torch tensors on it.
        terminate_on_success: end an episode (``terminated``) at its first success (else it runs to its
            step limit).
        success_bonus: added to the reward of every step at which the task succeeds, in [0, 100] (the
            gantry tasks' shaped reward pays a near miss almost as much as a success; a bonus makes
            finishing the task pay).
    """

    task: str = "reach"
    num_envs: int = 32
    backend: str = "batch"
    warp_device: str = "auto"
    terminate_on_success: bool = True
    success_bonus: float = 0.0

    def validate(self) -> None:
        """Check the fields (sims imports nothing of infra, so its configs raise a plain ``ValueError``).

        Raises:
            ValueError: a field out of range, naming the field and the valid values.
        """
        if self.backend == "mjx-warp":
            raise ValueError(MJX_WARP_REMOVED)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}; valid backends: {', '.join(BACKENDS)}")
        if self.num_envs < 1:
            raise ValueError(f"num_envs={self.num_envs}; it must be at least 1")
        if not 0.0 <= self.success_bonus <= 100.0:
            raise ValueError(f"success_bonus={self.success_bonus}; use a value in [0, 100]")


@dataclass(frozen=True)
class VecEnvConfig(SharedSettings):
    """What every suite's vector env reads: the :class:`SharedSettings` and what whoever builds an env sets
    for it (:data:`PER_ENV_FIELDS`); a suite's config dataclass adds its own fields (:class:`EnvConfig` for
    the gantry tasks, :class:`sims.libero.vec_env.LiberoEnvConfig` for LIBERO).

    Attributes:
        seed: base seed of the episode streams.
        split: the episodes' split, one of the suite's ``splits``.
        render: camera observations (None: state only).
        group_size: consecutive groups of this many environments share every episode's initial
            state, as GRPO needs; 1 for independent environments.
        num_threads: physics threads and GL contexts (None: one per CPU).
    """

    seed: int = 0
    split: str = "train"
    render: RenderConfig | None = None
    group_size: int = 1
    num_threads: int | None = None

    def validate(self) -> None:
        """Check the fields.

        Raises:
            ValueError: a field out of range, naming the field and the valid values.
        """
        super().validate()
        if self.group_size < 1 or self.num_envs % self.group_size:
            raise ValueError(f"group_size={self.group_size} must be >= 1 and divide num_envs={self.num_envs}")


PER_ENV_FIELDS = ("seed", "split", "render", "group_size", "num_threads", "env_offset")
"""Fields of a suite's config that whoever builds an env sets for that env (its episode stream, split, frames,
GRPO group, threads and place in a sharded set), not settings a user chooses for the run."""


def shared_settings() -> tuple[str, ...]:
    """The settings every suite reads, which a user chooses for a run: :class:`SharedSettings`' fields (a trainer's
    env section holds them beside the suite's own, :func:`suite_settings`)."""
    return tuple(f.name for f in dataclasses.fields(SharedSettings))


def suite_settings(config: type) -> tuple[str, ...]:
    """A suite config class's own settings: its fields beyond :class:`VecEnvConfig`'s, less :data:`PER_ENV_FIELDS`
    (for :class:`sims.libero.vec_env.LiberoEnvConfig`: ``max_steps``, ``controller``, ``starts``, ...)."""
    shared = {f.name for f in dataclasses.fields(VecEnvConfig)} | set(PER_ENV_FIELDS)
    return tuple(f.name for f in dataclasses.fields(config) if f.name not in shared)


@dataclass(frozen=True)
class EnvConfig(VecEnvConfig):
    """Configuration of a :class:`SimVectorEnv`: the gantry tasks' settings over :class:`VecEnvConfig`'s.

    Attributes:
        task: a task name or ``"suite"`` (a task sampled per environment and episode); the split
            (:data:`sims.tasks.SPLITS`): ``train``, ``validation``, ``paraphrase`` (held-out templates) or
            ``composition`` (held-out task x entity x colour combinations), each from its own seed stream;
            episode k of group g is sampled from ``(seed, g, k)``.
        backend: ``"batch"`` (mujoco.batch, CPU threads), ``"mjx"`` (JAX) or ``"warp"`` (MuJoCo
            Warp on ``warp_device``, rendering on the device too).
        warp_deterministic: the Warp backend runs mujoco_warp's ``DeterminismType.ALL`` (run-to-run
            identical results on a GPU, at a cost in speed and memory; at most about 4,300 worlds of
            the suite, checked before allocation). Off by default.
        warp_uncaptured: on CUDA, step the Warp backend without CUDA graphs (about 100x slower);
            otherwise a failed graph capture is an error.
        env_offset: global index of this set's first environment, when a fleet of shards splits
            one large set: environment i draws its episodes as environment ``env_offset + i`` would,
            so the shards together equal one set of the same total size.
        frame_skip: physics substeps per control step (timestep 10 ms: 40 ms per step).
        max_delta: largest gripper move per control step, metres.
        reward: what a step pays (:data:`REWARDS`). ``dense``: the task's shaped reward at the new
            state, in [0, 2.5]; it is positive at every step, so with ``terminate_on_success`` a near
            miss held to the step limit (a block 1.5 cm above its target earns about 90 % of a
            success's reward per step) can return more than finishing early. ``progress``: the change of that shaped reward over the step
            (potential-based shaping: a whole episode returns its final minus its initial shaping, so
            hovering earns nothing and finishing stops no income). ``success``: 1 at the step the task
            succeeds, else 0 (sparse). ``success_bonus`` is added in every mode.
        task_weights: relative sampling weight of tasks of ``task`` by name in the ``train`` split, e.g.
            ``{"push": 3, "stack": 3}`` (a task not named weighs 1); ``None`` samples them uniformly. The
            other splits always sample uniformly, so evaluation figures do not depend on it.
    """

    warp_deterministic: bool = False
    warp_uncaptured: bool = False
    env_offset: int = 0
    frame_skip: int = 4
    max_delta: float = 0.03
    reward: str = "dense"
    task_weights: dict[str, float] | None = None

    def validate(self) -> None:
        """Check the fields.

        Raises:
            ValueError: a field out of range, naming the field and the valid values.
        """
        task_names = T.resolve_tasks(self.task)
        T.check_split(self.split, task_names)
        super().validate()
        if self.env_offset < 0 or self.env_offset % self.group_size:
            raise ValueError(f"env_offset={self.env_offset} must be >= 0 and a multiple of group_size={self.group_size}")
        if self.frame_skip < 1 or self.max_delta <= 0:
            raise ValueError(f"frame_skip={self.frame_skip} and max_delta={self.max_delta} must be positive")
        if self.reward not in REWARDS:
            raise ValueError(f"reward={self.reward!r}; valid rewards: {', '.join(REWARDS)}")
        if self.task_weights is not None:
            try:
                T.task_weight_tuple(self.task, self.task_weights)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"task_weights={self.task_weights}: {exc}") from None


class ArrayVectorEnv(gym.vector.VectorEnv):
    """The gymnasium and TensorDict edges of a vector env whose core is ``reset_arrays`` / ``step_arrays``.

    A subclass sets ``num_envs``, ``single_action_space``, ``device`` (None: numpy on the host, else the
    torch device of its arrays), ``_ax`` (the module of its arrays), ``config`` (its ``group_size``),
    ``_seed`` and ``_episode`` (the episode stream's seed and each environment's episode count, int [N])
    and ``_obs`` (the last observation, None before the first reset), and implements
    ``_start_episodes(ids)``, ``_observe(ids)`` (the observation of environments ``ids``, None: all, first in
    a tuple of what it computes; ``frames=False``: without the frame keys ``FRAME_KEYS``), ``_render(ids)`` (those
    frames alone; a suite without frames never calls it), ``_observe_reset()`` (refresh ``_obs``) and
    ``step_arrays(action)`` (see :meth:`SimVectorEnv.step_arrays`, which ends with :meth:`_autoreset`). Snapshots: the class lists its
    per-environment episode arrays in ``_EPISODE_FIELDS`` and implements ``_physics_state()``,
    ``_snapshot_fit()``, ``_restore_physics(state)`` and ``_restored(started)``; :meth:`get_state` and
    :meth:`set_state` are written here once.
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"]}
    num_envs: int
    device: Any
    config: Any
    _ax: Any
    _obs: dict[str, Any] | None
    _seed: int
    _episode: np.ndarray
    deferred: DeferredChecks | None = None
    """Set inside :meth:`deferred_checks`: where the action checks of device arrays go."""
    host_done: tuple[np.ndarray, np.ndarray] | None = None
    """The last step's ``(terminated, truncated)`` bool [N] as the host computed them (None: not kept, or not known
    to the host: inside :meth:`first_episodes`)."""
    restarts: Restarts = Restarts.SAME_STEP
    """When an environment whose episode ended starts its next one (:class:`Restarts`)."""
    _ended: Any = None
    """Inside :meth:`deferred_restarts`: bool [N] of the env's module, the episodes ended at success and not yet
    restarted (None: none yet)."""
    _requested: np.ndarray | None = None
    """Host bool [N]: the environments to restart at the end of the next step (:meth:`request_restarts`)."""
    timing_sync: Any = None
    """Called before each reading of the render clock (``vla_rl.rollout.Timer``: a device wait), or None."""
    FRAME_KEYS: ClassVar[tuple[str, ...]] = ()
    """The observation keys a render produces (with rendering on)."""
    final_frames: bool = True
    """Whether ``final_observation`` carries the frames (``FRAME_KEYS``) of the episodes that ended, drawn at their
    last state. A consumer that reads none of them sets it False (the PPO collector when its critic reads no
    pixels, GRPO, which reads no final observation): a step then renders every world once, after the resets,
    and ``final_observation`` holds no frame keys. On: an ended world is drawn twice (its last and its first
    frame), and the device renderer, which draws every world, renders twice on a step with resets."""

    draw_frames: bool = True
    """Whether a step draws frames (``FRAME_KEYS``). The collector and the evaluation turn it off for the inner
    steps of an open-loop action chunk, whose observations nobody reads while ``final_frames`` is off: such a step's
    observation then holds no frame keys, and drawing is most of a rendering suite's step time."""

    def reset_arrays(self, seed: int | None = None, mask: np.ndarray | None = None) -> dict[str, Any]:
        """Start new episodes (all, or where ``mask``); ``seed`` restarts the episode streams."""
        if mask is None:
            ids = np.arange(self.num_envs)
        else:
            mask = np.asarray(mask)
            if mask.shape != (self.num_envs,) or mask.dtype != np.bool_:
                raise ValueError(f"reset mask must be a bool array of shape ({self.num_envs},); "
                                 f"got {mask.dtype} {mask.shape}")
            ids = np.flatnonzero(mask)
        self._forget_ends(ids)
        if seed is not None:  # restart the episode streams of the environments reset here
            self._seed = int(seed)
            self._episode[ids] = 0
        else:  # group members may have run different numbers of episodes: they restart together
            g = self.config.group_size
            self._episode[ids] = self._episode.reshape(-1, g).max(axis=1)[ids // g]
        if len(ids):
            self._start_episodes(ids)
        self._observe_reset()
        return {k: self._ax.asarray(v, copy=True) for k, v in self._obs.items()}

    def _forget_ends(self, ids: np.ndarray) -> None:
        """Environments ``ids`` start new episodes: no end of theirs is pending any more."""
        if self._requested is not None:
            self._requested[ids] = False
        if self._ended is not None:
            mask = np.zeros(self.num_envs, bool)
            mask[ids] = True
            self._ended = self._ended & ~self._ax.asarray(mask)

    @property
    def control_hz(self) -> float:
        """Control steps per second of simulated time."""
        raise NotImplementedError

    def episode_tags(self, i: int) -> dict[str, Any]:
        """What identifies environment ``i``'s current episode beyond its index and count (a dataset's per-episode
        metadata); none by default."""
        return {}

    def _start_episodes(self, ids: np.ndarray) -> None:
        raise NotImplementedError

    def _observe(self, ids: np.ndarray | None = None, frames: bool = True) -> tuple[Any, ...]:
        raise NotImplementedError

    def _render(self, ids: np.ndarray | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def _autoreset(self, final: dict[str, Any], done: np.ndarray) -> tuple[dict[str, Any], dict[str, Any],
                                                                           tuple[Any, ...] | None]:
        """SAME_STEP autoreset: start the next episode of the environments ``done`` (bool [N]), rendering each
        world once (an ended one twice with :attr:`final_frames`: its last frame and its first).

        Args:
            final: the step's observation of every environment without frames (``_observe(frames=False)``).

        Returns:
            The observation after the step (``final`` with the environments that ended replaced by their next
            episode's first observation, and every world's frames); the final observation (``final``, with the
            frames where :attr:`final_frames` keeps them, at every step: the ended worlds' drawn before their reset,
            the others' those of the observation, their state being the same); and, when some ended, ``(rows, *rest)``: their
            indices (as the env's array module) and the rest of :meth:`_observe`'s result for them (the gantry env's
            shaped reward and success), else None.
        """
        rendering = self.config.render is not None and self.draw_frames
        if not done.any():
            obs = {**final, **self._render()} if rendering else final
            return obs, (obs if self.final_frames else final), None  # the same keys at every step
        ax, ids = self._ax, np.flatnonzero(done)
        last = self._render(ids) if rendering and self.final_frames else None
        self._start_episodes(ids)
        fresh, *rest = self._observe(ids, frames=False)
        obs = {k: ax.asarray(v, copy=True) for k, v in final.items()}
        rows = ax.asarray(ids)
        for key, value in fresh.items():
            obs[key][rows] = value
        if rendering:
            frames = self._render()  # every world at once: the continuing ones' and the fresh ones'
            obs.update(frames)
            if last is not None:
                final = {**final, **{k: ax.asarray(v, copy=True) for k, v in frames.items()}}
                for key, value in last.items():
                    final[key][rows] = value
        return obs, final, (rows, *rest)

    # ----------------------------------------------------------------------------- snapshots
    _EPISODE_FIELDS: ClassVar[tuple[str, ...]] = ()

    def get_state(self) -> dict[str, Any]:
        """A snapshot of every environment (plain data): the physics (``_physics_state``), the episode arrays
        ``_EPISODE_FIELDS``, the seed and whether the env was reset. :meth:`set_state` on an env built with the
        same config continues bit for bit (the next episodes follow from the seed and the episode counts)."""
        return {**self._physics_state(), "seed": self._seed, "started": self._obs is not None,
                "restart_requested": self._pending_restarts().copy(),
                **{k: getattr(self, k).copy() for k in self._EPISODE_FIELDS}}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s snapshot (taken from an env of the same configuration).

        Raises:
            ValueError: the snapshot does not fit this env (other tasks, split or sizes), naming both.
        """
        saved, ours = self._snapshot_fit(state), self._snapshot_fit()
        if saved != ours:
            raise ValueError(f"environment snapshot of {saved} does not fit this env's {ours}; "
                             "build the env with the config it was saved with")
        self._restore_physics(state)
        for key in self._EPISODE_FIELDS:
            setattr(self, key, np.array(state[key], dtype=getattr(self, key).dtype))
        self._seed = int(state["seed"])
        # Episodes ended at success whose restart was requested (a deferred-restart block's end) restart at the
        # next step; they stay ended until then. Snapshots from before deferred restarts hold none.
        requested = np.asarray(state.get("restart_requested", np.zeros(self.num_envs, bool)), bool)
        self._requested = requested.copy() if requested.any() else None
        self._restored(bool(state["started"]))
        self._ended = self._ax.asarray(requested) if requested.any() else None

    def _physics_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _snapshot_fit(self, state: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """What a snapshot (None: this env) must share with this env to be restored in it (by default the
        episode arrays' shapes)."""
        src = state if state is not None else {k: getattr(self, k) for k in self._EPISODE_FIELDS}
        return tuple(np.shape(src[k]) for k in self._EPISODE_FIELDS)

    def _restore_physics(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _restored(self, started: bool) -> None:
        """After a restore: re-derive what follows from the state (the last observation, if it was reset)."""
        raise NotImplementedError

    def _observe_reset(self) -> None:
        raise NotImplementedError

    def step_arrays(self, action: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _check_action(self, action: Any) -> Any:
        """Validate and clip an action batch; raise before touching any environment."""
        expected = (self.num_envs, *self.single_action_space.shape)
        ax = self._ax
        try:
            arr = ax.asarray(action, dtype=ax.float32)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"action must be a float array of shape {expected}: {exc}") from exc
        if tuple(arr.shape) != expected:
            raise ValueError(f"action has shape {tuple(arr.shape)}; expected {expected} (num_envs, action_dim)")
        bad = ~ax.all(ax.isfinite(arr), axis=1)
        if self.deferred is not None and not isinstance(bad, np.ndarray):  # device arrays: read at the block's end
            self.deferred.add("action", bad)
        elif bad.any():
            raise ValueError(f"action holds NaN or inf for environments {np.flatnonzero(to_numpy(bad))[:10].tolist()}; "
                             "no environment was stepped — check the policy's outputs")
        return ax.clip(arr, -1.0, 1.0)

    @contextlib.contextmanager
    def first_episodes(self) -> Iterator[None]:
        """A block in which no episode restarts (GRPO's collection, which reads each environment's first episode
        alone, from a reset to its end): an environment whose episode ended keeps stepping it, unread, and
        nothing is sampled, reset or drawn for a next one. ``terminated`` then stays an array of the env's module
        and is not read by the host, so with ``terminate_on_success`` on a device backend a step reads nothing
        back (``host_done`` is None); ``truncated`` still comes from the host's step count."""
        self.restarts, self.host_done = Restarts.NEVER, None
        try:
            yield
        finally:
            self.restarts = Restarts.SAME_STEP

    @contextlib.contextmanager
    def deferred_restarts(self) -> Iterator[None]:
        """A block in which an episode that ends at success restarts only when the host asks
        (:meth:`request_restarts`), so that success stays on the device between the host's reads: PPO's collection
        on a device backend with ``terminate_on_success``, which reads the ended episodes a fixed number of times
        per rollout instead of once per control step. Until its restart such an environment keeps stepping its
        ended episode, unread; :attr:`ended` says which those are. An episode that reaches its step limit restarts
        in the step that ends it, as outside the block (the host counts steps). At the block's end the host reads
        the ended episodes once and requests their restarts: they happen at the next step (a snapshot keeps the
        requests). Where the env's arrays are the host's, or success ends no episode, the block changes nothing."""
        if self.device is None or not self.config.terminate_on_success:
            yield
            return
        self.restarts, self.host_done = Restarts.ON_REQUEST, None
        try:
            yield
        finally:
            self.restarts = Restarts.SAME_STEP
            self.request_restarts()

    @property
    def ended(self) -> Any:
        """Inside :meth:`deferred_restarts`: bool [N] of the env's module, the environments whose episode ended at
        success and has not restarted yet (their steps belong to no episode); None outside it."""
        if self.restarts is not Restarts.ON_REQUEST:
            return None
        return self._ax.zeros(self.num_envs, dtype=self._ax.bool_) if self._ended is None else self._ended

    def request_restarts(self) -> None:
        """Restart the episodes that ended at success (:attr:`ended`) at the end of the next step: one read of the
        device."""
        if self._ended is not None:
            self._requested = self._pending_restarts() | to_numpy(self._ended).astype(bool)

    def _pending_restarts(self) -> np.ndarray:
        return np.zeros(self.num_envs, bool) if self._requested is None else self._requested

    def _episode_ends(self, success: Any, max_steps: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        """A step's episode ends from its ``success`` [N] (the env's module) and each environment's step limit
        ``max_steps`` (numpy int [N]), by :attr:`restarts`.

        Returns:
            ``terminated`` and ``truncated`` (bool [N], the env's module), and the host's mask of the environments
            to restart now (numpy bool [N]). With :attr:`Restarts.SAME_STEP` success comes back to the host when it
            ends episodes (``terminate_on_success``; on a device backend a read per step), and ``host_done`` keeps
            the host's flags; an environment whose restart was requested restarts, ``terminated``.
        """
        ax, n = self._ax, self.num_envs
        reached = self._steps >= max_steps
        if self.restarts is Restarts.NEVER:
            terminated = (ax.astype(success, ax.bool_) if self.config.terminate_on_success
                          else ax.zeros(n, dtype=ax.bool_))
            return terminated, ax.asarray(reached) & ~terminated, np.zeros(n, bool)
        requested, self._requested = self._pending_restarts(), None
        if self.restarts is Restarts.ON_REQUEST:
            terminated = ax.astype(success, ax.bool_)
            restart = reached | requested
            ended = terminated if self._ended is None else self._ended | terminated
            self._ended = ended & ~ax.asarray(restart)
            # The host's flags hold the ends it knows: the requested restarts, and the step limits.
            self.host_done = (requested, reached & ~requested)
            return terminated, ax.asarray(reached) & ~terminated, restart
        success_ends = (to_numpy(success).astype(bool) if self.config.terminate_on_success
                        else np.zeros(n, bool))
        terminated = success_ends | requested
        truncated = reached & ~terminated
        self.host_done = (terminated, truncated)  # the collector's, read without touching the device
        if requested.any():
            self._forget_ends(np.flatnonzero(requested))
        return ax.asarray(terminated), ax.asarray(truncated), terminated | truncated

    def deferred_checks(self) -> contextlib.AbstractContextManager:
        """A block whose action and overflow checks of device arrays are read once, at its end
        (:func:`sims.deferred.deferred_checks`): the training loop's rollout, one host sync, not one per step."""
        return deferred_checks(self, getattr(self, "_backend", None))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Gymnasium reset; ``options={"reset_mask": bool[N]}`` resets only those environments."""
        mask = (options or {}).get("reset_mask")
        obs = self.reset_arrays(seed=seed, mask=to_numpy(mask) if mask is not None else None)
        return _numpy(obs), {}

    def step(self, actions: Any):
        """Gymnasium step: (obs, reward, terminated, truncated, infos) as numpy; SAME_STEP autoreset."""
        out = _numpy(self.step_arrays(actions))
        done = out["terminated"] | out["truncated"]
        infos = {"success": out["success"], "_success": np.ones(self.num_envs, bool),
                 "final_obs": out["final_observation"], "_final_obs": done}
        return out["observation"], out["reward"], out["terminated"], out["truncated"], infos

    def render(self) -> np.ndarray | None:
        """The first camera's frame of every environment, [N, H, W, 3] uint8 (with rendering on)."""
        if self._obs is None or "rgb" not in self._obs:
            return None
        return to_numpy(self._obs["rgb"][:, 0]).transpose(0, 2, 3, 1)

    # ----------------------------------------------------------------------------- TensorDict view
    def reset_td(self, seed: int | None = None, mask: Any = None):
        """Reset (all, or where ``mask``) and return the observation as a TensorDict [N]."""
        if mask is not None:
            mask = to_numpy(mask)
        return _obs_td(self.reset_arrays(seed=seed, mask=mask), self.num_envs, self.device)

    def step_td(self, action: Any):
        """Step with a torch action [N, A]; return a TensorDict [N] (see docs/ARCHITECTURE.md).

        On a device backend the action may stay on the device and the result lives there (no copy).
        """
        from tensordict import TensorDict

        if self.device is None and hasattr(action, "detach"):
            action = action.detach().cpu().numpy()
        out = self.step_arrays(action)
        n = self.num_envs
        return TensorDict({
            "observation": _obs_td(out["observation"], n, self.device),
            "final_observation": _obs_td(out["final_observation"], n, self.device),
            **{k: _tensor(out[k]) for k in ("reward", "terminated", "truncated", "success")},
        }, batch_size=[n], device=self.device)


class SimVectorEnv(ArrayVectorEnv):
    """N environments of the tabletop suite on one physics backend (see :class:`EnvConfig`).

    Observations are dicts of arrays with a leading N: ``proprio`` float32 [N, 13], ``state``
    float32 [N, 42], ``instruction`` int64 [N] (index into :attr:`instructions`), ``task`` int64 [N]
    (index into :attr:`task_names`), and with rendering ``rgb`` uint8 [N, cams, 3, H, W] (and
    ``depth`` float32 [N, cams, H, W] when asked for) and ``goal_pixel`` float32 [N, cams, 2]: where
    the point the gripper tip should reach appears in each camera (x right, y down, the image
    spanning [-1, 1]), and ``object_goal_pixel`` the same for where the instructed entity should go
    (push: the pad, stack: on the other block); both privileged, like ``state``: for auxiliary
    losses, never for acting. Autoreset is SAME_STEP: an environment that
    ends is reset within the same ``step``; ``infos["final_obs"]`` holds every environment's
    observation before that reset (equal to the returned one where nothing ended), with
    ``infos["_final_obs"]`` the mask of those that ended; its frames only while ``final_frames`` is on
    (the default; see :class:`ArrayVectorEnv`).
    """

    FRAME_KEYS = ("rgb", "depth", "goal_pixel", "object_goal_pixel")

    def __init__(self, config: EnvConfig):
        """Build the scene, the backend and (if asked for) the renderer."""
        self.config = config
        config.validate()
        self.task_names: tuple[str, ...] = T.resolve_tasks(config.task)
        self.model, self.layout = S.build_model()
        self.num_envs = config.num_envs
        self.instructions: list[str] = T.instruction_table(self.task_names, config.split)
        self._instruction_index = {s: i for i, s in enumerate(self.instructions)}
        self._backend = make_backend(config.backend, self.model, self.num_envs, config.frame_skip,
                                     config.num_threads, warp_device=config.warp_device, render=config.render,
                                     colour_geoms=self.layout.colour_geoms,
                                     warp_deterministic=config.warp_deterministic,
                                     warp_uncaptured=config.warp_uncaptured)
        xp = self._backend.xp
        self._ax = ax = self._backend.ax
        #: Where observations live: None for numpy on the host, else the torch device of the tensors.
        self.device = getattr(ax, "device", None)
        self._evaluate = self._backend.compile(
            lambda qpos, qvel, mocap, task, a, b: T.task_signals(xp, qpos, qvel, mocap, task, a, b,
                                                             self.task_names, self.layout))
        self._renderer = None
        if config.render is not None and not self._backend.renders:
            from sims.render import BatchRenderer

            self._renderer = BatchRenderer(self.model, config.render)
        self._max_steps = np.array([T.TASKS[n].max_steps for n in self.task_names])
        self._task_p = None  # probability of each task in the train split (None: uniform)
        if config.task_weights is not None and config.split == "train":
            weights = T.task_weight_tuple(config.task, config.task_weights)
            self._task_p = np.asarray(weights, dtype=np.float64) / sum(weights)
        self.max_episode_steps = int(self._max_steps.max())  # control steps; an episode truncates by then
        self._ctrl_low = ax.asarray(self.model.actuator_ctrlrange[:, 0].copy())
        self._ctrl_high = ax.asarray(self.model.actuator_ctrlrange[:, 1].copy())

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
            spaces["object_goal_pixel"] = gym.spaces.Box(-np.inf, np.inf, (cams, 2), np.float32)
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
        self._obs: dict[str, Any] | None = None
        self._shaped: Any = None  # the shaped reward at the current state ([N]): ``progress``'s baseline
        self._goal_points: Any = None  # the task code's goal points at the current state, [N, P, 3]: what frames locate
        self._sync_episodes()
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
            ep = T.sample_episode(rng, self.task_names, self.config.split, self.layout, nmocap, self._task_p)
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
        if self._backend.renders:
            self._backend.set_colours(ids, T.PALETTE_RGBA[self._colours[ids]])
        self._sync_episodes()

    def _sync_episodes(self) -> None:
        """The episode arrays as the backend's task code (``xp``) and the observations (``ax``) read them."""
        xp, ax = self._backend.xp, self._ax
        self._episode_xp = tuple(xp.asarray(v) for v in (self._task, self._a, self._b))
        self._episode_ax = {"instruction": ax.asarray(self._instruction, copy=True),
                            "task": ax.asarray(self._task, copy=True)}

    def _observe(self, ids: np.ndarray | None = None, frames: bool = True) -> tuple[dict[str, Any], Any, Any]:
        """Observation, shaped reward and success of environments ``ids`` (None: all) at the current state
        (``frames=False``: without the frames, :meth:`_render`'s).

        Arrays of the env's module (numpy, or torch on the device). The task code runs on every
        environment (one compiled shape for jitted backends); its goal points are kept for :meth:`_render`.
        """
        ax, b = self._ax, self._backend
        out = self._evaluate(b.qpos, b.qvel, b.mocap_pos, *self._episode_xp)
        out = {k: ax.asarray(v) for k, v in out.items()}  # numpy: as is; JAX: DLPack, no copy
        self._goal_points = out["goal_points"]  # of the current state, every environment
        sel = slice(None) if ids is None else ax.asarray(ids)
        obs = {
            "proprio": out["proprio"][sel],
            "state": out["state"][sel],
            # Copies: the episode arrays are shared until the next reset.
            **{k: ax.asarray(v[sel], copy=True) for k, v in self._episode_ax.items()},
        }
        if frames and self.config.render is not None:
            obs.update(self._render(ids))
        return obs, out["reward"][sel], out["success"][sel]

    def _render(self, ids: np.ndarray | None = None) -> dict[str, Any]:
        """Frames (``FRAME_KEYS``) of environments ``ids`` (None: all) at the current state, located with the goal
        points of the last :meth:`_observe`; the device renderer draws every world and returns those rows."""
        ax, b = self._ax, self._backend
        goal = self._goal_points
        if self.timing_sync is not None:
            self.timing_sync()
        start = time.perf_counter()
        if b.renders:  # every world at once, on the device
            frames = b.render(goal)
            if ids is not None:
                frames = {k: v[ax.asarray(ids)] for k, v in frames.items()}
        else:
            rows = np.arange(self.num_envs) if ids is None else np.asarray(ids)
            frames = self._renderer.render(to_numpy(b.qpos)[rows], to_numpy(b.mocap_pos)[rows],
                                           T.PALETTE_RGBA[self._colours[rows]], self.layout,
                                           to_numpy(goal)[rows], env_ids=self.config.env_offset + rows)
            frames = {k: ax.asarray(v) for k, v in frames.items()}
        if self.timing_sync is not None:
            self.timing_sync()
        self.timings["render"] += time.perf_counter() - start
        pixels = frames.pop("pixels")
        frames["goal_pixel"], frames["object_goal_pixel"] = pixels[:, :, 0], pixels[:, :, 1]
        return frames

    def _reward(self, shaped: Any, success: Any) -> Any:
        """A step's reward (see ``EnvConfig.reward``) from the shaped reward at the new state, [N]."""
        ax, mode = self._ax, self.config.reward
        reward = shaped
        if mode == "progress":
            reward = shaped - self._shaped
        elif mode == "success":
            reward = ax.astype(success, ax.float32)
        if self.config.success_bonus:
            reward = reward + self.config.success_bonus * ax.astype(success, ax.float32)
        return reward

    # ----------------------------------------------------------------------------- core
    def _control(self, action: Any) -> Any:
        """Map actions in [-1, 1] to actuator controls, clipped to the actuator ranges."""
        ax = self._ax
        arm = ax.asarray(self._backend.qpos)[:, self.layout.arm_qpos]
        fingers = S.FINGER_OPEN * 0.5 * (1.0 - action[:, 3:4])
        ctrl = ax.concatenate([arm + action[:, :3] * self.config.max_delta,
                               ax.concatenate([fingers] * (self.model.nu - 3), axis=1)], axis=1)
        return ax.clip(ctrl, self._ctrl_low, self._ctrl_high)

    def step_arrays(self, action: Any) -> dict[str, Any]:
        """Step all environments (the core of ``step`` and ``step_td``).

        Returns arrays of the env's module (numpy; torch on the device for ``warp`` and ``mjx``):
            ``observation`` and ``final_observation`` (dicts of arrays; the latter without frame keys when
            ``final_frames`` is off), ``reward`` float32 [N], ``terminated``, ``truncated``, ``success`` bool [N].
        """
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        ax = self._ax
        action = self._check_action(action)
        self._backend.step(self._control(action))
        self._steps += 1
        final, shaped, success = self._observe(frames=False)  # frames once the resets are known (_autoreset)
        reward = self._reward(shaped, success)
        # Episode bookkeeping is the host's (resets sample episodes there): N bools come back where episodes restart.
        terminated, truncated, done = self._episode_ends(success, self._max_steps[self._task])
        obs, final, reset = self._autoreset(final, done)
        if reset is not None:  # ``progress`` continues from the new episodes' shaped reward
            rows, fresh_shaped, _ = reset
            shaped = ax.asarray(shaped, copy=True)
            shaped[rows] = fresh_shaped
        self._obs, self._shaped = obs, shaped
        return {"observation": obs, "final_observation": final, "reward": reward,
                "terminated": terminated, "truncated": truncated, "success": success}

    def _observe_reset(self) -> None:
        self._obs, self._shaped, _ = self._observe()

    @property
    def control_hz(self) -> float:
        """Control steps per second: one per ``frame_skip`` physics steps (25 Hz by default)."""
        return 1.0 / (self.config.frame_skip * self.model.opt.timestep)

    def entity_phrases(self) -> list[tuple[str, str]]:
        """Each environment's current episode's entities as instructions name them, ``("red block", "blue target")``."""
        return [(T.entity_phrase(int(a), int(c[a]) if a < T.NUM_COLOURED else 0),
                 T.entity_phrase(int(b), int(c[b]) if b < T.NUM_COLOURED else 0))
                for a, b, c in zip(self._a, self._b, self._colours)]

    def close(self, **kwargs: Any) -> None:
        """Release the renderer's GL contexts."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # ----------------------------------------------------------------------------- snapshots
    _EPISODE_FIELDS = ("_task", "_a", "_b", "_instruction", "_colours", "_steps", "_episode")

    def _physics_state(self) -> dict[str, Any]:
        """The backend's snapshot (physics with sleep and warm-start state)."""
        return {"backend": self._backend.get_state()}

    def _restore_physics(self, state: dict[str, Any]) -> None:
        self._backend.restore(state["backend"])

    def _restored(self, started: bool) -> None:
        self._sync_episodes()
        # The shaped reward is a function of the state, so ``progress`` needs nothing more in the snapshot.
        self._obs, self._shaped = self._observe()[:2] if started else (None, None)


def _numpy(tree: Any) -> Any:
    """Numpy arrays for the arrays of a (nested) dict of numpy arrays or torch tensors."""
    if isinstance(tree, dict):
        return {k: _numpy(v) for k, v in tree.items()}
    return to_numpy(tree)


def _tensor(x: Any):
    import torch

    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))


def _obs_td(obs: dict[str, Any], n: int, device: Any = None):
    from tensordict import TensorDict

    return TensorDict({k: _tensor(v) for k, v in obs.items()}, batch_size=[n], device=device)


def make_vec_env(task: str, num_envs: int, *, seed: int = 0, split: str = "train",
                 render: RenderConfig | bool | None = None, backend: str = "batch", group_size: int = 1,
                 **kwargs: Any) -> ArrayVectorEnv:
    """Create N environments of ``task``, in the suite that claims it (:func:`sims.registry.suite_of`: a gantry
    task name or ``"suite"``, a LIBERO ``libero_spatial`` or ``libero_goal/3``, ...).

    ``render=True`` renders the suite's default frames (``Suite.frames``: 64x64 RGB of the front camera for the
    gantry tasks); pass a :class:`RenderConfig` for more. Other keyword arguments are fields of the suite's config
    (:class:`EnvConfig`, :class:`sims.libero.vec_env.LiberoEnvConfig`).

    Raises:
        ValueError: ``render=True`` for a suite that renders no frames.
    """
    suite = suite_of(task)
    if render is True:
        if suite.frames is None:
            raise ValueError(f"render=True: the {suite.name} suite renders no frames; pass render=None")
        render = suite.frames
    elif render is False:
        render = None
    return suite.make(suite.config(task=task, num_envs=num_envs, seed=seed, split=split, render=render,
                                   backend=backend, group_size=group_size, **kwargs))

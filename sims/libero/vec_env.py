"""LIBERO tasks as a vector environment behind the trainer's interface (docs/ARCHITECTURE.md, "sims -> vla_rl").

``sims.make_vec_env("libero_spatial", num_envs)`` (the LIBERO suite's entry in :mod:`sims.registry`,
:mod:`sims.libero.plugin`, claims the task names ``libero_...``) gives a :class:`LiberoVectorEnv`: ``libero_<suite>`` runs the suite's ten
tasks (environments split into one contiguous block per task, one :class:`~sims.libero.sim.LiberoSim`
each), ``libero_<suite>/<i>`` one task, several joined by ``+`` all of theirs (each with its suite's step limit).
Suites: ``spatial``, ``object``, ``goal``, ``10``.

- **Actions**: LIBERO's, float32 [N, 7] in [-1, 1] (end-effector position delta x 5 cm, world-frame
  axis-angle delta x 0.5 rad, gripper -1 open .. +1 closed) at 20 Hz, through the batched
  ``controller``: ``servo`` (:class:`~sims.libero.controller.PandaController`, joint servos) or ``osc``
  (:class:`~sims.libero.osc.OscController`, LIBERO's own OSC_POSE on its torque motors).
- **Observations**: ``proprio`` float32 [N, 8], LIBERO's state (end-effector position, axis-angle,
  the two finger positions); ``state`` float32 [N, S] (privileged: arm joint angles [7], then every
  non-robot ``qpos``, objects' free joints and articulations, zero-padded to the longest task of the
  env); ``rgb`` uint8 [N, 2, 3, H, W] of ``agentview`` and ``robot0_eye_in_hand`` when rendering;
  ``instruction`` int64 [N], an index into ``instructions`` (the task's BDDL ``:language``, or a paraphrase:
  below) and ``task`` int64 [N].
- **Reward and success**: the task's goal predicates (:mod:`sims.libero.predicates`); LIBERO has
  no shaping, so the reward is 1 at each step the goal holds (plus ``success_bonus``), else 0.
- **Episodes** start from a state, then hold still for ``settle_steps`` control steps (gripper open) before the
  policy's first observation, as LIBERO's evaluation waits 10 steps for the objects to settle; the settling runs
  on a private ``MjData`` per start, so the other environments do not move. An episode ends at success
  (``terminate_on_success``) or after LIBERO's step limit for the suite (:data:`MAX_STEPS`). Splits
  (:data:`LIBERO_SPLITS`): ``train`` and ``validation`` start (``starts="regions"``, the default) from LIBERO's
  own placement rules (:mod:`sims.libero.regions`: objects and fixtures sampled in their BDDL regions by LIBERO's
  code, one start per seed, drawn per episode from ``(seed, group, episode, split)`` among the split's own
  starts: the two splits share none), the fixtures standing where that start put them; ``fixed``: LIBERO's 50
  fixed initial states themselves, in order (group ``j`` of a task's ``M`` groups plays states ``j, j + M,
  ...``), the states LIBERO evaluates on; ``lan``: LIBERO-PRO's ``_lan`` variant, the same scenes with
  paraphrased instructions and the variant's own 50 fixed initial states; ``paraphrase``: the 50 fixed initial
  states with the project's held-out paraphrases (:mod:`sims.libero.paraphrase`), one drawn per episode. The
  fixed states are test data; ``starts="jitter"`` (an opt-in) starts ``train`` and ``validation`` from them
  instead, each free object shifted by up to ``jitter`` metres in x and y (an object that LIBERO places on
  another free object by its support's shift, :func:`jitter_roots`; each split its own seed stream): a policy
  trained there has seen its test states nearly as they are.
- **Instructions** (``instructions``): ``original``, the task's own in every split but ``lan`` and
  ``paraphrase``; ``paraphrase``, training (validation) episodes draw the task's own or one of its
  training (validation) paraphrases, two pools that share no sentence. ``instructions`` (the table ``instruction``
  indexes) lists every one the split can issue.
- **Snapshots**: :meth:`LiberoVectorEnv.get_state` / :meth:`~LiberoVectorEnv.set_state` (plain data, for
  checkpoints) continue bit for bit in an env of the same config, frames included.
- **Mesh detail**: ``visual_faces`` triangles per visual-only mesh (:mod:`sims.libero.toolchain.lod`; None: LIBERO's
  full meshes); frames only, the physics is the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

from sims.deferred import deferred_checks
from sims.libero import osc
from sims.libero.paraphrase import INSTRUCTION_MODES, InstructionSampler, check_mode, split_groups
from sims.libero.regions import draw, load_region_starts, split_pool
from sims.libero.scene import (
    MIN_VISUAL_FACES,
    VISUAL_FACES,
    LiberoLayout,
    LiberoTask,
    build_model,
    load_lan,
    load_task,
)
from sims.libero.sim import LiberoSim
from sims.libero.suites import MAX_STEPS, parse_task_id, resolve_libero_task
from sims.render import RenderConfig
from sims.tasks import weights_by_name
from sims.vec_env import ArrayVectorEnv, VecEnvConfig

LIBERO_SPLITS = ("train", "validation", "fixed", "lan", "paraphrase")
FIXED_STATE_SPLITS = ("fixed", "lan", "paraphrase")  # test splits: LIBERO's fixed initial states, in order
BACKENDS = ("batch", "warp")
"""The physics backends LIBERO runs on."""
SETTLE_STEPS = 10
ACTION_DIM = 7
PROPRIO_DIM = 8
_STREAM = {"train": 0x11B0, "validation": 0x11B1}  # seed streams of the jittered splits
#: Arm controllers by name, and the arm each drives (:func:`sims.libero.scene.build_model`'s ``arm``).
CONTROLLERS = {"servo": "servo", "osc": "torque"}
STARTS = ("regions", "jitter")


@dataclass(frozen=True)
class LiberoEnvConfig(VecEnvConfig):
    """Configuration of a :class:`LiberoVectorEnv` (see the module docstring): the settings every suite
    reads (:class:`sims.vec_env.VecEnvConfig`) and LIBERO's own.

    Attributes:
        task: ``libero_<suite>`` or ``libero_<suite>/<i>``.
        num_envs: environments N (at least one group per task).
        split: one of :data:`LIBERO_SPLITS`.
        render: camera frames (None: none), RGB only; LIBERO's textures are always on, ``samples=None`` is no
            multisampling (LIBERO's model asks 4: twice the CPU per frame for anti-aliased edges, a mean 2-level
            difference at 128x128), and its ``num_contexts`` GL contexts (None: one per CPU core) are shared out
            over the tasks, at least one each.
        backend: ``batch`` or ``warp``.
        max_steps: episode length in control steps (None: :data:`MAX_STEPS` of the suite).
        settle_steps: control steps held still before an episode's first observation.
        jitter: largest x/y shift of each free object in the ``train`` and ``validation`` splits, metres.
        cache: the task cache (None: :func:`sims.libero.suites.cache_dir`'s default).
        visual_faces: triangle budget of each visual-only mesh (:mod:`sims.libero.toolchain.lod`; at least
            :data:`~sims.libero.scene.MIN_VISUAL_FACES`), None: LIBERO's full meshes; physics is the same either way.
        controller: one of :data:`CONTROLLERS` (see the module docstring).
        starts: where the ``train`` and ``validation`` splits start: ``regions`` (LIBERO's region sampler,
            :mod:`sims.libero.regions`; ``scripts/setup_libero.py --region-starts K`` writes them) or ``jitter`` (the
            fixed states, LIBERO's test states, shifted by ``jitter``: an opt-in).
        instructions: what ``train`` and ``validation`` episodes are instructed with, one of
            :data:`~sims.libero.paraphrase.INSTRUCTION_MODES` (``original``: the task's own only).
        task_weights: each task's share of the environments by task id, e.g. ``{"10/8": 3}`` (a task not named
            weighs 1; None: shared evenly): after one group each, the other groups go to the tasks in proportion to
            their weights (an expert's slow or often failing task gets more environments for its demonstrations).

    A step pays success only (LIBERO's goals are predicates; there is no shaped reward), plus ``success_bonus``.
    """

    max_steps: int | None = None
    settle_steps: int = SETTLE_STEPS
    jitter: float = 0.01
    cache: str | None = None
    visual_faces: int | None = VISUAL_FACES
    controller: str = "osc"
    starts: str = "regions"
    instructions: str = INSTRUCTION_MODES[0]
    task_weights: dict[str, float] | None = None

    def validate(self) -> tuple[str, ...]:
        """Check the fields; return the task ids.

        Raises:
            ValueError: a bad field, naming it and the fix.
        """
        ids = resolve_libero_task(self.task)
        if self.split not in LIBERO_SPLITS:
            raise ValueError(f"split={self.split!r} is not a LIBERO split; valid: {', '.join(LIBERO_SPLITS)}")
        check_mode(self.instructions)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}; LIBERO runs on the batch and warp backends")
        super().validate()
        if self.render is not None and self.render.depth:
            raise ValueError("render.depth=True: a LIBERO env renders RGB frames only (no depth)")
        if self.num_envs // self.group_size < len(ids):
            raise ValueError(f"num_envs={self.num_envs} in groups of {self.group_size} is fewer groups than the "
                             f"{len(ids)} tasks of {self.task}; use num_envs >= {len(ids) * self.group_size}")
        if (self.max_steps is not None and self.max_steps < 1) or self.settle_steps < 0:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1 (or None) and settle_steps={self.settle_steps} >= 0")
        if not 0.0 <= self.jitter <= 0.05:
            raise ValueError(f"jitter={self.jitter} must be in [0, 0.05] m")
        if self.starts not in STARTS:
            raise ValueError(f"starts={self.starts!r}; valid: {', '.join(STARTS)}")
        if self.controller not in CONTROLLERS:
            raise ValueError(f"controller={self.controller!r}; valid: {', '.join(CONTROLLERS)}")
        if self.visual_faces is not None and self.visual_faces < MIN_VISUAL_FACES:
            raise ValueError(f"visual_faces={self.visual_faces}: give at least {MIN_VISUAL_FACES} triangles per visual mesh "
                             f"(default {VISUAL_FACES}), or None for LIBERO's full meshes")
        if self.task_weights is not None:
            try:
                weights_by_name(ids, self.task_weights, self.task)
            except ValueError as exc:
                raise ValueError(f"task_weights={self.task_weights}: {exc}") from None
        return ids

    def groups_per_task(self, ids: tuple[str, ...]) -> np.ndarray:
        """Environment groups of each task of ``ids`` (the validated task ids), int64 [K]: one each, and the rest
        in proportion to ``task_weights`` by largest remainder (ties to the earlier task), evenly without weights."""
        total, k = self.num_envs // self.group_size, len(ids)
        weights = np.asarray(weights_by_name(ids, self.task_weights or {}, self.task))
        share = (total - k) * weights / weights.sum()
        groups = np.floor(share).astype(np.int64)
        order = sorted(range(k), key=lambda i: (-(share[i] - groups[i]), i))
        groups[order[:total - k - int(groups.sum())]] += 1
        return groups + 1


def jitter_roots(states: np.ndarray, free_qpos: np.ndarray, tol: float = 1e-4) -> np.ndarray:
    """Which free object's jitter each free object takes: its own, or its support's.

    LIBERO places an object that stands on another free object (spatial/5's bowl on the ramekin) at
    its support's x, y, so in every fixed state the two share x and y (to ``tol``) and the first is
    higher. Shifting them independently changes what settling does (there: the centred bowl slides
    5.5 cm off the ramekin and leans on it, an off-centre one stays on top), so a jittered start would
    not look like LIBERO's; such an object moves with its support (transitively, for stacks).

    Args:
        states: qpos of the fixed initial states, [S, nq].
        free_qpos: qpos address of each free joint, [F].

    Returns:
        For each free object the index (into ``free_qpos``) whose shift it takes, int64 [F].
    """
    xy = np.stack([states[:, a:a + 2] for a in free_qpos], axis=1)  # [S, F, 2]
    z = states[:, free_qpos + 2]  # [S, F]
    support = np.arange(len(free_qpos))
    for a in range(len(free_qpos)):
        below = [b for b in range(len(free_qpos))
                 if b != a and np.abs(xy[:, a] - xy[:, b]).max() < tol and (z[:, a] > z[:, b]).all()]
        if below:  # the nearest one below is what it stands on
            support[a] = max(below, key=lambda b: z[:, b].mean())
    roots = support
    for _ in range(len(free_qpos)):
        roots = support[roots]
    return roots


def settle(model: mujoco.MjModel, qpos: np.ndarray, qvel: np.ndarray, ctrl: np.ndarray, nstep: int,
           fixtures: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Positions and velocities [n, nq], [n, nv] after ``nstep`` physics steps from each row under ``ctrl`` [n, nu]
    (one private ``MjData``; identical rows are stepped once), with ``fixtures`` = (bodies [B], places [n, B, 3],
    [n, B, 4]) standing there per row (None: where the model has them)."""
    if nstep == 0 or not len(qpos):
        return qpos, qvel
    bodies, pos, quat = fixtures if fixtures is not None else (np.zeros(0, np.int64), np.zeros((len(qpos), 0, 3)),
                                                                 np.zeros((len(qpos), 0, 4)))
    key = np.concatenate([qpos, qvel, ctrl, pos.reshape(len(qpos), -1), quat.reshape(len(qpos), -1)], axis=1)
    rows, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    data = mujoco.MjData(model)
    out_q, out_v = np.empty((len(rows), model.nq)), np.empty((len(rows), model.nv))
    saved = model.body_pos[bodies].copy(), model.body_quat[bodies].copy()
    try:
        for r, (row, i) in enumerate(zip(rows, first)):
            model.body_pos[bodies], model.body_quat[bodies] = pos[i], quat[i]
            mujoco.mj_resetData(model, data)
            data.qpos[:], data.qvel[:] = row[:model.nq], row[model.nq:model.nq + model.nv]
            data.ctrl[:] = row[model.nq + model.nv:model.nq + model.nv + model.nu]
            mujoco.mj_step(model, data, nstep=nstep)
            out_q[r], out_v[r] = data.qpos, data.qvel
    finally:  # the model is shared: leave it as it was
        model.body_pos[bodies], model.body_quat[bodies] = saved
    inverse = inverse.reshape(-1)
    return out_q[inverse], out_v[inverse]


MAX_TEXTURE = 512
"""Textures larger than this many pixels a side are downscaled (:func:`sims.libero.scene.build_model`): at
128 x 128 the frames differ by 0.1 levels on average (at most 4) from the full ones, and a scene with one
GL context takes 0.87 GB instead of 1.5 GB (spatial/0, measured)."""
_MODELS: dict[tuple[Path, int | None, str], tuple[mujoco.MjModel, LiberoLayout]] = {}


def shared_model(task: LiberoTask, visual_faces: int | None = VISUAL_FACES,
                 arm: str = "servo") -> tuple[mujoco.MjModel, LiberoLayout]:
    """The task's compiled model (textures at most :data:`MAX_TEXTURE`, visual meshes at most ``visual_faces``
    triangles, None: full; ``arm`` as :func:`~sims.libero.scene.build_model`), built once per process and setting:
    a trainer's training and evaluation envs (and a task's ``_lan`` variant, the same scene) share it."""
    key = (task.model_path, visual_faces, arm)
    if key not in _MODELS:
        _MODELS[key] = build_model(task, MAX_TEXTURE, visual_faces, arm)
    return _MODELS[key]


class LiberoVectorEnv(ArrayVectorEnv):
    """N environments of LIBERO tasks (see the module docstring and :class:`LiberoEnvConfig`).

    Attributes:
        task_names: the task ids; tasks: the loaded tasks (``_lan`` variants for ``split="lan"``);
        sims: one :class:`~sims.libero.sim.LiberoSim` per task; bounds: task k's environments are
        ``bounds[k]:bounds[k + 1]``; env_task: each environment's task [N]; state_index: the LIBERO
        initial state each environment's episode started from [N]; state_dim: S.
    """

    FRAME_KEYS = ("rgb",)

    def __init__(self, config: LiberoEnvConfig):
        """Load the tasks (and their ``_lan`` variants for ``split="lan"``), build one sim per task.

        Raises:
            ValueError: a bad config field. FileNotFoundError: a task (or variant) not in the cache,
            naming the setup command.
        """
        self.config = config
        self.task_names: tuple[str, ...] = config.validate()
        tasks = [load_task(t, config.cache) for t in self.task_names]
        if config.split == "lan":
            tasks = [load_lan(t, config.cache) for t in tasks]
        self.tasks: list[LiberoTask] = tasks
        self._sampler = InstructionSampler(split_groups(self.task_names, [t.instruction for t in tasks], config.split,
                                                        config.instructions), config.split)
        self.instructions: list[str] = self._sampler.table
        n, g, k = config.num_envs, config.group_size, len(tasks)
        groups = config.groups_per_task(self.task_names)
        self.bounds = np.concatenate([[0], np.cumsum(groups)]) * g  # task i's environments: bounds[i]..bounds[i+1]
        render = None
        if config.render is not None:  # GL contexts are shared out over the tasks (each holds a model copy)
            contexts = max(1, (config.render.num_contexts or os.cpu_count() or 1) // k)
            samples = 0 if config.render.samples is None else config.render.samples
            render = dataclasses.replace(config.render, textures=True, samples=samples, num_contexts=contexts)
        self.sims = [LiberoSim(t, int(self.bounds[i + 1] - self.bounds[i]), backend=config.backend, render=render,
                               warp_device=config.warp_device, num_threads=config.num_threads,
                               model=shared_model(t, config.visual_faces, CONTROLLERS[config.controller]))
                     for i, t in enumerate(tasks)]
        self._controllers = [osc.make_controller(sim) for sim in self.sims]
        self._ax = self.sims[0].ax
        self.device = getattr(self._ax, "device", None)
        self.num_envs = n
        self.env_task = np.repeat(np.arange(k), np.diff(self.bounds))
        self._max_steps = np.array([config.max_steps or MAX_STEPS[parse_task_id(t)[0]] for t in self.task_names])
        self.max_episode_steps = int(self._max_steps.max())
        robot = [np.concatenate([s.layout.arm_qpos, s.layout.finger_qpos]) for s in self.sims]
        self._object_qpos = [np.setdiff1d(np.arange(s.model.nq), r) for s, r in zip(self.sims, robot)]
        self.state_dim = 7 + max(len(q) for q in self._object_qpos)
        self._free_qpos = [s.model.jnt_qposadr[s.model.jnt_type == mujoco.mjtJoint.mjJNT_FREE] for s in self.sims]
        self._jitter_root = [jitter_roots(s.task.init_states[:, 1:1 + s.model.nq], f)
                             for s, f in zip(self.sims, self._free_qpos)]
        self._settled: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # fixed states, settled once
        self._regions = ([load_region_starts(t, config.cache) for t in self.task_names]
                         if config.starts == "regions" and config.split in _STREAM else None)
        self._pools = [split_pool(r.count, config.split) for r in self._regions or ()]  # train's and validation's disjoint
        self._spaces(render)
        self._seed = config.seed
        self._steps = np.zeros(n, np.int64)
        self._episode = np.zeros(n, np.int64)
        self.state_index = np.zeros(n, np.int64)  # the fixed initial state each episode started from
        self._instruction = np.zeros(n, np.int64)  # each episode's index into self.instructions
        self._obs: dict[str, Any] | None = None
        self.timings = {"render": 0.0}

    def _spaces(self, render: RenderConfig | None) -> None:
        n = self.num_envs
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        spaces: dict[str, gym.Space] = {
            "proprio": gym.spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32),
            "state": gym.spaces.Box(-np.inf, np.inf, (self.state_dim,), np.float32),
            "instruction": gym.spaces.Discrete(len(self.instructions)),
            "task": gym.spaces.Discrete(len(self.task_names)),
        }
        if render is not None:
            spaces["rgb"] = gym.spaces.Box(0, 255, (len(render.cameras), 3, render.height, render.width), np.uint8)
        self.single_observation_space = gym.spaces.Dict(spaces)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)

    @property
    def control_hz(self) -> float:
        """Control steps per second: the tasks' control frequency (LIBERO's 20 Hz)."""
        return float(self.tasks[0].control_freq)

    def episode_tags(self, i: int) -> dict[str, Any]:
        """Environment ``i``'s task id and the fixed initial state its current episode started from."""
        return {"libero/task": self.task_names[self.env_task[i]], "libero/state_index": int(self.state_index[i])}

    # ----------------------------------------------------------------------------- episodes
    def _initial_states(self, k: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Settled positions, velocities and fixed-state indices of the next episode of task ``k``'s environments ``ids``."""
        cfg, sim, g = self.config, self.sims[k], self.config.group_size
        states = sim.task.init_states
        nq, nv = sim.model.nq, sim.model.nv
        group = ids // g
        episode = self._episode[ids]
        if cfg.split in FIXED_STATE_SPLITS:  # LIBERO's states in order: group j of M plays j, j + M, j + 2M, ...
            local, count = group - self.bounds[k] // g, (self.bounds[k + 1] - self.bounds[k]) // g
            index = (local + episode * count) % len(states)
            for i in np.unique(index):
                if (k, i) not in self._settled:
                    q, v = states[i:i + 1, 1:1 + nq], states[i:i + 1, 1 + nq:1 + nq + nv]
                    self._settled[(k, i)] = self._settle(k, q, v)
            qpos = np.concatenate([self._settled[(k, i)][0] for i in index])
            qvel = np.concatenate([self._settled[(k, i)][1] for i in index])
            return qpos, qvel, index
        if self._regions is not None:
            return self._region_states(k, group, episode)
        index = np.empty(len(ids), np.int64)
        qpos, qvel = np.empty((len(ids), nq)), np.empty((len(ids), nv))
        for r, (m, e) in enumerate(zip(group, episode)):
            rng = np.random.default_rng([self._seed, int(m), int(e), _STREAM[cfg.split]])
            index[r] = rng.integers(len(states))
            qpos[r], qvel[r] = states[index[r], 1:1 + nq], states[index[r], 1 + nq:1 + nq + nv]
            shift = rng.uniform(-cfg.jitter, cfg.jitter, (len(self._free_qpos[k]), 2))[self._jitter_root[k]]
            for adr, (dx, dy) in zip(self._free_qpos[k], shift):
                qpos[r, adr:adr + 2] += (dx, dy)
        qpos, qvel = self._settle(k, qpos, qvel)
        return qpos, qvel, index

    def _region_states(self, k: int, group: np.ndarray, episode: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Settled region-sampled starts of task ``k``'s groups ``group`` in episodes ``episode`` (and their indices)."""
        starts, nq = self._regions[k], self.sims[k].model.nq
        stream = _STREAM[self.config.split]
        index = np.array([draw(self._pools[k], self._seed, int(m), int(e), stream) for m, e in zip(group, episode)],
                         np.int64)
        states = starts.states[index]
        fixtures = self._fixtures(k, index)
        qpos, qvel = self._settle(k, states[:, 1:1 + nq], states[:, 1 + nq:], fixtures)
        return qpos, qvel, index

    def _fixtures(self, k: int, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Fixture bodies and their places [n, B, 3], [n, B, 4] in task ``k``'s region starts ``index``."""
        return None if self._regions is None else self._regions[k].fixture_places(self.sims[k].model, index)

    def _settle(self, k: int, qpos: np.ndarray, qvel: np.ndarray,
                fixtures: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Task ``k``'s starts [n, nq], [n, nv] after ``settle_steps`` held still (the OSC: LIBERO's zero actions),
        the fixtures standing at ``fixtures`` (bodies [B], places [n, B, 3], [n, B, 4]; None: the model's)."""
        sim, steps = self.sims[k], self.config.settle_steps
        if sim.layout.torque_arm:
            return osc.settle(sim.task, (sim.model, sim.layout), qpos, qvel, steps, fixtures)
        return settle(sim.model, qpos, qvel, sim.hold_ctrl(qpos), steps * sim.layout.frame_skip, fixtures)

    def _start_episodes(self, ids: np.ndarray) -> None:
        """Start the next episode of environments ``ids`` (global indices)."""
        for k, sim in enumerate(self.sims):
            lo, hi = self.bounds[k], self.bounds[k + 1]
            sel = ids[(ids >= lo) & (ids < hi)]
            if len(sel):
                qpos, qvel, index = self._initial_states(k, sel)
                fixtures = self._fixtures(k, index)
                if fixtures is not None:
                    sim.place_fixtures(sel - lo, *fixtures)
                sim.set_states(sel - lo, qpos, qvel)
                self._controllers[k].reset(sim, sel - lo, **self._settled_kw(k))
                self.state_index[sel] = index
                self._instruction[sel] = self._sampler.draw(k, self._seed, sel // self.config.group_size,
                                                            self._episode[sel])
        self._episode[ids] += 1
        self._steps[ids] = 0

    def _settled_kw(self, k: int) -> dict[str, int]:
        return {"settled_steps": self.config.settle_steps} if self.sims[k].layout.torque_arm else {}

    def _observe(self, ids: np.ndarray | None = None, frames: bool = True) -> tuple[dict[str, Any], Any]:
        """Observation and success of environments ``ids`` (None: all) at the current state (``frames=False``:
        without ``rgb``, :meth:`_render`'s)."""
        ax = self._ax
        proprio, state, success = [], [], []
        for k, sim in enumerate(self.sims):
            p = sim.proprio()
            objects = sim.qpos[:, self._object_qpos[k]]
            pad = ax.zeros((sim.num_envs, self.state_dim - 7 - objects.shape[1]), dtype=ax.float32)
            proprio.append(ax.astype(p["state"], ax.float32))
            state.append(ax.concatenate([ax.astype(p["joint_pos"], ax.float32), ax.astype(objects, ax.float32), pad], axis=1))
            success.append(sim.success())
        sel = slice(None) if ids is None else ax.asarray(ids)
        task = self.env_task if ids is None else self.env_task[ids]
        obs = {"proprio": ax.concatenate(proprio, axis=0)[sel], "state": ax.concatenate(state, axis=0)[sel],
               "instruction": ax.asarray(self._instruction if ids is None else self._instruction[ids], copy=True),
               "task": ax.asarray(task, copy=True)}
        if frames and self.config.render is not None:
            obs.update(self._render(ids))
        return obs, ax.concatenate(success, axis=0)[sel]

    def _render(self, ids: np.ndarray | None = None) -> dict[str, Any]:
        """``rgb`` of environments ``ids`` (None: all) at the current state: each task's sim draws its rows (on the
        warp backend every world of the task, returning those rows)."""
        ax, frames = self._ax, []
        if self.timing_sync is not None:
            self.timing_sync()
        start = time.perf_counter()
        for k, sim in enumerate(self.sims):
            rows = None
            if ids is not None:
                lo, hi = self.bounds[k], self.bounds[k + 1]
                rows = ids[(ids >= lo) & (ids < hi)] - lo
            if rows is None or len(rows):
                frames.append(sim.render(rows))
        rgb = ax.concatenate([ax.asarray(f) for f in frames], axis=0)
        if self.timing_sync is not None:
            self.timing_sync()
        self.timings["render"] += time.perf_counter() - start
        return {"rgb": rgb}

    # ----------------------------------------------------------------------------- core
    def step_arrays(self, action: Any) -> dict[str, Any]:
        """Step all environments; returns ``observation``, ``final_observation``, ``reward`` float32 [N],
        ``terminated``, ``truncated``, ``success`` bool [N] (arrays of the backend's module); ``final_observation``
        holds no ``rgb`` when ``final_frames`` is off (:class:`~sims.vec_env.ArrayVectorEnv`)."""
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        ax = self._ax
        action = self._check_action(action)
        for k, (sim, ctl) in enumerate(zip(self.sims, self._controllers)):
            ctl.step(sim, action[self.bounds[k]:self.bounds[k + 1]])
        self._steps += 1
        final, success = self._observe(frames=False)  # frames once the resets are known (_autoreset)
        reward = ax.astype(success, ax.float32) * (1.0 + self.config.success_bonus)
        # Episode bookkeeping is the host's (resets sample episodes there): success comes back (on the warp
        # backend a device read per step) only when it ends episodes that restart; the step limit is the host's count.
        terminated, truncated, done = self._episode_ends(success, self._max_steps[self.env_task])
        obs, final, _ = self._autoreset(final, done)
        self._obs = obs
        return {"observation": obs, "final_observation": final, "reward": reward,
                "terminated": terminated, "truncated": truncated, "success": success}

    def _observe_reset(self) -> None:
        self._obs, _ = self._observe()

    def deferred_checks(self) -> contextlib.AbstractContextManager:
        """A block whose action checks and every task's overflow checks of device arrays are read once, at its end
        (:func:`sims.deferred.deferred_checks`)."""
        return deferred_checks(self, *(sim.backend for sim in self.sims))

    # ----------------------------------------------------------------------------- snapshots
    _EPISODE_FIELDS = ("_steps", "_episode", "state_index")

    def _physics_state(self) -> dict[str, Any]:
        """Each task's physics (its backend's snapshot) and arm controller's state, with the tasks, split and
        controller they belong to (the next episodes' initial states follow from the seed and the episode counts:
        the jittered and region splits draw from ``(seed, group, episode)``, the fixed ones play states in order)."""
        return {"tasks": list(self.task_names), "split": self.config.split, "controller": self.config.controller,
                "sims": [sim.get_state() for sim in self.sims],
                "controllers": [ctl.get_state() for ctl in self._controllers]}

    def _snapshot_fit(self, state: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """The tasks, split, controller and episode arrays' shapes of a snapshot (None: this env; a snapshot
        from before the controller was recorded is the servos')."""
        if state is None:
            return (list(self.task_names), self.config.split, self.config.controller, *super()._snapshot_fit())
        return (list(state["tasks"]), state["split"], state.get("controller", "servo"), *super()._snapshot_fit(state))

    def _restore_physics(self, state: dict[str, Any]) -> None:
        for sim, sim_state in zip(self.sims, state["sims"], strict=True):
            sim.restore(sim_state)
        for ctl, ctl_state in zip(self._controllers, state.get("controllers", [{}] * len(self.sims)), strict=True):
            ctl.set_state(ctl_state)

    def _restored(self, started: bool) -> None:
        for k in range(len(self.sims)):  # an episode's instruction follows from (seed, group, episode)
            ids = np.arange(self.bounds[k], self.bounds[k + 1])
            self._instruction[ids] = self._sampler.draw(k, self._seed, ids // self.config.group_size,
                                                        np.maximum(self._episode[ids] - 1, 0))
        # An observation is a function of the current state (the autoreset ones too: taken after the reset).
        self._obs = self._observe()[0] if started else None

    def close(self, **kwargs: Any) -> None:
        """Release the renderers' GL contexts."""
        for sim in self.sims:
            sim.close()

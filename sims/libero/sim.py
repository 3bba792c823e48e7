"""A batch of simulations of one cached LIBERO task on the batch or the warp backend.

``LiberoSim(task, num_envs, backend="batch" | "warp", render=RenderConfig(...))`` starts each
simulation from one of LIBERO's fixed initial states, steps joint-servo controls at 20 Hz
(25 substeps of 2 ms), and reads what LIBERO's observation holds:

- proprioception (:meth:`proprio`), LIBERO's keys: ``joint_pos`` / ``joint_vel`` [N, 7],
  ``eef_pos`` [N, 3] (the grip site), ``eef_quat`` [N, 4] (x, y, z, w: robosuite's order, of the
  hand body), ``gripper_qpos`` / ``gripper_qvel`` [N, 2], and ``state`` [N, 8] = eef position,
  eef axis-angle, gripper positions (the 8-d state LIBERO policies such as OpenVLA-OFT read);
- frames (:meth:`render`): uint8 [N, cams, 3, H, W] of ``agentview`` and ``robot0_eye_in_hand``
  (MuJoCo's OpenGL renderer on EGL for ``batch``; Warp's ray tracer, textured, for ``warp``);
- the goal (:meth:`success`, :meth:`predicates`).

Arrays are numpy for ``batch`` and torch on the Warp device for ``warp`` (``sim.ax``).
Derived quantities (body and site poses, contact sensors) are recomputed after every reset and
step (one ``forward`` per control step), so they describe the current state.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from sims.backends import BatchBackend
from sims.libero.predicates import GoalPredicates, Kinematics
from sims.libero.regions import RegionStarts
from sims.libero.scene import CAMERAS, VISUAL_FACES, LiberoLayout, LiberoTask, build_model
from sims.render import BatchRenderer, RenderConfig

_FIELDS = ("xpos", "xquat", "xanchor", "xaxis", "site_xpos", "site_xmat", "sensordata")
_TORQUE_FIELDS = ("M", "qfrc_bias")  # what the OSC reads at every substep (bound only for torque motors)
# LIBERO scenes touch at up to ~90 contacts (the gantry scene's warp limits are 48 / 192).
WARP_NCONMAX, WARP_NJMAX = 256, 1024


def libero_render_config(size: int = 128, cameras: tuple[str, ...] = CAMERAS, samples: int = 0,
                         **kw: Any) -> RenderConfig:
    """A :class:`RenderConfig` of LIBERO's two cameras at ``size`` x ``size``, textures on, no
    multisampling (LIBERO's model asks for 4 samples: twice the CPU per frame for anti-aliased edges,
    a mean 2-level difference at 128x128; ``samples=4`` restores it)."""
    return RenderConfig(width=size, height=size, cameras=cameras, textures=True, samples=samples, **kw)


class _NoColours:
    """Scene addresses for :class:`BatchRenderer`: LIBERO recolours nothing per episode."""

    colour_geoms = np.zeros(0, np.int64)


class LiberoSim:
    """``num_envs`` simulations of one LIBERO task (see the module docstring)."""

    def __init__(self, task: LiberoTask, num_envs: int, *, backend: str = "batch", render: RenderConfig | None = None,
                 warp_device: str = "auto", num_threads: int | None = None,
                 model: tuple[mujoco.MjModel, LiberoLayout] | None = None, visual_faces: int | None = VISUAL_FACES,
                 arm: str = "servo"):
        """Args: task (:func:`sims.libero.scene.load_task`); num_envs; backend ("batch" or "warp");
        render: frames to produce (None: none); warp_device; num_threads (batch; None: all CPUs);
        model: the task's :func:`~sims.libero.scene.build_model` result to share (None: build it; a
        LIBERO model takes about 0.5 GB, mostly textures); visual_faces: triangle budget of each
        visual-only mesh when the model is built here (:mod:`sims.libero.toolchain.lod`; None: LIBERO's full
        meshes; physics is the same either way); arm: ``"servo"`` (joint servos for
        :class:`~sims.libero.controller.PandaController`) or ``"torque"`` (LIBERO's motors for
        :class:`~sims.libero.osc.OscController`; :meth:`step` is then one 2 ms substep), when the model is built here.

        Raises:
            ValueError: an unknown backend.
        """
        if backend not in ("batch", "warp"):
            raise ValueError(f"unknown backend {backend!r} for LIBERO; valid backends: batch, warp")
        self.task, self.num_envs, self.backend_name = task, num_envs, backend
        self.model, self.layout = model or build_model(task, visual_faces=visual_faces, arm=arm)
        # Torque motors: the OSC recomputes the torques at every substep, so the backend steps one at a time.
        frame_skip = 1 if self.layout.torque_arm else self.layout.frame_skip
        fields = _FIELDS + _TORQUE_FIELDS if self.layout.torque_arm else _FIELDS
        self.goal = GoalPredicates(task.goal, self.model, self.layout.contact_sensor)
        self.render_config = render
        self.renderer = None
        if backend == "batch":
            # Torque motors: persistent, so that the stages a substep leaves current (step) carry into the next one.
            self.backend = BatchBackend(self.model, num_envs, frame_skip, num_threads, persistent=self.layout.torque_arm)
            self._f = {name: self.backend.batch.bind(name) for name in fields}
            if render is not None:
                self.renderer = BatchRenderer(self.model, render)
        else:
            import warp as wp

            from sims.warp_backend import WarpBackend

            self.backend = WarpBackend(self.model, num_envs, frame_skip, warp_device, render=render,
                                       nconmax=WARP_NCONMAX, njmax=WARP_NJMAX, forward_after_step=True,
                                       per_world_bodies=True)
            self._f = {name: wp.to_torch(getattr(self.backend.d, name)) for name in fields}
        self.ax = self.backend.ax
        self.state_index = np.zeros(num_envs, np.int64)  # each simulation's fixed initial state (-1: a region start)
        self.fixtures: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # see place_fixtures

    # ------------------------------------------------------------------ physics
    def forward(self) -> None:
        """Make poses and contact sensors describe the current state (after writing ``qpos`` by hand)."""
        if self.backend_name == "batch":
            self.backend.batch.forward()
        else:
            with self.backend._on_warp():
                self.backend._mjw.forward(self.backend.m, self.backend.d)

    def reset(self, state_index: np.ndarray, ids: np.ndarray | None = None) -> None:
        """Start simulations ``ids`` (default all) from LIBERO's fixed initial states ``state_index``.

        Raises:
            ValueError: a state index outside the task's initial states.
        """
        ids = np.arange(self.num_envs) if ids is None else np.asarray(ids)
        state_index = np.broadcast_to(np.asarray(state_index, np.int64), ids.shape)
        count = len(self.task.init_states)
        if (state_index < 0).any() or (state_index >= count).any():
            raise ValueError(f"initial state indices {state_index.tolist()} outside 0..{count - 1} of {self.task.task_id}")
        nq, nv = self.model.nq, self.model.nv
        states = self.task.init_states[state_index]
        self.set_states(ids, states[:, 1:1 + nq], states[:, 1 + nq:1 + nq + nv])
        self.state_index[ids] = state_index

    def reset_regions(self, starts: RegionStarts, index: np.ndarray) -> None:
        """Start every simulation from region-sampled start ``index`` [N] of ``starts`` (:mod:`sims.libero.regions`,
        LIBERO's training distribution), its fixtures standing where that start put them; unsettled, as :meth:`reset` leaves a fixed state.

        Raises:
            ValueError: an index outside the starts.
        """
        index = np.broadcast_to(np.asarray(index, np.int64), (self.num_envs,))
        if (index < 0).any() or (index >= starts.count).any():
            raise ValueError(f"region start indices {index.tolist()} outside 0..{starts.count - 1} of {self.task.task_id}; "
                             "write more with scripts/setup_libero.py --region-starts")
        ids = np.arange(self.num_envs)
        fixtures = starts.fixture_places(self.model, index)
        if fixtures is not None:
            self.place_fixtures(ids, *fixtures)
        nq = self.model.nq
        self.set_states(ids, starts.states[index, 1:1 + nq], starts.states[index, 1 + nq:])
        self.state_index[:] = -1  # no fixed state

    def hold_ctrl(self, qpos: np.ndarray) -> np.ndarray:
        """Controls [n, nu] that hold the arm at ``qpos`` [n, nq]'s joint angles with the gripper open (torque
        motors: zero torques; the OSC sets them at its first substep)."""
        lay = self.layout
        ctrl = np.zeros((len(qpos), self.model.nu))
        if not lay.torque_arm:
            ctrl[:, lay.arm_act] = qpos[:, lay.arm_qpos]
        ctrl[:, lay.gripper_act] = gripper_ctrl(np.full(len(qpos), -1.0))
        return ctrl

    def set_states(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        """Start simulations ``ids`` from positions ``qpos`` [n, nq] and velocities ``qvel`` [n, nv].

        Each arm servo targets the joint's angle in ``qpos`` and the gripper is commanded open
        (LIBERO's first action is what moves it).
        """
        ids = np.asarray(ids)
        # The velocities go through the backend's set_state, whose snapshot replays episodes from their start.
        self.backend.set_state(ids, qpos, np.zeros((len(ids), self.model.nmocap, 3)), self.hold_ctrl(qpos), qvel=qvel)
        self.forward()

    def place_fixtures(self, ids: np.ndarray, bodies: np.ndarray, pos: np.ndarray, quat: np.ndarray) -> None:
        """Stand fixture bodies ``bodies`` [B] of simulations ``ids`` at ``pos`` [n, B, 3], ``quat`` [n, B, 4] (LIBERO
        re-places its fixtures at every reset, in ``model.body_pos`` / ``body_quat``): their physics and their
        frames, in the backend's per-simulation model fields (the batch's expanded ones; Warp's per-world rows).
        Call before :meth:`set_states`.

        Raises:
            ValueError: other bodies than the sim's fixtures so far.
        """
        bodies = np.asarray(bodies)
        if self.fixtures is None:
            n = self.num_envs
            self.fixtures = (bodies, np.repeat(self.model.body_pos[bodies][None], n, 0),
                             np.repeat(self.model.body_quat[bodies][None], n, 0))
        elif not np.array_equal(self.fixtures[0], bodies):
            raise ValueError(f"fixture bodies {bodies.tolist()} differ from this sim's {self.fixtures[0].tolist()}")
        ids = np.asarray(ids)
        self.fixtures[1][ids], self.fixtures[2][ids] = pos, quat
        if self.backend_name == "warp":
            self.backend.place_bodies(ids, bodies, pos, quat)
            return
        batch = self.backend.batch
        batch.expand("body_pos")[np.ix_(ids, bodies)] = pos
        batch.expand("body_quat")[np.ix_(ids, bodies)] = quat

    def step(self, ctrl: Any, accelerations: bool = True) -> None:
        """Apply actuator controls ``ctrl`` [N, nu] for one control step (25 substeps; with torque motors one
        substep), then forward (on Warp inside the step's CUDA graph). ``accelerations=False`` (batch): only the
        position and velocity stages at the new state, what the OSC reads between substeps (poses, Jacobians,
        mass matrix, bias forces); the next substep of the persistent batch continues from them, so the
        trajectory is bit for bit the same at about two thirds of the CPU time."""
        if self.backend_name != "batch":
            self.backend.step(ctrl)
            return
        stage = mujoco.mjtStage.mjSTAGE_ACC if accelerations else mujoco.mjtStage.mjSTAGE_VEL
        self.backend.step(ctrl, stage=stage)

    def get_state(self) -> dict[str, Any]:
        """A snapshot of every simulation (the backend's: plain numpy arrays, and the fixtures' places), for
        :meth:`restore`."""
        state = self.backend.get_state()
        if self.fixtures is not None:
            state = {**state, "fixtures": tuple(a.copy() for a in self.fixtures)}
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`get_state`'s snapshot (of a sim of the same task, backend and size) bit for bit.

        Raises:
            ValueError: the snapshot is of another model or number of simulations.
        """
        if "fixtures" in state:  # the replay runs where the episode's fixtures stood
            bodies, pos, quat = state["fixtures"]
            self.place_fixtures(np.arange(self.num_envs), np.asarray(bodies), np.asarray(pos), np.asarray(quat))
        self.backend.restore({k: v for k, v in state.items() if k != "fixtures"})
        self.forward()

    def current_ctrl(self) -> Any:
        """A copy of the controls last applied, [N, nu]: stepping it holds every servo target."""
        ctrl = self.backend._ctrl
        return ctrl.copy() if isinstance(ctrl, np.ndarray) else ctrl.clone()

    # ------------------------------------------------------------------ reading
    def field(self, name: str) -> Any:
        """A derived array of every simulation: one of ``xpos``, ``xquat``, ``xanchor``, ``xaxis``,
        ``site_xpos``, ``site_xmat``, ``sensordata``, and with torque motors ``M`` (the CSR mass matrix) and
        ``qfrc_bias`` ([N, ...], numpy or torch)."""
        return self._f[name]

    @property
    def qpos(self) -> Any:
        return self.backend.qpos

    @property
    def qvel(self) -> Any:
        return self.backend.qvel

    def kinematics(self) -> Kinematics:
        return Kinematics(xpos=self._f["xpos"], site_xpos=self._f["site_xpos"], site_xmat=self._f["site_xmat"],
                          qpos=self.backend.qpos, sensordata=self._f["sensordata"])

    def success(self) -> Any:
        """Whether each simulation's goal holds, bool [N]."""
        return self.goal.success(self.kinematics())

    def proprio(self) -> dict[str, Any]:
        """LIBERO's proprioception (see the module docstring), fresh arrays [N, ...] (no views)."""
        xp, lay = self.ax, self.layout
        q, v = self.backend.qpos, self.backend.qvel
        wxyz = self._f["xquat"][:, lay.hand_body]
        xyzw = xp.concatenate([wxyz[:, 1:], wxyz[:, :1]], axis=1)
        eef_pos = xp.asarray(self._f["site_xpos"][:, lay.eef_site], copy=True)  # not a view of live data
        fingers = q[:, lay.finger_qpos]
        state = xp.concatenate([eef_pos, quat_to_axis_angle(xp, xyzw), fingers], axis=1)
        return {"joint_pos": q[:, lay.arm_qpos], "joint_vel": v[:, lay.arm_dof], "eef_pos": eef_pos,
                "eef_quat": xyzw, "gripper_qpos": fingers, "gripper_qvel": v[:, lay.finger_dof], "state": state}

    def render(self, rows: np.ndarray | None = None) -> Any:
        """Frames at the current state, uint8 [N, cams, 3, H, W] (or [len(rows), ...] of simulations ``rows``;
        the warp backend draws every world and returns those rows).

        Raises:
            RuntimeError: the sim was built without ``render``.
        """
        if self.render_config is None:
            raise RuntimeError("this LiberoSim renders nothing: build it with render=libero_render_config()")
        sel = slice(None) if rows is None else np.asarray(rows)
        if self.renderer is not None:
            qpos = self.backend.qpos[sel]
            poses = None if self.fixtures is None else (self.fixtures[0], self.fixtures[1][sel], self.fixtures[2][sel])
            return self.renderer.render(qpos, self.backend.mocap_pos[sel], np.zeros((len(qpos), 0, 4)),
                                        _NoColours(), body_poses=poses)["rgb"]
        frames = self.backend.render()["rgb"]
        return frames if rows is None else frames[self.ax.asarray(sel)]

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None


def gripper_ctrl(g: Any) -> Any:
    """Finger servo targets [n, 2] for gripper commands ``g`` [n] in [-1 (open), 1 (closed)]."""
    opening = 0.02 * (1.0 - g)  # 0.04 m per finger open, 0 closed (the actuators' ranges)
    return np.stack([opening, -opening], axis=-1) if isinstance(g, np.ndarray) else _torch_stack(opening)


def _torch_stack(opening: Any) -> Any:
    import torch

    return torch.stack([opening, -opening], dim=-1)


def quat_to_axis_angle(xp: Any, xyzw: Any) -> Any:
    """Axis-angle [n, 3] of unit quaternions ``xyzw`` [n, 4] (robosuite's ``quat2axisangle``)."""
    vec = xyzw[:, :3]
    norm = xp.sqrt((vec * vec).sum(1))
    angle = 2.0 * xp.arctan2(norm, xyzw[:, 3])
    scale = xp.where(norm > 1e-9, angle / xp.clip(norm, 1e-9, None), 0.0 * norm)
    return vec * scale[:, None]

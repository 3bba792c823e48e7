"""robosuite 1.4.0's ``OSC_POSE`` controller and Panda gripper as LIBERO configures them, batched.

LIBERO drives the Panda's seven torque motors with robosuite's operational-space controller
(``controllers/osc.py``, LIBERO's ``OSC_POSE`` config: ``kp`` 150, damping ratio 1, fixed
impedance, input [-1, 1] scaled to ``output_max`` = 5 cm and 0.5 rad, deltas, no interpolator, no
position or orientation limits, position and orientation uncoupled). Once per control step (20 Hz)
an action sets the goal; at every 2 ms physics substep the torques are recomputed from the state:

    F   = kp (p_goal - p) - kd v,           T = kp e(R_goal, R) - kd w,     kd = 2 sqrt(kp) zeta
    tau = J_p^T L_p F + J_r^T L_r T + c(q, qd)  +  N^T M (10 (q_init - q) - 2 sqrt(10) qd)

with ``M`` the arm's block of the joint-space mass matrix, ``L_x = pinv(J_x M^-1 J_x^T)``, ``c``
MuJoCo's bias forces (gravity and Coriolis: robosuite's ``torque_compensation``), ``N = I - M^-1
J^T L J`` the dynamically consistent null-space projector and ``q_init`` the posture
robosuite's reset left the arm at (:data:`INIT_QPOS`); ``e`` is robosuite's ``orientation_error``; the torques are clipped to the motors'
ranges. The orientation goal moves only when the rotation delta has a non-zero component (as
robosuite's ``set_goal``). The gripper (``PandaGripper.format_action``) keeps a state ``c`` that
steps by 0.01 per substep in the direction of the command's sign, clipped to [-1, 1]; the finger
servos' targets are the middle of their ranges plus ``c`` half-ranges (closing at +1).

The math is pure array functions of numpy arrays or torch tensors (the batch and the Warp
backend); :class:`OscController` runs them on a :class:`sims.libero.sim.LiberoSim` built with
torque motors (``arm="torque"``), whose backend steps one substep per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sims.backends import to_numpy
from sims.libero.controller import arm_jacobian

KP = 150.0
DAMPING_RATIO = 1.0
NULL_KP = 10.0  # robosuite's nullspace_torques joint_kp
OUTPUT_MAX = (0.05, 0.05, 0.05, 0.5, 0.5, 0.5)
GRIPPER_SPEED = 0.01  # PandaGripper.speed: change of the gripper state per substep
#: LIBERO's ``MountedPanda.init_qpos``: robosuite's reset puts the arm there and builds the controller, whose
#: null-space posture and first orientation goal it stays; ``set_init_state`` then moves the arm, not them.
INIT_QPOS = (0.0, -0.161037389, 0.0, -2.44459747, 0.0, 2.22675220, np.pi / 4)


def _lib(x: Any) -> Any:
    """numpy or torch: the module of ``x``'s functions."""
    if isinstance(x, np.ndarray):
        return np
    import torch

    return torch


def _eye(x: Any, n: int) -> Any:
    return np.eye(n) if isinstance(x, np.ndarray) else _lib(x).eye(n, dtype=x.dtype, device=x.device)


def _cross(a: Any, b: Any) -> Any:
    """Cross products of [..., 3] vectors (numpy and torch alike)."""
    lib = _lib(a)
    return lib.stack([a[..., 1] * b[..., 2] - a[..., 2] * b[..., 1], a[..., 2] * b[..., 0] - a[..., 0] * b[..., 2],
                      a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]], -1)


def axis_angle_matrix(aa: Any) -> Any:
    """Rotation matrices [n, 3, 3] of axis-angle vectors ``aa`` [n, 3] (robosuite's ``quat2mat(axisangle2quat)``;
    a zero vector is the identity)."""
    lib = _lib(aa)
    angle = lib.sqrt((aa * aa).sum(-1))
    axis = aa / lib.where(angle > 0, angle, 1.0 + 0 * angle)[:, None]
    zero = 0 * angle
    k = lib.stack([lib.stack([zero, -axis[:, 2], axis[:, 1]], -1), lib.stack([axis[:, 2], zero, -axis[:, 0]], -1),
                   lib.stack([-axis[:, 1], axis[:, 0], zero], -1)], 1)
    s, c = lib.sin(angle)[:, None, None], lib.cos(angle)[:, None, None]
    return _eye(aa, 3) + s * k + (1 - c) * (k @ k)


def orientation_error(desired: Any, current: Any) -> Any:
    """robosuite's ``orientation_error``: 0.5 sum_i current[:, i] x desired[:, i], [n, 3] from [n, 3, 3] each."""
    return 0.5 * _cross(current.swapaxes(1, 2), desired.swapaxes(1, 2)).sum(1)


def set_goal(delta: Any, ee_pos: Any, ee_mat: Any, goal_mat: Any) -> tuple[Any, Any]:
    """Goal position [n, 3] and orientation [n, 3, 3] for scaled deltas ``delta`` [n, 6] (m, rad) from the hand's
    pose; a row whose rotation delta is all zero keeps its previous ``goal_mat`` (robosuite's ``set_goal``)."""
    lib = _lib(delta)
    rotate = (delta[:, 3:] != 0).any(1)[:, None, None]
    new = axis_angle_matrix(delta[:, 3:]) @ ee_mat
    return ee_pos + delta[:, :3], lib.where(rotate, new, goal_mat)


def osc_torques(mass: Any, jac: Any, bias: Any, ee_pos: Any, ee_mat: Any, q: Any, qd: Any, goal_pos: Any,
                goal_mat: Any, q_init: Any, kp: float = KP, damping_ratio: float = DAMPING_RATIO,
                null_kp: float = NULL_KP) -> Any:
    """robosuite's ``OSC.run_controller`` (uncoupled, fixed impedance) plus its null-space torques, unclipped.

    Args:
        mass: the arm's joint-space mass matrix [n, 7, 7]; jac: the grip site's Jacobian [n, 6, 7]
            (translation rows, then rotation); bias: the arm's bias forces [n, 7] (``qfrc_bias``);
        ee_pos, ee_mat: the grip site's position [n, 3] and orientation [n, 3, 3]; q, qd: arm joint
            positions and velocities [n, 7]; goal_pos, goal_mat: the goal pose; q_init: the null-space posture [n, 7].

    Returns:
        Joint torques [n, 7].
    """
    lib = _lib(mass)
    kd = 2.0 * np.sqrt(kp) * damping_ratio
    vel = (jac @ qd[:, :, None])[:, :, 0]  # the site's velocity [v; w]
    force = kp * (goal_pos - ee_pos) - kd * vel[:, :3]
    torque = kp * orientation_error(goal_mat, ee_mat) - kd * vel[:, 3:]
    m_inv = lib.linalg.inv(mass)
    jt = jac.swapaxes(1, 2)
    lam_pos = lib.linalg.pinv(jac[:, :3] @ m_inv @ jt[:, :, :3])
    lam_ori = lib.linalg.pinv(jac[:, 3:] @ m_inv @ jt[:, :, 3:])
    lam_full = lib.linalg.pinv(jac @ m_inv @ jt)
    wrench = lib.concatenate([(lam_pos @ force[:, :, None])[:, :, 0], (lam_ori @ torque[:, :, None])[:, :, 0]], 1)
    tau = (jt @ wrench[:, :, None])[:, :, 0] + bias
    null = _eye(mass, 7) - m_inv @ jt @ lam_full @ jac
    pose = (mass @ (null_kp * (q_init - q) - 2.0 * np.sqrt(null_kp) * qd)[:, :, None])
    return tau + (null.swapaxes(1, 2) @ pose)[:, :, 0]


def gripper_step(state: Any, command: Any, speed: float = GRIPPER_SPEED) -> Any:
    """The gripper state [n] after one substep of commands ``command`` [n] (``PandaGripper.format_action``:
    ``c + speed * sign(command)`` clipped to [-1, 1]; +1 closes)."""
    lib = _lib(state)
    return lib.clip(state + speed * lib.sign(command), -1.0, 1.0)


def gripper_targets(state: Any, ctrl_range: Any) -> Any:
    """Finger servo targets [n, 2] of gripper states [n], for the finger actuators' ranges [2, 2]
    (robosuite's ``grip_action``: range middle + half-range x (-c, +c))."""
    lib = _lib(state)
    mid, half = (ctrl_range[:, 1] + ctrl_range[:, 0]) / 2, (ctrl_range[:, 1] - ctrl_range[:, 0]) / 2
    return mid + half * lib.stack([-state, state], -1)


def mass_block_index(model: Any, dofs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the [k, k] block of the mass matrix over ``dofs`` sits in MuJoCo's CSR ``M`` (``mujoco.batch`` and
    mujoco_warp hold the same layout): flat indices into ``M`` [k, k] and whether each entry is stored
    (False: zero, the two dofs are on different branches).

    Raises:
        ValueError: the dofs are not one kinematic chain's (an entry is missing on both sides).
    """
    k = len(dofs)
    index, stored = np.zeros((k, k), np.int64), np.zeros((k, k), bool)
    for a, i in enumerate(dofs):
        for b, j in enumerate(dofs):
            row, col = max(i, j), min(i, j)
            cols = model.M_colind[model.M_rowadr[row]:model.M_rowadr[row] + model.M_rownnz[row]]
            hit = np.flatnonzero(cols == col)
            if len(hit):
                index[a, b], stored[a, b] = model.M_rowadr[row] + hit[0], True
    if not stored.all():
        raise ValueError(f"dofs {dofs.tolist()} are not one chain: the arm's mass matrix block has zeros")
    return index, stored


def reset_arm_state(model: Any, layout: Any, m_index: np.ndarray) -> dict[str, np.ndarray]:
    """What robosuite's controller caches when it is built at reset, with the arm at :data:`INIT_QPOS` at rest
    and the fingers at the gripper's ``init_qpos``: the keys of :meth:`OscController.arm_state` but ``bias``,
    each [1, ...] (the arm's base is fixed, so nothing else matters)."""
    import mujoco

    data = mujoco.MjData(model)
    data.qpos[layout.arm_qpos] = INIT_QPOS
    data.qpos[layout.finger_qpos] = (0.020833, -0.020833)  # PandaGripper.init_qpos
    mujoco.mj_forward(model, data)
    site = layout.eef_site
    jnt = layout.arm_joint
    jac = arm_jacobian(data.site_xpos[None, site], data.xanchor[None, jnt], data.xaxis[None, jnt])
    return {"mass": data.M[m_index][None], "jac": jac, "q": np.asarray(INIT_QPOS)[None], "qd": np.zeros((1, 7)),
            "ee_pos": data.site_xpos[None, site].copy(), "ee_mat": data.site_xmat[site].reshape(1, 3, 3).copy()}


@dataclass
class OscState:
    """Per-simulation controller state: goal pose [N, 3] / [N, 3, 3], null-space posture [N, 7],
    gripper state [N], and ``stale`` [N]: no control step since the reset, so robosuite's controller still reads
    what it cached at reset (:func:`reset_arm_state`) for the goal and the first substep (its ``update`` runs only
    after a ``run_controller``; LIBERO's ``set_init_state`` moves the arm without one). Arrays of the sim's module.
    """

    goal_pos: Any
    goal_mat: Any
    q_init: Any
    grip: Any
    stale: Any


class OscController:
    """robosuite's OSC_POSE and Panda gripper (module docstring) on a torque-motor :class:`~sims.libero.sim.LiberoSim`."""

    def __init__(self, sim: Any, kp: float = KP, damping_ratio: float = DAMPING_RATIO,
                 output_max: tuple[float, ...] = OUTPUT_MAX):
        """Args: sim (built with ``arm="torque"``); kp, damping_ratio, output_max: LIBERO's OSC_POSE settings.

        Raises:
            ValueError: the sim's arm is driven by servos (build it with ``arm="torque"``).
        """
        if not sim.layout.torque_arm:
            raise ValueError("OscController needs the Panda's torque motors; build the LiberoSim with arm='torque'")
        lay, model, ax = sim.layout, sim.model, sim.ax
        self.kp, self.damping_ratio = kp, damping_ratio
        self.substeps = lay.frame_skip
        self._ax = ax
        self.output_max = np.asarray(output_max, np.float64)  # what an action of 1 means per axis (m, rad)
        self._output_max = ax.asarray(self.output_max, dtype=sim.qpos.dtype)
        index, _ = mass_block_index(model, lay.arm_dof)
        self._m_index = ax.asarray(index.reshape(-1))
        limits = model.actuator_ctrlrange[lay.arm_act]
        self._tau_lo = ax.asarray(limits[:, 0], dtype=sim.qpos.dtype)
        self._tau_hi = ax.asarray(limits[:, 1], dtype=sim.qpos.dtype)
        self._finger_range = ax.asarray(model.actuator_ctrlrange[lay.gripper_act], dtype=sim.qpos.dtype)
        self._reset_arm = {k: ax.asarray(v, dtype=sim.qpos.dtype)
                           for k, v in reset_arm_state(model, lay, index).items()}
        self.state = self._fresh_state(sim)

    # ------------------------------------------------------------------ reading the sim
    def arm_state(self, sim: Any) -> dict[str, Any]:
        """What the controller reads at a substep: ``mass`` [N, 7, 7], ``jac`` [N, 6, 7], ``bias``, ``q``, ``qd``
        [N, 7], ``ee_pos`` [N, 3], ``ee_mat`` [N, 3, 3] (current after the sim's forward)."""
        lay, n = sim.layout, sim.num_envs
        jnt = lay.arm_joint
        eef = sim.field("site_xpos")[:, lay.eef_site]
        return {"mass": sim.field("M")[:, self._m_index].reshape(n, 7, 7),
                "jac": arm_jacobian(eef, sim.field("xanchor")[:, jnt], sim.field("xaxis")[:, jnt]),
                "bias": sim.field("qfrc_bias")[:, lay.arm_dof], "q": sim.qpos[:, lay.arm_qpos],
                "qd": sim.qvel[:, lay.arm_dof], "ee_pos": eef,
                "ee_mat": sim.field("site_xmat")[:, lay.eef_site].reshape(n, 3, 3)}

    def _fresh_state(self, sim: Any) -> OscState:
        s = self.arm_state(sim)
        r = self._reset_arm
        return OscState(goal_pos=s["ee_pos"] * 1, goal_mat=r["ee_mat"] + 0 * s["ee_mat"], q_init=r["q"] + 0 * s["q"],
                        grip=0 * s["q"][:, 0], stale=s["q"][:, 0] == s["q"][:, 0])

    def reset(self, sim: Any, ids: Any, settled_steps: int = 0) -> None:
        """Start episodes of simulations ``ids`` as robosuite's reset and LIBERO's ``set_init_state`` leave them:
        null-space posture and orientation goal those of :data:`INIT_QPOS`, position goal the hand's current
        position, gripper state 0; or, with ``settled_steps`` > 0, as :func:`settle` left them after that many
        control steps (no longer stale, the gripper opened by the ramp)."""
        fresh = self._fresh_state(sim)
        if settled_steps > 0:
            fresh.stale = fresh.stale & False
            fresh.grip = fresh.grip + max(-1.0, -GRIPPER_SPEED * self.substeps * settled_steps)
        rows = self._ax.asarray(np.asarray(ids))
        for name in ("goal_pos", "goal_mat", "q_init", "grip", "stale"):
            getattr(self.state, name)[rows] = getattr(fresh, name)[rows]

    def get_state(self) -> dict[str, np.ndarray]:
        """Every simulation's controller state (:class:`OscState`) as numpy copies, for :meth:`set_state`."""
        return {k: to_numpy(v).copy() for k, v in vars(self.state).items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Continue from :meth:`get_state`'s snapshot."""
        for key, value in state.items():
            setattr(self.state, key, self._ax.asarray(np.asarray(value), dtype=getattr(self.state, key).dtype))

    # ------------------------------------------------------------------ stepping
    def _read(self, sim: Any) -> dict[str, Any]:
        """:meth:`arm_state`, with the reset's cached values in the rows still ``stale``."""
        s, stale = self.arm_state(sim), self.state.stale
        # On a device the where runs always: reading ``stale`` would make the host wait at every substep.
        if not isinstance(stale, np.ndarray) or stale.any():
            lib = _lib(stale)
            for key, cached in self._reset_arm.items():
                mask = stale.reshape(-1, *[1] * (cached.ndim - 1))
                s[key] = lib.where(mask, cached + 0 * s[key], s[key])
        return s

    def torques(self, sim: Any) -> Any:
        """Clipped motor torques [N, 7] at the sim's current state toward the current goal."""
        s, st = self._read(sim), self.state
        tau = osc_torques(s["mass"], s["jac"], s["bias"], s["ee_pos"], s["ee_mat"], s["q"], s["qd"], st.goal_pos,
                          st.goal_mat, st.q_init, self.kp, self.damping_ratio)
        return _lib(tau).clip(tau, self._tau_lo, self._tau_hi)

    def set_goal(self, sim: Any, action: Any) -> Any:
        """Set each simulation's goal from LIBERO actions ``action`` [N, 7] (robosuite's ``set_goal`` at a policy
        step); returns the clipped actions."""
        act = self._ax.asarray(action, dtype=sim.qpos.dtype)
        act = _lib(act).clip(act, -1.0, 1.0)
        s = self._read(sim)
        self.state.goal_pos, self.state.goal_mat = set_goal(act[:, :6] * self._output_max, s["ee_pos"], s["ee_mat"],
                                                            self.state.goal_mat)
        return act

    def substep(self, sim: Any, grip_command: Any, last: bool = True) -> None:
        """One physics substep: ramp the gripper state by the command's sign, recompute the torques, step
        (``last``: every derived field current after it, else what the next substep's torques read)."""
        lay = sim.layout
        ctrl = sim.current_ctrl()
        self.state.grip = gripper_step(self.state.grip, grip_command)
        ctrl[:, lay.gripper_act] = gripper_targets(self.state.grip, self._finger_range)
        ctrl[:, lay.arm_act] = self.torques(sim)
        self.state.stale = self.state.stale & False
        sim.step(ctrl, accelerations=last)

    def step(self, sim: Any, action: Any) -> None:
        """One control step of LIBERO actions ``action`` [N, 7]: set the goal, then ``substeps`` physics substeps
        each with torques and gripper targets recomputed from the state."""
        act = self.set_goal(sim, action)
        for k in range(self.substeps):
            self.substep(sim, act[:, 6], last=k == self.substeps - 1)


def settle(task: Any, model: Any, qpos: np.ndarray, qvel: np.ndarray, steps: int,
           fixtures: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """LIBERO's evaluation start on a torque-motor model: from positions and velocities [n, nq], [n, nv],
    ``steps`` control steps of the zero action with the gripper opening (``[0] * 6 + [-1]``) under the OSC, on
    a private batch (``fixtures``: as :meth:`~sims.libero.sim.LiberoSim.place_fixtures` takes them); returns the
    positions and velocities after them (continue with ``OscController.reset(..., settled_steps=steps)``)."""
    from sims.libero.sim import LiberoSim

    if steps == 0 or not len(qpos):
        return qpos, qvel
    sim = LiberoSim(task, len(qpos), num_threads=1, model=model)
    if fixtures is not None:
        sim.place_fixtures(np.arange(len(qpos)), *fixtures)
    sim.set_states(np.arange(len(qpos)), qpos, qvel)
    ctl = OscController(sim)
    action = np.zeros((len(qpos), 7))
    action[:, 6] = -1.0
    for _ in range(steps):
        ctl.step(sim, action)
    return sim.qpos.copy(), sim.qvel.copy()


def make_controller(sim: Any) -> Any:
    """The controller of a sim's arm: :class:`OscController` for torque motors, else the servos'
    :class:`~sims.libero.controller.PandaController`."""
    from sims.libero.controller import PandaController

    return OscController(sim) if sim.layout.torque_arm else PandaController(sim.layout)

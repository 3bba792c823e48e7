"""LIBERO's action space on the Panda's joint servos, batched, one code for numpy and torch.

An action is float [N, 7] in [-1, 1]: end-effector position delta (x, y, z, scaled by
``output_max`` = 5 cm), rotation delta as a world-frame axis-angle (scaled by 0.5 rad), and the
gripper (-1 open, +1 closed): LIBERO's ``OSC_POSE`` action with robosuite's scaling. Once per
control step (20 Hz) the controller turns it into joint targets by damped least squares on the
grip site's Jacobian,

    dq = J^T (J J^T + lambda^2 I)^-1 [dp; dw],     q_target = q + dq,

with J [N, 6, 7] built from the joint anchors and axes (``xanchor``, ``xaxis``: column i is
``axis_i x (p - anchor_i)`` over ``axis_i``), which both backends compute, so nothing here needs
``mj_jac``. The servos (:mod:`sims.libero.scene`) track the targets over the 25 substeps.
Unlike robosuite's OSC, the motion between targets follows the servos' joint-space dynamics, not
a task-space impedance; a delta moves the hand to within millimetres of its target in one or two
control steps (``tests/sims/test_libero.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sims.libero.scene import LiberoLayout
from sims.libero.sim import gripper_ctrl

DAMPING = 0.05  # lambda: keeps dq bounded near singular poses


def arm_jacobian(eef: Any, anchor: Any, axis: Any) -> Any:
    """The grip site's Jacobian [N, 6, 7] (translation rows, then rotation) from its position [N, 3] and the arm's
    hinge joints' anchors and axes [N, 7, 3] (all world frame; numpy arrays or torch tensors)."""
    r = eef[:, None, :] - anchor
    lin = [axis[..., 1] * r[..., 2] - axis[..., 2] * r[..., 1], axis[..., 2] * r[..., 0] - axis[..., 0] * r[..., 2],
           axis[..., 0] * r[..., 1] - axis[..., 1] * r[..., 0]]
    if isinstance(eef, np.ndarray):
        return np.concatenate([np.stack(lin, axis=1), axis.swapaxes(1, 2)], axis=1)
    import torch

    return torch.cat([torch.stack(lin, dim=1), axis.swapaxes(1, 2)], dim=1)


class PandaController:
    """Maps LIBERO actions to actuator controls for a :class:`sims.libero.sim.LiberoSim`."""

    def __init__(self, layout: LiberoLayout, output_max: tuple[float, ...] = (0.05, 0.05, 0.05, 0.5, 0.5, 0.5),
                 damping: float = DAMPING):
        """Args: layout (the sim's); output_max: what an action of 1 means per axis (m, rad);
        damping: the least-squares damping lambda."""
        self.layout = layout
        self.output_max = np.asarray(output_max, np.float64)
        self.damping = damping

    def joint_targets(self, sim: Any, action: Any) -> Any:
        """Arm joint targets [N, 7] for actions [N, 7] at the sim's current state."""
        xp, lay = sim.ax, self.layout
        act = xp.clip(xp.asarray(action), -1.0, 1.0)
        delta = act[:, :6] * xp.asarray(self.output_max)
        jnt = lay.arm_joint
        jac = arm_jacobian(sim.field("site_xpos")[:, lay.eef_site], sim.field("xanchor")[:, jnt],
                           sim.field("xaxis")[:, jnt])
        jt = jac.swapaxes(1, 2)
        gram = jac @ jt + (self.damping ** 2) * xp.asarray(np.eye(6))
        dq = (jt @ xp.linalg.solve(gram, delta[:, :, None]))[:, :, 0]
        return sim.qpos[:, lay.arm_qpos] + dq

    def reset(self, sim: Any, ids: Any) -> None:
        """Start episodes of simulations ``ids``: nothing to forget (the servos hold what ``set_states`` set)."""

    def get_state(self) -> dict[str, Any]:
        """Nothing: the servos' targets are the sim's controls, in its snapshot."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` (nothing)."""

    def step(self, sim: Any, action: Any) -> None:
        """One control step of LIBERO actions ``action`` [N, 7] (the controls, then the 25 substeps)."""
        sim.step(self(sim, action))

    def __call__(self, sim: Any, action: Any) -> Any:
        """Actuator controls [N, nu] for LIBERO actions [N, 7] (arm targets and finger targets)."""
        xp, lay = sim.ax, self.layout
        ctrl = xp.zeros((sim.num_envs, sim.model.nu))
        ctrl[:, lay.arm_act] = self.joint_targets(sim, action)
        ctrl[:, lay.gripper_act] = gripper_ctrl(xp.clip(xp.asarray(action)[:, 6], -1.0, 1.0))
        return ctrl

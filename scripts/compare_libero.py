"""The project's LIBERO against LIBERO's own robosuite environment, side by side, from the same states.

    python scripts/compare_libero.py --json runs/compare_libero.json      # the full comparison
    python scripts/compare_libero.py --quick --json OUT                   # CI's small size

Both sides start from LIBERO's fixed initial states (here they measure the simulator, never a policy) and
take the same actions; LIBERO's side runs in its own environment (``.venv-libero``, robosuite 1.4.0 on
mujoco 2.3.7, made by ``scripts/setup_libero_venv.py`` when missing) through
``scripts/libero_compare_worker.py``; the project's is :class:`sims.libero.sim.LiberoSim` with LIBERO's
torque motors and :class:`sims.libero.osc.OscController`.

- **controller**: free-space motion from the first fixed states of ``--tasks`` under 40-step action
  sequences, random (uniform in [-1, 1]^7, seeded) and scripted (each axis both ways, rotations, the
  gripper): ``eef_err_mm`` (grip site position, every step), ``rot_err_rad`` (angle between the two grip
  site orientations), ``finger_err_mm`` (finger joints);
- **settle**: from every fixed state of ``--suite``'s tasks, LIBERO's evaluation start (10 steps of the
  zero action with the gripper opening): ``within_5mm``, the fraction of free objects whose position
  ends within 5 mm of LIBERO's, and the objects further off by task;
- **physics**: the settle comparison for each set of MuJoCo options in ``--physics`` (the exported
  model's defaults; multi-contact CCD off; native and multi-contact CCD off, as MuJoCo 2.3.7), so the choice
  rests on a measurement.

Writes one JSON (``--json``): ``results.controller.eef_err_mm.{mean,max}``,
``results.controller.rot_err_rad.{mean,max}``, ``results.controller.finger_err_mm.{mean,max}``,
``results.settle.within_5mm``, ``results.settle.outliers``, ``results.physics``, LIBERO's versions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sims  # noqa: F401  (before mujoco: sims sets MuJoCo's headless GL defaults, EGL)

# isort: split
import mujoco
import numpy as np
from bench_report import output_path, write_report
from setup_libero_venv import clean_env, ensure_libero_venv

from sims.libero.osc import OscController
from sims.libero.scene import build_model, load_task
from sims.libero.sim import LiberoSim
from sims.libero.suites import LIBERO_SUITE, parse_task_id

WORKER = Path(__file__).resolve().parent / "libero_compare_worker.py"
STEPS = 40
SETTLE_STEPS = 10  # LIBERO's evaluation scripts' num_steps_wait
SETTLE_TOL = 0.005
_NATIVE, _MULTI = mujoco.mjtDisableBit.mjDSBL_NATIVECCD, mujoco.mjtDisableBit.mjDSBL_MULTICCD
#: MuJoCo option sets the settle comparison tries: disable flags on top of the model's (MuJoCo 4 runs native and
#: multi-contact CCD by default; LIBERO's 2.3.7 had libccd and one contact per convex pair).
PHYSICS = {"default": 0, "no_multiccd": int(_MULTI), "no_nativeccd_no_multiccd": int(_NATIVE | _MULTI)}


def scripted_actions(steps: int = STEPS) -> np.ndarray:
    """Ten scripted sequences [10, steps, 7]: +-x, +-y, +-z (half speed), rotations about z and x, a square in
    x-y with the gripper closing then opening, and a close-open gripper cycle at rest."""
    seqs = []
    for axis in range(3):
        for sign in (1.0, -1.0):
            a = np.zeros((steps, 7))
            a[:, axis], a[:, 6] = 0.5 * sign, -1.0
            seqs.append(a)
    for axis in (5, 3):
        a = np.zeros((steps, 7))
        a[: steps // 2, axis], a[steps // 2:, axis], a[:, 6] = 0.5, -0.5, -1.0
        seqs.append(a)
    square = np.zeros((steps, 7))
    for k, (dx, dy) in enumerate(((1, 0), (0, 1), (-1, 0), (0, -1))):
        square[k * steps // 4:(k + 1) * steps // 4, :2] = (0.6 * dx, 0.6 * dy)
    square[:, 6] = np.where(np.arange(steps) < steps // 2, 1.0, -1.0)
    seqs.append(square)
    grip = np.zeros((steps, 7))
    grip[:, 6] = np.where(np.arange(steps) % 20 < 10, 1.0, -1.0)
    seqs.append(grip)
    return np.stack(seqs)


def run_libero(python: Path, task_id: str, states: np.ndarray, actions: np.ndarray) -> dict[str, np.ndarray]:
    """LIBERO's trajectories (see libero_compare_worker.py) for fixed states ``states`` [R] and ``actions`` [R, T, 7]."""
    suite, index = parse_task_id(task_id)
    with tempfile.TemporaryDirectory() as tmp:
        req, res = Path(tmp) / "req.npz", Path(tmp) / "res.npz"
        np.savez(req, benchmark=LIBERO_SUITE[suite], index=index, states=states, actions=actions)
        proc = subprocess.run([str(python), str(WORKER), str(req), str(res)], env=clean_env(), capture_output=True,
                              text=True, timeout=3600)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"LIBERO's side of {task_id} failed: {tail}")
        with np.load(res) as f:
            return {k: f[k] for k in f.files}


def run_project(task_id: str, states: np.ndarray, actions: np.ndarray, physics: str = "default") -> dict[str, np.ndarray]:
    """The project's trajectories, as :func:`run_libero` records them, on the batch backend with OSC."""
    task = load_task(task_id)
    model, layout = build_model(task, visual_faces=None, arm="torque")
    model.opt.disableflags |= PHYSICS[physics]
    sim = LiberoSim(task, len(states), model=(model, layout))
    sim.reset(states)
    ctl = OscController(sim)
    ctl.reset(sim, np.arange(len(states)))
    steps = actions.shape[1]
    out = {"eef_pos": np.zeros((len(states), steps + 1, 3)), "eef_mat": np.zeros((len(states), steps + 1, 3, 3)),
           "fingers": np.zeros((len(states), steps + 1, 2)), "qpos": np.zeros((len(states), steps + 1, model.nq))}
    for t in range(steps + 1):
        if t:
            ctl.step(sim, actions[:, t - 1])
        out["eef_pos"][:, t] = sim.field("site_xpos")[:, layout.eef_site]
        out["eef_mat"][:, t] = sim.field("site_xmat")[:, layout.eef_site].reshape(-1, 3, 3)
        out["fingers"][:, t] = sim.qpos[:, layout.finger_qpos]
        out["qpos"][:, t] = sim.qpos
    return out


def _stats(x: np.ndarray) -> dict[str, float]:
    return {"mean": float(x.mean()), "max": float(x.max())}


def compare_controller(python: Path, tasks: list[str], n_random: int, n_scripted: int, seed: int) -> dict:
    """Free-space motion (module docstring), sequences dealt round-robin over ``tasks``, each from its first states."""
    rng = np.random.default_rng(seed)
    seqs = np.concatenate([rng.uniform(-1.0, 1.0, (n_random, STEPS, 7)), scripted_actions()[:n_scripted]])
    eef, rot, fing, per_task = [], [], [], {}
    for k, task_id in enumerate(tasks):
        mine = seqs[k::len(tasks)]
        states = np.arange(len(mine)) % 50
        ref, ours = run_libero(python, task_id, states, mine), run_project(task_id, states, mine)
        e = 1e3 * np.linalg.norm(ours["eef_pos"] - ref["eef_pos"], axis=-1)
        rel = np.einsum("rtji,rtjk->rtik", ours["eef_mat"], ref["eef_mat"])
        r = np.arccos(np.clip((np.trace(rel, axis1=-2, axis2=-1) - 1) / 2, -1.0, 1.0))
        f = 1e3 * np.abs(ours["fingers"] - ref["fingers"])
        eef.append(e.ravel()), rot.append(r.ravel()), fing.append(f.ravel())
        per_task[task_id] = {"sequences": len(mine), "eef_err_mm": _stats(e), "rot_err_rad": _stats(r),
                             "finger_err_mm": _stats(f),
                             "null_space_posture_matches": bool(np.allclose(ref["initial_joint"], ref["initial_joint"][0]))}
    return {"libero_versions": json.loads(str(ref["versions"])),
            "sequences": len(seqs), "steps": STEPS, "random": n_random, "scripted": n_scripted,
            "eef_err_mm": _stats(np.concatenate(eef)), "rot_err_rad": _stats(np.concatenate(rot)),
            "finger_err_mm": _stats(np.concatenate(fing)), "by_task": per_task}


def settle_both(python: Path, task_id: str, states: np.ndarray, physics: list[str]) -> dict[str, np.ndarray]:
    """Free objects' position error [len(physics), R, F] (m) after LIBERO's settle, per physics option set."""
    actions = np.zeros((len(states), SETTLE_STEPS, 7))
    actions[..., 6] = -1.0
    ref = run_libero(python, task_id, states, actions)
    model = build_model(load_task(task_id), visual_faces=None, arm="torque")[0]
    free = model.jnt_qposadr[model.jnt_type == mujoco.mjtJoint.mjJNT_FREE]
    pos = np.concatenate([free + i for i in range(3)])
    errs = []
    for name in physics:
        ours = run_project(task_id, states, actions, name)
        d = (ours["qpos"][:, -1, pos] - ref["qpos"][:, -1, pos]).reshape(len(states), 3, len(free))
        errs.append(np.linalg.norm(d, axis=1))
    return np.stack(errs)


def compare_settle(python: Path, tasks: list[str], states: int, physics: list[str]) -> tuple[dict, dict]:
    """The settle comparison (module docstring) for the first option set, and every set's fraction within 5 mm."""
    errs = {t: settle_both(python, t, np.arange(states), physics) for t in tasks}
    fractions = {}
    for i, name in enumerate(physics):
        allerr = np.concatenate([e[i].ravel() for e in errs.values()])
        fractions[name] = {"within_5mm": float((allerr <= SETTLE_TOL).mean()), "mean_mm": float(1e3 * allerr.mean()),
                           "objects": int(allerr.size)}
    outliers = {t: {"objects_off": int((e[0] > SETTLE_TOL).sum()), "of": int(e[0].size),
                    "max_mm": float(1e3 * e[0].max())} for t, e in errs.items() if (e[0] > SETTLE_TOL).any()}
    settle = {"tasks": tasks, "states_per_task": states, "physics": physics[0], **fractions[physics[0]],
              "outliers": outliers}
    return settle, fractions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=output_path, required=True, help="where the result goes")
    parser.add_argument("--quick", action="store_true", help="CI size: 2 tasks, 4 random + 2 scripted sequences, "
                        "settle of 5 states of one task, default physics only")
    parser.add_argument("--tasks", nargs="+", default=["spatial/0", "object/0", "goal/0", "10/0"])
    parser.add_argument("--suite", default="spatial", help="settle from every fixed state of this suite")
    parser.add_argument("--physics", nargs="+", default=list(PHYSICS), choices=list(PHYSICS))
    parser.add_argument("--settle-states", type=int, default=50, help="fixed states per task to settle (LIBERO has 50)")
    parser.add_argument("--parts", nargs="+", default=["controller", "settle"], choices=["controller", "settle"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--libero-python", type=Path, default=None, help="LIBERO's interpreter (default: .venv-libero)")
    args = parser.parse_args()
    start = time.perf_counter()
    try:
        python = args.libero_python or ensure_libero_venv()
        controller = settle = physics = None
        if args.quick:
            controller = compare_controller(python, args.tasks[:2], 4, 2, args.seed)
            settle, physics = compare_settle(python, [f"{args.suite}/0"], 5, args.physics[:1])
        else:
            if "controller" in args.parts:
                controller = compare_controller(python, args.tasks, 50, 10, args.seed)
            if "settle" in args.parts:
                settle, physics = compare_settle(python, [f"{args.suite}/{i}" for i in range(10)], args.settle_states,
                                                 args.physics)
    except (RuntimeError, ValueError, FileNotFoundError) as err:
        sys.exit(f"compare_libero: {err}")
    config = {"quick": args.quick, "tasks": args.tasks, "suite": args.suite, "seed": args.seed, "physics": args.physics,
              "steps": STEPS, "settle_steps": SETTLE_STEPS, "settle_states": args.settle_states, "parts": args.parts}
    write_report(args.json, config, {"controller": controller, "settle": settle, "physics": physics},
                 seconds=round(time.perf_counter() - start, 1))
    print(json.dumps({"controller": controller and {k: controller[k] for k in ("eef_err_mm", "rot_err_rad",
                                                                             "finger_err_mm")},
                      "settle_within_5mm": settle and settle["within_5mm"], "physics": physics}))


if __name__ == "__main__":
    main()

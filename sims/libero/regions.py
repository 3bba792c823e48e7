"""Starts drawn by LIBERO's own placement rules: its training distribution, never the fixed states.

LIBERO's environments place every object and fixture at reset by the BDDL's regions
(``bddl_base_domain._add_placement_initializer``: fixtures uniformly in their regions with their yaw
ranges, objects by the problem's region samplers, objects on sites or on other objects after them,
articulations by their open/close and on/off ranges) and add the robot's initialisation noise, all
from numpy's global random state. :func:`ensure_region_starts` runs exactly that code, in the export
toolchain's process (:mod:`sims.libero.toolchain.install`), once per start: ``numpy.random.seed(seed)`` then a
hard ``env.reset()``, and records

- ``states`` float64 [K, 1 + nq + nv]: time, qpos and qvel, the fixed states' layout;
- ``fixture_pos`` [K, F, 3] and ``fixture_quat`` [K, F, 4] (w, x, y, z): where each of the task's
  fixtures (``fixtures`` [F], root body names: cabinets, stoves, racks, ...) stands in that start;
  LIBERO moves them per reset in ``model.body_pos`` / ``body_quat``, which
  :meth:`sims.libero.sim.LiberoSim.place_fixtures` writes per simulation;

into ``<cache>/<suite>/<index>/region_starts.npz``. Start ``k`` comes from seed ``k`` and numpy's
legacy Mersenne Twister, whose stream numpy keeps identical on every platform and version, with the
toolchain's pinned LIBERO and robosuite: the same starts on every machine, independent of thread
counts and hash seeds. :func:`draw` picks an episode's start from ``(seed, group, episode, stream)``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sims.libero.suites import LIBERO_SUITE, cache_dir, parse_task_id

FILE = "region_starts.npz"
#: Starts written per task: each is one hard reset of LIBERO's env (about 0.3 CPU-seconds).
DEFAULT_COUNT = 200


@dataclass(frozen=True)
class RegionStarts:
    """One task's region-sampled starts (see the module docstring); ``count`` = K."""

    states: np.ndarray
    fixtures: tuple[str, ...]
    fixture_pos: np.ndarray
    fixture_quat: np.ndarray

    @property
    def count(self) -> int:
        return len(self.states)


def load_region_starts(task_id: str, cache: str | os.PathLike | None = None) -> RegionStarts:
    """The cached region starts of ``task_id``.

    Raises:
        FileNotFoundError: none are cached (the message names the command that writes them).
    """
    suite, index = parse_task_id(task_id)
    path = cache_dir(cache) / suite / str(index) / FILE
    if not path.is_file():
        raise FileNotFoundError(f"no region-sampled starts for {suite}/{index} in {path.parent}; write them with "
                                f"python scripts/setup_libero.py --tasks {suite}/{index} --region-starts {DEFAULT_COUNT}")
    with np.load(path) as f:
        return RegionStarts(states=f["states"], fixtures=tuple(str(n) for n in f["fixtures"]),
                            fixture_pos=f["fixture_pos"], fixture_quat=f["fixture_quat"])


def draw(count: int, seed: int, group: int, episode: int, stream: int) -> int:
    """The start index in ``0..count-1`` of episode ``episode`` of group ``group`` (a pure function of its arguments)."""
    return int(np.random.default_rng([seed, group, episode, stream]).integers(count))


def ensure_region_starts(task_ids: list[str], count: int = DEFAULT_COUNT,
                         cache: str | os.PathLike | None = None) -> list[str]:
    """Write ``count`` region-sampled starts for each task of ``task_ids`` lacking that many (the task exported
    first if needed). Returns the ids written.

    Raises:
        RuntimeError: LIBERO's sampler failed in the toolchain process (the message names the task).
    """
    from sims.libero.toolchain.install import ensure_tasks, ensure_toolchain

    root = cache_dir(cache)
    ensure_tasks(task_ids, root)
    todo = []
    for spec in task_ids:
        suite, index = parse_task_id(spec)
        path = root / suite / str(index) / FILE
        if path.is_file():
            with np.load(path) as f:
                if len(f["states"]) >= count:
                    continue
        todo.append(f"{suite}/{index}")
    if not todo:
        return []
    site = ensure_toolchain(root)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)]),
           "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "NUMBA_CACHE_DIR": str(root / "numba-cache")}
    for task_id in todo:
        proc = subprocess.run([sys.executable, "-m", "sims.libero.regions", "--cache", str(root), "--count",
                               str(count), task_id], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"sampling LIBERO's region starts of {task_id} failed ({last})")
    return todo


def sample_task(suite: str, index: int, count: int, cache: Path) -> dict[str, Any]:
    """In the toolchain's process: run LIBERO's reset for seeds ``0..count-1`` and write the task's
    :data:`FILE` (module docstring)."""
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv

    start = time.perf_counter()
    task = benchmark.get_benchmark_dict()[LIBERO_SUITE[suite]]().get_task(index)
    bddl = Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
    env = ControlEnv(bddl_file_name=str(bddl), camera_names=[], use_camera_obs=False, has_offscreen_renderer=False,
                     control_freq=20)
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
    out = cache / suite / str(index)
    tmp = out / f".{FILE}"
    with open(tmp, "wb") as f:
        np.savez_compressed(f, states=np.stack(states), fixtures=np.array(fixtures, dtype=str),
                            fixture_pos=np.stack(pos), fixture_quat=np.stack(quat))
    os.replace(tmp, out / FILE)
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

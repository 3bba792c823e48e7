"""Simulator throughput on an accelerator: MJX (and MJX-Warp) physics and EGL frames at 1,024-8,192 envs.

    MUJOCO_GL=egl python scripts/bench_sims_gpu.py --json runs/bench_sims_gpu.json

Prepared for a GPU machine; it refuses to run without one (JAX must see a GPU). Per number of
environments it measures

- ``mjx_steps_per_s``: the MJX backend's full environment step (physics with the task's
  substeps, reward and observations computed on the device, autoresets), after compilation;
- ``mjx_warp_steps_per_s``: the same with ``impl="warp"`` where MuJoCo Warp is installed;
- ``render_frames_per_s``: 64x64 RGB frames of those states through :class:`sims.BatchRenderer`
  on the GPU's EGL driver (hardware OpenGL), one context per CPU core up to 8;
- ``step_render_steps_per_s``: the full step with those frames as observations.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax
import numpy as np
from bench_report import write_report
from rich.console import Console

from sims import tasks as T
from sims.render import BatchRenderer, RenderConfig
from sims.vec_env import ACTION_DIM, make_vec_env


def timed_steps(env, n: int, steps: int) -> float:
    """Environment steps per second over ``steps`` steps (after two warm-up steps)."""
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (4, n, ACTION_DIM)).astype(np.float32)
    for k in range(2):
        env.step_arrays(actions[k])
    start = time.perf_counter()
    for k in range(steps):
        env.step_arrays(actions[k % 4])
    return steps * n / (time.perf_counter() - start)


def bench_backend(backend: str, task: str, n: int, steps: int) -> dict:
    start = time.perf_counter()
    env = make_vec_env(task, n, seed=0, backend=backend)
    env.reset_arrays()
    env.step_arrays(np.zeros((n, ACTION_DIM), np.float32))
    compile_s = time.perf_counter() - start
    return {"steps_per_s": timed_steps(env, n, steps), "compile_s": compile_s}


def bench_render(task: str, n: int, contexts: int, repeats: int) -> float:
    env = make_vec_env(task, n, seed=0, num_threads=1)
    env.reset_arrays()
    renderer = BatchRenderer(env.model, RenderConfig(num_contexts=contexts))
    args = (env._backend.qpos, env._backend.mocap_pos, T.PALETTE_RGBA[env._colours], env.layout)
    renderer.render(*args)
    start = time.perf_counter()
    for _ in range(repeats):
        renderer.render(*args)
    rate = repeats * n / (time.perf_counter() - start)
    renderer.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--task", default="suite")
    parser.add_argument("--envs", default="1024,2048,4096,8192", help="comma-separated env counts")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--contexts", type=int, default=min(8, os.cpu_count() or 1))
    args = parser.parse_args()
    if not any(d.platform == "gpu" for d in jax.devices()):
        sys.exit(f"no GPU visible to JAX (devices: {jax.devices()}); run this on a GPU machine, "
                 "or scripts/bench_sims.py on a CPU one")
    console = Console()
    warp = True
    try:
        import mujoco_warp  # noqa: F401
    except ImportError:
        warp = False
    results: dict = {}
    for n in (int(x) for x in args.envs.split(",")):
        row: dict = {}
        with console.status(f"MJX, {n} envs"):
            mjx = bench_backend("mjx", args.task, n, args.steps)
        row["mjx_steps_per_s"], row["mjx_compile_s"] = mjx["steps_per_s"], mjx["compile_s"]
        if warp:
            with console.status(f"MJX-Warp, {n} envs"):
                w = bench_backend("mjx-warp", args.task, n, args.steps)
            row["mjx_warp_steps_per_s"], row["mjx_warp_compile_s"] = w["steps_per_s"], w["compile_s"]
        with console.status(f"EGL frames, {n} envs"):
            row["render_frames_per_s"] = bench_render(args.task, n, args.contexts, 3)
        with console.status(f"MJX step with 64x64 RGB, {n} envs"):
            env = make_vec_env(args.task, n, seed=0, backend="mjx",
                               render=RenderConfig(num_contexts=args.contexts))
            env.reset_arrays()
            row["step_render_steps_per_s"] = timed_steps(env, n, max(5, args.steps // 5))
            env.close()
        results[f"envs_{n}"] = row
        console.print(n, json.dumps({k: round(v, 1) for k, v in row.items()}))
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"}
        config["jax_devices"] = [str(d) for d in jax.devices()]
        write_report(args.json, config, results)
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

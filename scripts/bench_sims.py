"""Simulator and renderer throughput, side by side in one run (DESIGN.md benchmark contract).

    python scripts/bench_sims.py --json runs/bench_sims.json

Figures (``results`` keys name the figure and unit):

- ``full_step_steps_per_s``: SimVectorEnv.step with state observations (physics, observations,
  reward, autoresets), N environments; ``raw_physics_steps_per_s``: ``mujoco.batch`` stepping the
  same model with the same substeps and threads, nothing else; their ratio;
- ``gym_async_steps_per_s``: gymnasium's ``AsyncVectorEnv`` over single-environment copies of the
  same task (one process each) and the ratio of the full step to it;
- ``render_frames_per_s``: 64x64 RGB, one camera, through the batched renderer;
  ``default_renderer_frames_per_s``: ``mujoco.Renderer`` with MuJoCo's default visual settings
  on the same scene, one frame at a time; their ratio; a sweep over GL contexts and
  ``LP_NUM_THREADS`` (each setting in a fresh process: Mesa reads it once);
- ``full_step_render_steps_per_s``: the full step with 64x64 RGB observations;
- ``mjx_cpu_steps_per_s`` and ``mjx_cpu_compile_s``: the MJX backend on the CPU;
- ``warp_cpu_*``: the Warp backend on Warp's CPU device, same task and N, beside batch + EGL:
  physics substeps x envs per second, the full step (state; with 64x64 RGB from its ray tracer),
  the device renderer alone (frames/s), setup incl. kernel load (``scripts/bench_sims_gpu.py``
  measures the same on a GPU).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable

import sims  # before mujoco: sims sets MuJoCo's headless GL defaults (EGL)

# isort: split
import gymnasium as gym
import mujoco
import numpy as np
from bench_report import BenchReport, output_path
from bench_sims_gpu import measure_warp

from sims import tasks as T
from sims.render import BatchRenderer, RenderConfig
from sims.scene import SceneConfig, build_model
from sims.vec_env import ACTION_DIM, EnvConfig, make_vec_env


def timed(fn, seconds: float, min_calls: int = 3) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (after one warm-up call)."""
    fn()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls / (time.perf_counter() - start)


def bench_full_and_raw(task: str, n: int, threads: int, seconds: float, horizon: int = 40) -> dict:
    """The full step, and the raw physics of the same trajectories.

    Both replay ``horizon``-step stretches from the same start: the env with random actions, the
    raw ``mujoco.batch`` with the controls the env applied (recorded in a first pass), so sleeping
    and contacts are the same work in both.
    """
    env = make_vec_env(task, n, seed=0, num_threads=threads)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (horizon, n, ACTION_DIM)).astype(np.float32)
    backend = env._backend
    env.reset(seed=0)
    start = {k: getattr(backend, k).copy() for k in ("qpos", "mocap_pos")}
    start_ctrl = backend.batch.bind("ctrl").copy()
    controls = []
    for a in actions:
        env.step(a)
        controls.append(backend.batch.bind("ctrl").copy())

    def full() -> None:
        env.reset(seed=0)
        for a in actions:
            env.step(a)

    batch = mujoco.batch.Batch(env.model, n, nthread=threads, persistent=backend.batch.persistent)
    qpos, mocap, ctrl = batch.bind("qpos"), batch.bind("mocap_pos"), batch.bind("ctrl")

    def raw() -> None:
        batch.reset(stage=mujoco.mjtStage.mjSTAGE_NONE)
        qpos[:], mocap[:], ctrl[:] = start["qpos"], start["mocap_pos"], start_ctrl
        for c in controls:
            ctrl[:] = c
            batch.step(nstep=env.config.frame_skip)

    full_rate = timed(full, seconds, min_calls=2) * n * horizon
    raw_rate = timed(raw, seconds, min_calls=2) * n * horizon
    return {"full_step_steps_per_s": full_rate, "raw_physics_steps_per_s": raw_rate,
            "ratio_full_step_vs_raw_physics": full_rate / raw_rate}


def bench_gym_async(task: str, copies: int, seconds: float) -> float:
    """Steps/s of gymnasium's AsyncVectorEnv over ``copies`` single-env processes."""
    vec = gym.vector.AsyncVectorEnv([lambda: gym.make(sims.gym_id(task)) for _ in range(copies)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        vec.reset(seed=0)
        rng = np.random.default_rng(0)
        rate = timed(lambda: vec.step(rng.uniform(-1, 1, (copies, ACTION_DIM)).astype(np.float32)), seconds)
    finally:
        vec.close()
    return rate * copies


def scene_states(n: int):
    """n random episode states of the suite, for rendering."""
    env = make_vec_env("suite", n, seed=0, num_threads=1)
    env.reset()
    return env, (env._backend.qpos.copy(), env._backend.mocap_pos.copy(), T.PALETTE_RGBA[env._colours])


def bench_render(n: int, contexts: int, seconds: float) -> float:
    env, (qpos, mocap, rgba) = scene_states(n)
    renderer = BatchRenderer(env.model, RenderConfig(num_contexts=contexts))
    try:
        return timed(lambda: renderer.render(qpos, mocap, rgba, env.layout), seconds) * n
    finally:
        renderer.close()


def bench_default_renderer(n: int, seconds: float) -> float:
    """mujoco.Renderer, MuJoCo's default visual settings, 64x64, one frame per call."""
    env, (qpos, mocap, rgba) = scene_states(n)
    model, _ = build_model(SceneConfig(fast_visual=False))
    data = mujoco.MjData(model)
    renderer = mujoco.Renderer(model, 64, 64)
    frames = 0

    def one_pass() -> None:
        nonlocal frames
        for i in range(n):
            data.qpos[:], data.mocap_pos[:] = qpos[i], mocap[i]
            model.geom_rgba[env.layout.colour_geoms] = rgba[i]
            mujoco.mj_kinematics(model, data)
            mujoco.mj_camlight(model, data)
            renderer.update_scene(data, "front")
            renderer.render()
        frames += n

    try:
        return timed(one_pass, seconds, min_calls=1) * n
    finally:
        renderer.close()


def bench_full_render(task: str, n: int, threads: int, seconds: float) -> float:
    env = make_vec_env(task, n, seed=0, num_threads=threads, render=True)
    env.reset()
    rng = np.random.default_rng(0)
    try:
        return timed(lambda: env.step(rng.uniform(-1, 1, (n, ACTION_DIM)).astype(np.float32)), seconds) * n
    finally:
        env.close()


def bench_mjx(task: str, n: int, seconds: float) -> dict:
    start = time.perf_counter()
    env = make_vec_env(task, n, seed=0, backend="mjx")
    env.reset()
    zero = np.zeros((n, ACTION_DIM), np.float32)
    env.step(zero)
    compile_s = time.perf_counter() - start
    rate = timed(lambda: env.step(zero), seconds) * n
    return {"mjx_cpu_steps_per_s": rate, "mjx_cpu_compile_s": compile_s, "mjx_cpu_num_envs": n}


def render_sweep(n: int, seconds: float) -> dict:
    """Render frames/s per (GL contexts, LP_NUM_THREADS), each in a fresh process."""
    out = {}
    for lp in ("0", "1", "2"):
        for contexts in (1, 2):
            env = {**os.environ, "LP_NUM_THREADS": lp, "MUJOCO_GL": "egl"}
            cmd = [sys.executable, __file__, "--render-only", str(contexts), "--envs", str(n),
                   "--seconds", str(seconds)]
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True)
            out[f"contexts_{contexts}_lp_{lp}"] = float(result.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=output_path, help="write the figures here (atomically)")
    parser.add_argument("--task", default="reach", choices=[*sims.TASK_NAMES, "suite"])
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=3.0, help="timing window per figure")
    parser.add_argument("--gym-copies", type=int, default=8, help="AsyncVectorEnv processes")
    parser.add_argument("--mjx-envs", type=int, default=8,
                        help="MJX batch (at 16+ XLA's CPU runtime has hung on the 2-core VM, cause unknown)")
    parser.add_argument("--skip-mjx", action="store_true")
    parser.add_argument("--warp-steps", type=int, default=10, help="timed calls per Warp figure")
    parser.add_argument("--skip-warp", action="store_true")
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--render-only", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render_only:
        print(bench_render(args.envs, args.render_only, args.seconds))
        return 0

    config = {k: v for k, v in vars(args).items() if k not in ("json", "render_only")}
    config["frame_skip"] = EnvConfig.frame_skip
    print(f"sims benchmark: {args.task}, {args.envs} envs, {args.threads} threads", flush=True)
    report = BenchReport(args.json, config)
    for name, measure in parts(args):
        print(f"-- {name}", flush=True)
        report.part(name, measure)
    if args.json:
        print(f"wrote {args.json}")
    return 1 if report.failed else 0


def parts(args: argparse.Namespace) -> list[tuple[str, Callable[[], dict]]]:
    """The benchmark's parts in order, each returning its figures; the ratios are measured in the same part
    as their baseline, on the same machine in the same run."""
    def against_gym() -> dict:
        full = bench_full_and_raw(args.task, args.envs, args.threads, args.seconds)
        gym_rate = bench_gym_async(args.task, args.gym_copies, args.seconds)
        return {**full, "gym_async_steps_per_s": gym_rate,
                "ratio_full_step_vs_gym_async": full["full_step_steps_per_s"] / gym_rate}

    def render() -> dict:
        ours, default = bench_render(args.envs, args.threads, args.seconds), bench_default_renderer(32, args.seconds)
        return {"render_frames_per_s": ours, "default_renderer_frames_per_s": default,
                "ratio_render_vs_default_renderer": ours / default}

    def warp() -> dict:
        figures = measure_warp(args.task, args.envs, "cpu", args.warp_steps)
        return {"warp_cpu_" + k.removeprefix("warp_"): v for k, v in figures.items()}

    out = [("full step vs raw mujoco.batch physics and gymnasium AsyncVectorEnv", against_gym),
           ("batched renderer vs mujoco.Renderer with default settings, 64x64 RGB", render),
           ("full step with 64x64 RGB observations", lambda: {
               "full_step_render_steps_per_s": bench_full_render(args.task, args.envs, args.threads, args.seconds)})]
    if not args.skip_sweep:
        out.append(("render sweep: GL contexts x LP_NUM_THREADS",
                    lambda: {"render_frames_per_s_sweep": render_sweep(args.envs, args.seconds)}))
    if not args.skip_mjx:
        out.append(("MJX on the CPU (includes XLA compilation)", lambda: bench_mjx(args.task, args.mjx_envs, args.seconds)))
    if not args.skip_warp:
        out.append(("Warp backend on Warp's CPU device", warp))
    return out

if __name__ == "__main__":
    sys.exit(main())

"""LIBERO's own robosuite environment beside the batch backend on the same task and cameras (issue 38, item 3).

    python scripts/bench_libero.py --json docs/figures/libero/bench_libero.json
    python scripts/bench_libero.py --smoke --skip-robosuite --json /tmp/bench.json    # the batch side, seconds

Both sides step one LIBERO task (default ``spatial/0``) from its fixed initial state 0 with the
same actions (uniform in [-1, 1]^7, or zeros), at 20 Hz, and produce at every step what a policy
reads: ``agentview`` and ``robot0_eye_in_hand`` at 128x128 and the proprioception.

- ``robosuite``: LIBERO's ``OffScreenRenderEnv`` (robosuite 1.4.0, mujoco 2.3.7, its OSC_POSE
  controller), one process, one environment: what LIBERO's users run today. It runs in LIBERO's
  own virtual environment (``scripts/setup_libero_venv.py``, made here if missing) as a child
  process, ``scripts/libero_robosuite_steps.py``, which prints its figures as JSON.
- ``batch``: :class:`sims.libero.sim.LiberoSim` on the batch backend (``mujoco.batch``,
  ``--threads`` physics threads, the batched EGL renderer) with
  :class:`sims.libero.controller.PandaController`, at each ``--num-envs``: one env-step is
  controller + 25 physics substeps + proprioception + both cameras + the goal, for every env.
  Its visual meshes are decimated to ``--visual-faces`` triangles (``sims.libero.toolchain.lod``; default
  the simulator's, ``full`` for LIBERO's own meshes); the physics is the same either way.

Figures (``results``): ``robosuite`` and each ``batch`` row: ``env_steps_per_s`` and
``frames_per_s`` (cameras x env-steps/s); ``robosuite_no_render`` (LIBERO's environment built
without cameras) and batch's ``no_render_env_steps_per_s`` (the same step without rendering):
where the time goes; batch's ``build_s`` and ``first_step_s``; ``speedup`` (batch env-steps/s over robosuite's, per
``num_envs``), ``best_speedup`` against the issue's target of 20x, ``no_render_speedup``; the
load average (``uptime``) before and after each part, as other work on the machine slows both.
``cpu_ms_per_env_step`` (the process's CPU time over the timed steps, all threads, per env-step)
and ``cpu_speedup`` (robosuite's over batch's; ``no_render_cpu_speedup`` without cameras) move
less with that load than wall-clock figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sims  # noqa: F401  (before mujoco: sims sets MuJoCo's headless GL defaults, EGL)

# isort: split
import mujoco
import numpy as np
from bench_report import device_sync, output_path, write_report
from rich.console import Console
from rich.table import Table
from setup_libero_venv import clean_env, ensure_libero_venv

from infra.common.provenance import load_average
from sims.libero.controller import PandaController
from sims.libero.scene import VISUAL_FACES, LiberoLayout, load_task
from sims.libero.sim import LiberoSim, libero_render_config
from sims.libero.suites import LIBERO_SUITE, parse_task_id
from sims.libero.toolchain.install import ensure_tasks

TARGET_SPEEDUP = 20.0
ROBOSUITE_DRIVER = Path(__file__).resolve().parent / "libero_robosuite_steps.py"


def rate_and_cpu(fn: Callable[[], None], seconds: float, min_calls: int = 3,
                 sync: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """Calls per second of ``fn`` over about ``seconds`` after one warm-up call, and the process's CPU
    seconds per call (all its threads: physics, GL contexts): the second moves less with other load.
    ``sync`` waits for the device's queued work (a GPU's), before the clock starts and stops."""
    fn()
    sync()
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    sync()
    return calls / (time.perf_counter() - start), (time.process_time() - cpu) / calls


def actions_for(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """LIBERO actions [n, 7]: uniform in [-1, 1] (``random``) or zeros (``zero``)."""
    return rng.uniform(-1.0, 1.0, (n, 7)) if kind == "random" else np.zeros((n, 7))


def bench_sim(task_id: str, num_envs: int, size: int, seconds: float, actions: str,
              visual_faces: int | None = VISUAL_FACES, *, backend: str = "batch", threads: int = 2,
              warp_device: str = "cpu", model: tuple[mujoco.MjModel, LiberoLayout] | None = None) -> dict[str, Any]:
    """Env-steps/s of ``num_envs`` environments on ``backend`` ("batch", or "warp" on ``warp_device``),
    with and without both cameras at ``size`` x ``size``; ``model``: the task's
    :func:`~sims.libero.scene.build_model` result to reuse (None: built here, inside ``build_s``).

    ``build_s`` is the sim's construction and first reset (the warp backend's device model and
    renderer), ``first_step_s`` the first full step (on warp: kernel compilation and CUDA graph
    capture); warp rows add ``graphs_captured``.
    """
    start = time.perf_counter()
    sim = LiberoSim(load_task(task_id), num_envs, backend=backend, render=libero_render_config(size),
                    num_threads=threads, warp_device=warp_device, model=model, visual_faces=visual_faces)
    controller = PandaController(sim.layout)
    sim.reset(np.zeros(num_envs, np.int64))
    device = getattr(sim.backend, "device", None)
    sync = functools.partial(device_sync, device)
    sync()
    build_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    obs: dict[str, Any] = {}

    def step(render: bool) -> None:
        sim.step(controller(sim, actions_for(actions, rng, num_envs)))
        obs.update(sim.proprio(), success=sim.success())
        if render:
            obs["rgb"] = sim.render()

    try:
        start = time.perf_counter()
        step(True)
        sync()
        first_step_s = time.perf_counter() - start
        full, cpu = rate_and_cpu(lambda: step(True), seconds, sync=sync)
        rgb = obs["rgb"]
        assert tuple(rgb.shape) == (num_envs, 2, 3, size, size), rgb.shape  # both cameras in every step
        no_render, cpu_no_render = rate_and_cpu(lambda: step(False), seconds, sync=sync)
    finally:
        sim.close()
    row = {"num_envs": num_envs, "env_steps_per_s": full * num_envs, "frames_per_s": 2 * full * num_envs,
           "cpu_ms_per_env_step": 1e3 * cpu / num_envs, "no_render_env_steps_per_s": no_render * num_envs,
           "no_render_cpu_ms_per_env_step": 1e3 * cpu_no_render / num_envs, "build_s": round(build_s, 2),
           "first_step_s": round(first_step_s, 2), "load_after": load_average()}
    if backend == "warp":
        row["graphs_captured"] = sim.backend.graphs_captured
    return row


def bench_robosuite(python: Path, task_id: str, size: int, seconds: float, actions: str,
                    cameras: bool = True) -> dict[str, Any]:
    """LIBERO's robosuite environment stepped by ``scripts/libero_robosuite_steps.py`` under ``python``
    (with both cameras, or ``cameras=False``: none and no renderer).

    Raises:
        RuntimeError: the child failed (its last line of stderr).
    """
    suite, index = parse_task_id(task_id)
    cmd = [str(python), str(ROBOSUITE_DRIVER), "--benchmark", LIBERO_SUITE[suite], "--index", str(index),
           "--size", str(size), "--seconds", str(seconds), "--actions", actions, *([] if cameras else ["--no-cameras"])]
    # Its own budget: building the scene takes 5-15 s, a step 0.1-0.5 s under load.
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=300 + 3 * seconds)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"LIBERO's robosuite environment failed in {python}: {last}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**result, "load_after": load_average()}


def speedups(robosuite: dict[str, Any] | None, robosuite_no_render: dict[str, Any] | None,
             batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Batch env-steps/s over robosuite's per ``num_envs`` (with cameras, and without on both sides), the
    best, and whether it meets the target (with cameras)."""
    out: dict[str, Any] = {}
    if robosuite is not None:
        per = {str(b["num_envs"]): b["env_steps_per_s"] / robosuite["env_steps_per_s"] for b in batch}
        out.update(speedup=per, best_speedup=max(per.values()), target_speedup=TARGET_SPEEDUP,
                   target_met=max(per.values()) >= TARGET_SPEEDUP)
        out["cpu_speedup"] = {str(b["num_envs"]): robosuite["cpu_ms_per_env_step"] / b["cpu_ms_per_env_step"]
                              for b in batch}
    if robosuite_no_render is not None:
        base = robosuite_no_render["env_steps_per_s"]
        out["no_render_speedup"] = {str(b["num_envs"]): b["no_render_env_steps_per_s"] / base for b in batch}
        cpu = robosuite_no_render["cpu_ms_per_env_step"]
        out["no_render_cpu_speedup"] = {str(b["num_envs"]): cpu / b["no_render_cpu_ms_per_env_step"] for b in batch}
    return out


def print_table(console: Console, task_id: str, results: dict[str, Any]) -> None:
    size = results["size"]
    table = Table(title=f"LIBERO {task_id}, 2 cameras at {size}x{size}, {results['actions']} actions, batch on "
                        f"{results['threads']} threads; ratio = batch / robosuite, CPU ms per env-step")
    for col in ("simulator", "envs", "env-steps/s", "frames/s", "ratio", "CPU ms", "ratio",
                "no cameras: env-steps/s", "ratio", "CPU ms", "ratio"):
        table.add_column(col, justify="left" if col == "simulator" else "right")
    rs, rs0 = results.get("robosuite"), results.get("robosuite_no_render")
    if rs is not None or rs0 is not None:
        table.add_row("robosuite", "1", _num(rs, "env_steps_per_s"), _num(rs, "frames_per_s"), "1.0",
                      _num(rs, "cpu_ms_per_env_step"), "1.0", _num(rs0, "env_steps_per_s"), "1.0",
                      _num(rs0, "cpu_ms_per_env_step"), "1.0")
    for b in results["batch"]:
        n = str(b["num_envs"])
        ratios = [results.get(key, {}).get(n) for key in
                  ("speedup", "cpu_speedup", "no_render_speedup", "no_render_cpu_speedup")]
        shown = ["" if r is None else f"{r:.2f}" for r in ratios]
        table.add_row("batch", n, _num(b, "env_steps_per_s"), _num(b, "frames_per_s"), shown[0],
                      _num(b, "cpu_ms_per_env_step"), shown[1], _num(b, "no_render_env_steps_per_s"), shown[2],
                      _num(b, "no_render_cpu_ms_per_env_step"), shown[3])
    console.print(table)
    console.print(f"load average before {results['load_before']}, after {results['load_after']}")


def _num(row: dict[str, Any] | None, key: str) -> str:
    return "" if row is None else f"{row[key]:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=output_path, help="write the figures here (atomically)")
    parser.add_argument("--task", default="spatial/0", help="LIBERO task id (suite/index)")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--threads", type=int, default=2, help="batch physics threads")
    parser.add_argument("--size", type=int, default=128, help="camera height and width")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed stepping per figure")
    parser.add_argument("--actions", choices=("random", "zero"), default="random")
    parser.add_argument("--libero-python", type=Path, default=None,
                        help="LIBERO's interpreter (default: .venv-libero, made if missing)")
    parser.add_argument("--skip-robosuite", action="store_true", help="only the batch side")
    parser.add_argument("--smoke", action="store_true", help="2 envs, 0.3 s per figure (tests)")
    parser.add_argument("--visual-faces", type=lambda v: None if v == "full" else int(v), default=VISUAL_FACES,
                        help="triangle budget of LIBERO's visual meshes in the batch backend ('full': none)")
    args = parser.parse_args()
    if args.smoke:
        args.num_envs, args.seconds = [2], 0.3
    try:
        parse_task_id(args.task)
        ensure_tasks([args.task])
        python = None if args.skip_robosuite else (args.libero_python or ensure_libero_venv())
    except (ValueError, RuntimeError) as err:
        sys.exit(f"bench_libero: {err}")
    console = Console(width=max(Console().width, 140))  # the table's eleven columns
    results: dict[str, Any] = {"task": args.task, "size": args.size, "actions": args.actions, "threads": args.threads,
                               "load_before": load_average()}
    if python is not None:
        for key, cameras in (("robosuite", True), ("robosuite_no_render", False)):
            with console.status(f"LIBERO's robosuite environment, one process, {'both' if cameras else 'no'} cameras"):
                try:
                    results[key] = bench_robosuite(python, args.task, args.size, args.seconds, args.actions, cameras)
                except RuntimeError as err:
                    sys.exit(f"bench_libero: {err}")
            if args.json:  # each part written as it ends: a failure later keeps it
                write_report(args.json, vars(args), results)
    results["batch"] = []
    for n in args.num_envs:
        with console.status(f"batch backend, {n} envs"):
            results["batch"].append(bench_sim(args.task, n, args.size, args.seconds, args.actions, args.visual_faces,
                                              threads=args.threads))
        if args.json:
            write_report(args.json, vars(args), results)
    results.update(speedups(results.get("robosuite"), results.get("robosuite_no_render"), results["batch"]),
                   load_after=load_average())
    print_table(console, args.task, results)
    if args.json:
        write_report(args.json, vars(args), results)
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

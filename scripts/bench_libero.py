"""LIBERO's own robosuite environment beside the batch backend on the same task, arm and cameras.

    python scripts/bench_libero.py --json docs/figures/libero/bench_libero.json
    python scripts/bench_libero.py --smoke --skip-robosuite --json /tmp/bench.json    # the batch side, seconds

Both sides step one LIBERO task (default ``spatial/0``) from its fixed initial state 0 with the
same actions (uniform in [-1, 1]^7, or zeros), at 20 Hz, with LIBERO's OSC_POSE controller
recomputing the torques at every 2 ms substep, and produce at every step what a policy reads:
``agentview`` and ``robot0_eye_in_hand`` at 128x128 and the proprioception.

- ``robosuite``: LIBERO's ``OffScreenRenderEnv`` (robosuite 1.4.0, mujoco 2.3.7, full meshes, 4x
  multisampling) in LIBERO's own virtual environment (``scripts/setup_libero_venv.py``, made here if
  missing), stepped by ``scripts/libero_robosuite_steps.py``: ``robosuite_parallel`` is ``--procs``
  such processes (default: one per core, as RLinf and SimpleVLA-RL run LIBERO) timed over the same
  seconds, ``robosuite`` one process, ``robosuite_no_render`` one process built without cameras.
- ``batch``: :class:`sims.libero.sim.LiberoSim` on the batch backend (``mujoco.batch``, ``--threads``
  physics threads, the batched EGL renderer) with :class:`sims.libero.osc.OscController` (``--controller
  servo``: the joint servos), at each ``--num-envs``, in two visual settings: ``batch_like`` draws what
  robosuite draws (LIBERO's full meshes, 4x multisampling), ``batch_lod`` the simulator's defaults
  (visual meshes decimated to ``--lod-faces`` triangles, ``sims.libero.toolchain.lod``; no
  multisampling); the physics is the same either way. ``visual_difference``: how far the second's
  frames are from the first's (mean absolute levels per camera, initial states 0-3).

Figures (``results``): every robosuite part and batch row has ``env_steps_per_s``, ``frames_per_s``
and ``cpu_ms_per_env_step`` (the processes' CPU time over the timed steps, all threads, per
env-step: it moves far less with other load than wall time); batch rows add the same step without
cameras (``no_render_*``), ``build_s`` and ``first_step_s``. ``comparisons.<setting>``:
``vs_parallel`` (the headline, like for like first) and ``vs_one`` ratios per ``num_envs``
(``speedup``: batch env-steps/s over robosuite's; ``cpu_speedup``: robosuite's CPU time per
env-step over batch's), ``no_render_vs_one``, and ``best_speedup`` against the setting's target
(:data:`TARGETS`). The load average before and after each part is recorded, with the provenance
of ``bench_report.write_report``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sims  # noqa: F401  (before mujoco: sims sets MuJoCo's headless GL defaults, EGL)

# isort: split
import mujoco
import numpy as np
from bench_libero_lod import frames as lod_frames
from bench_report import device_sync, output_path, write_report
from rich.console import Console
from rich.table import Table
from setup_libero_venv import clean_env, ensure_libero_venv

from infra.common.provenance import load_average
from sims.libero import osc
from sims.libero.scene import MIN_VISUAL_FACES, VISUAL_FACES, LiberoLayout, load_task
from sims.libero.sim import LiberoSim, libero_render_config
from sims.libero.suites import LIBERO_SUITE, parse_task_id
from sims.libero.toolchain.install import ensure_tasks
from sims.libero.vec_env import CONTROLLERS

SETTINGS = ("like", "lod")
"""The batch side's visual settings: ``like`` draws what robosuite draws (LIBERO's full meshes, its 4x
multisampling), ``lod`` the simulator's defaults (decimated visual meshes, no multisampling)."""
VISUALS = {"like": "full, 4x MSAA", "lod": "level of detail"}
TARGETS = {"like": 5.0, "lod": 15.0}
"""Env-steps/s over robosuite's on all cores that each setting is held to (issue 46)."""
READY_S = 300.0
"""How long the parallel robosuite processes may take to build and warm up (5-15 s each alone)."""
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
              warp_device: str = "cpu", model: tuple[mujoco.MjModel, LiberoLayout] | None = None,
              controller: str = "osc", samples: int = 0) -> dict[str, Any]:
    """Env-steps/s of ``num_envs`` environments on ``backend`` ("batch", or "warp" on ``warp_device``),
    with and without both cameras at ``size`` x ``size`` (``samples``: multisampling, 4 is LIBERO's);
    ``controller``: ``osc`` (LIBERO's OSC_POSE on the torque motors, :mod:`sims.libero.osc`) or ``servo``;
    ``model``: the task's :func:`~sims.libero.scene.build_model` result to reuse (None: built here, inside
    ``build_s``; its arm then decides the controller).

    ``build_s`` is the sim's construction and first reset (the warp backend's device model and
    renderer), ``first_step_s`` the first full step (on warp: kernel compilation and CUDA graph
    capture); warp rows add ``graphs_captured``.
    """
    start = time.perf_counter()
    sim = LiberoSim(load_task(task_id), num_envs, backend=backend, render=libero_render_config(size, samples=samples),
                    num_threads=threads, warp_device=warp_device, model=model, visual_faces=visual_faces,
                    arm=CONTROLLERS[controller])
    sim.reset(np.zeros(num_envs, np.int64))
    arm = osc.make_controller(sim)
    device = getattr(sim.backend, "device", None)
    sync = functools.partial(device_sync, device)
    sync()
    build_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    obs: dict[str, Any] = {}

    def step(render: bool) -> None:
        arm.step(sim, actions_for(actions, rng, num_envs))
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
    row = {"num_envs": num_envs, "controller": "osc" if sim.layout.torque_arm else "servo",
           "env_steps_per_s": full * num_envs, "frames_per_s": 2 * full * num_envs,
           "cpu_ms_per_env_step": 1e3 * cpu / num_envs, "no_render_env_steps_per_s": no_render * num_envs,
           "no_render_cpu_ms_per_env_step": 1e3 * cpu_no_render / num_envs, "build_s": round(build_s, 2),
           "first_step_s": round(first_step_s, 2), "load_after": load_average()}
    if backend == "warp":
        row["graphs_captured"] = sim.backend.graphs_captured
    return row


def _robosuite_cmd(python: Path, task_id: str, size: int, seconds: float, actions: str, cameras: bool,
                   seed: int = 0) -> list[str]:
    suite, index = parse_task_id(task_id)
    return [str(python), str(ROBOSUITE_DRIVER), "--benchmark", LIBERO_SUITE[suite], "--index", str(index),
            "--size", str(size), "--seconds", str(seconds), "--actions", actions, "--seed", str(seed),
            *([] if cameras else ["--no-cameras"])]


def _child_result(proc: subprocess.CompletedProcess | subprocess.Popen, stdout: str, stderr: str,
                  python: Path) -> dict[str, Any]:
    if proc.returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"LIBERO's robosuite environment failed in {python}: {last}")
    return json.loads(stdout.strip().splitlines()[-1])


def bench_robosuite(python: Path, task_id: str, size: int, seconds: float, actions: str,
                    cameras: bool = True) -> dict[str, Any]:
    """LIBERO's robosuite environment stepped by ``scripts/libero_robosuite_steps.py`` under ``python``
    (with both cameras, or ``cameras=False``: none and no renderer), one process.

    Raises:
        RuntimeError: the child failed (its last line of stderr).
    """
    cmd = _robosuite_cmd(python, task_id, size, seconds, actions, cameras)
    # Its own budget: building the scene takes 5-15 s, a step 0.1-0.5 s under load.
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=300 + 3 * seconds)
    return {**_child_result(proc, proc.stdout, proc.stderr, python), "load_after": load_average()}


class _Child:
    """One robosuite process of the parallel baseline: its output read by a thread (robosuite prints lines of
    its own before ``ready``), its errors into a file."""

    def __init__(self, cmd: list[str], errors: Path):
        self.errors = errors
        with errors.open("w") as err:
            self.proc = subprocess.Popen(cmd, env=clean_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.strip() == "ready":
                self.ready.set()
        self.ready.set()  # exited: whoever waits learns it from the return code

    def wait_ready(self, deadline: float) -> None:
        """Raises RuntimeError: the process exited first, or ``deadline`` (``time.monotonic``) passed."""
        if not self.ready.wait(max(0.0, deadline - time.monotonic())):
            raise RuntimeError(f"a robosuite process was not ready within {READY_S:.0f} s (building LIBERO's scene, "
                               "10 warm-up steps); see it alone with --procs 1")
        if self.proc.poll() is not None and not any(line.strip() == "ready" for line in self.lines):
            last = (self.errors.read_text().strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"a robosuite process exited before it was ready: {last}")

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.close()

    def result(self, timeout: float, python: Path) -> dict[str, Any]:
        """The process's JSON line once it ends. Raises RuntimeError: it failed (its last line of stderr)."""
        self.proc.wait(timeout)
        self.reader.join(timeout)
        return _child_result(self.proc, "".join(self.lines), self.errors.read_text(), python)


def bench_robosuite_parallel(python: Path, task_id: str, size: int, seconds: float, actions: str,
                             procs: int) -> dict[str, Any]:
    """``procs`` robosuite processes (one environment each, both cameras, seeds 0..procs-1) timed over the same
    seconds, as RLinf and SimpleVLA-RL run LIBERO on a machine's cores: the sum of their env-steps/s and their
    CPU time per env-step (all of them together).

    Raises:
        RuntimeError: a child failed (its last line of stderr) or did not get ready within :data:`READY_S`.
    """
    with tempfile.TemporaryDirectory() as tmp:
        children = [_Child([*_robosuite_cmd(python, task_id, size, seconds, actions, True, seed=k), "--wait-go"],
                           Path(tmp) / f"{k}.err") for k in range(procs)]
        try:
            deadline = time.monotonic() + READY_S
            for child in children:  # every environment built and warmed up before any clock starts
                child.wait_ready(deadline)
            for child in children:  # all at once: the clocks start together
                child.go()
            rows = [child.result(300 + 3 * seconds, python) for child in children]
        finally:
            for child in children:
                if child.proc.poll() is None:
                    child.proc.kill()
    steps = sum(r["steps"] for r in rows)
    cpu_ms = sum(r["cpu_ms_per_env_step"] * r["steps"] for r in rows)
    return {"procs": procs, "env_steps_per_s": sum(r["env_steps_per_s"] for r in rows),
            "frames_per_s": sum(r["frames_per_s"] for r in rows), "cpu_ms_per_env_step": cpu_ms / steps,
            "per_process_env_steps_per_s": [r["env_steps_per_s"] for r in rows], "versions": rows[0]["versions"],
            "load_after": load_average()}


def ratios(base: dict[str, Any], rows: list[dict[str, Any]], render: bool = True) -> dict[str, dict[str, float]]:
    """Per ``num_envs``: batch env-steps/s over ``base``'s (``speedup``) and ``base``'s CPU time per env-step over
    batch's (``cpu_speedup``); ``render=False`` compares the batch rows' figures without cameras."""
    rate, cpu = ("env_steps_per_s", "cpu_ms_per_env_step") if render else \
        ("no_render_env_steps_per_s", "no_render_cpu_ms_per_env_step")
    return {"speedup": {str(r["num_envs"]): r[rate] / base["env_steps_per_s"] for r in rows},
            "cpu_speedup": {str(r["num_envs"]): base["cpu_ms_per_env_step"] / r[cpu] for r in rows}}


def comparisons(results: dict[str, Any]) -> dict[str, Any]:
    """Every ratio ``results`` allows: each batch setting against robosuite on all cores (the headline: like for
    like first) and against one robosuite process, the same without cameras, and each setting's best ratio
    against its target."""
    out: dict[str, Any] = {}
    for setting in SETTINGS:
        rows = results.get(f"batch_{setting}")
        if not rows:
            continue
        cmp: dict[str, Any] = {}
        for base_key, name in (("robosuite_parallel", "vs_parallel"), ("robosuite", "vs_one")):
            if base_key in results:
                cmp[name] = ratios(results[base_key], rows)
        if "robosuite_no_render" in results:
            cmp["no_render_vs_one"] = ratios(results["robosuite_no_render"], rows, render=False)
        if "vs_parallel" in cmp:
            best = max(cmp["vs_parallel"]["speedup"].values())
            cmp.update(best_speedup=best, target_speedup=TARGETS[setting], target_met=best >= TARGETS[setting])
        out[setting] = cmp
    return out


def visual_difference(task_id: str, size: int, lod_faces: int | None) -> dict[str, Any]:
    """Mean absolute difference in levels (0-255) per camera, and the 99th percentile, between the level-of-detail
    frames (``lod_faces`` triangles, no multisampling) and the like-for-like ones (LIBERO's full meshes, 4x
    multisampling) of initial states 0-3."""
    like, _, _ = lod_frames(task_id, 4, size, 1, None, 4)
    lod, _, _ = lod_frames(task_id, 4, size, 1, lod_faces, 0)
    diff = np.abs(lod - like)
    return {"mean_abs_agentview": round(float(diff[:, 0].mean()), 2), "mean_abs_wrist": round(float(diff[:, 1].mean()), 2),
            "p99_abs": float(np.percentile(diff, 99)), "states": 4}


def print_table(console: Console, task_id: str, results: dict[str, Any]) -> None:
    size = results["size"]
    table = Table(title=f"LIBERO {task_id}, 2 cameras at {size}x{size}, {results['actions']} actions, "
                        f"{results['controller']} arm, batch on {results['threads']} threads; ratio = batch / "
                        "robosuite on all cores (one process), CPU ms per env-step")
    for col in ("simulator", "visuals", "envs", "env-steps/s", "ratio", "(one)", "CPU ms", "CPU ratio",
                "no cameras: env-steps/s", "ratio (one)"):
        table.add_column(col, justify="left" if col in ("simulator", "visuals") else "right")
    for key, label in (("robosuite_parallel", "robosuite x{procs}"), ("robosuite", "robosuite x1")):
        rs = results.get(key)
        if rs is not None:
            rs0 = results.get("robosuite_no_render") if key == "robosuite" else None
            table.add_row(label.format(procs=rs.get("procs", 1)), "full, 4x MSAA", "1" if key == "robosuite" else
                          str(rs["procs"]), _num(rs, "env_steps_per_s"), "", "", _num(rs, "cpu_ms_per_env_step"), "",
                          _num(rs0, "env_steps_per_s"), "")
    for setting in SETTINGS:
        cmp = results.get("comparisons", {}).get(setting, {})
        for b in results.get(f"batch_{setting}", []):
            n = str(b["num_envs"])
            table.add_row("batch", VISUALS[setting], n, _num(b, "env_steps_per_s"),
                          _ratio(cmp, "vs_parallel", "speedup", n), _ratio(cmp, "vs_one", "speedup", n),
                          _num(b, "cpu_ms_per_env_step"), _ratio(cmp, "vs_parallel", "cpu_speedup", n),
                          _num(b, "no_render_env_steps_per_s"), _ratio(cmp, "no_render_vs_one", "speedup", n))
    console.print(table)
    if "visual_difference" in results:
        console.print(f"level of detail against like for like: {results['visual_difference']}")
    console.print(f"load average before {results['load_before']}, after {results.get('load_after')}")


def _ratio(cmp: dict[str, Any], base: str, key: str, n: str) -> str:
    value = cmp.get(base, {}).get(key, {}).get(n)
    return "" if value is None else f"{value:.2f}"


def _num(row: dict[str, Any] | None, key: str) -> str:
    return "" if row is None else f"{row[key]:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=output_path, help="write the figures here (atomically)")
    parser.add_argument("--task", default="spatial/0", help="LIBERO task id (suite/index)")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="batch physics threads")
    parser.add_argument("--procs", type=int, default=os.cpu_count(),
                        help="robosuite processes for the parallel baseline (default: the cores)")
    parser.add_argument("--size", type=int, default=128, help="camera height and width")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed stepping per figure")
    parser.add_argument("--actions", choices=("random", "zero"), default="random")
    parser.add_argument("--controller", choices=tuple(CONTROLLERS), default="osc",
                        help="the batch side's arm: osc (LIBERO's OSC_POSE, as robosuite) or servo")
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS),
                        help="the batch side's visuals: like (LIBERO's full meshes, 4x MSAA) and/or lod")
    parser.add_argument("--lod-faces", type=int, default=VISUAL_FACES,
                        help="triangle budget of each visual mesh in the lod setting")
    parser.add_argument("--libero-python", type=Path, default=None,
                        help="LIBERO's interpreter (default: .venv-libero, made if missing)")
    parser.add_argument("--skip-robosuite", action="store_true", help="only the batch side")
    parser.add_argument("--smoke", action="store_true", help="2 envs, 0.3 s per figure (tests)")
    args = parser.parse_args()
    if args.smoke:
        args.num_envs, args.seconds = [2], 0.3
    if min(args.num_envs) < 1 or args.procs < 1 or args.threads < 1 or args.lod_faces < MIN_VISUAL_FACES:
        sys.exit(f"bench_libero: --num-envs, --procs and --threads must be >= 1 and --lod-faces >= {MIN_VISUAL_FACES}")
    try:
        parse_task_id(args.task)
        ensure_tasks([args.task])
        python = None if args.skip_robosuite else (args.libero_python or ensure_libero_venv())
    except (ValueError, RuntimeError) as err:
        sys.exit(f"bench_libero: {err}")
    console = Console(width=max(Console().width, 140))  # the table's ten columns
    results: dict[str, Any] = {"task": args.task, "size": args.size, "actions": args.actions, "threads": args.threads,
                               "controller": args.controller, "load_before": load_average()}

    def save() -> None:  # after each part: a failure later keeps what was measured
        results.update(comparisons=comparisons(results), load_after=load_average())
        if args.json:
            write_report(args.json, vars(args), results)

    if python is not None:
        parts = (("robosuite_parallel", f"{args.procs} processes, both cameras",
                  lambda: bench_robosuite_parallel(python, args.task, args.size, args.seconds, args.actions, args.procs)),
                 ("robosuite", "one process, both cameras",
                  lambda: bench_robosuite(python, args.task, args.size, args.seconds, args.actions)),
                 ("robosuite_no_render", "one process, no cameras",
                  lambda: bench_robosuite(python, args.task, args.size, args.seconds, args.actions, False)))
        for key, what, run in parts:
            with console.status(f"LIBERO's robosuite environment, {what}"):
                try:
                    results[key] = run()
                except RuntimeError as err:
                    sys.exit(f"bench_libero: {err}")
            save()
    for setting in args.settings:
        faces, samples = (None, 4) if setting == "like" else (args.lod_faces, 0)
        results[f"batch_{setting}"] = []
        for n in args.num_envs:
            with console.status(f"batch backend, {VISUALS[setting]}, {n} envs"):
                results[f"batch_{setting}"].append(bench_sim(args.task, n, args.size, args.seconds, args.actions, faces,
                                                             threads=args.threads, controller=args.controller,
                                                             samples=samples))
            save()
    if set(SETTINGS) <= set(args.settings):
        with console.status("frames: level of detail against like for like"):
            results["visual_difference"] = visual_difference(args.task, args.size, args.lod_faces)
    save()
    print_table(console, args.task, results)
    if args.json:
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

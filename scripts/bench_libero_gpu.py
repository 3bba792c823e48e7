"""LIBERO on the warp backend on one GPU: env-steps/s and frames/s with both cameras (issue 38, item 3).

    scripts/bench_libero_gpu.sh OUT.json            # the prepared command (at most 7 minutes, one JSON)
    python scripts/bench_libero_gpu.py --smoke --json /tmp/b.json   # toy size on Warp's CPU device

Per task (default ``spatial/0``), camera size (``--sizes``, 128 then 64) and number of worlds
(``--envs``), :func:`bench_libero.bench_sim` steps :class:`sims.libero.sim.LiberoSim` on the warp
backend with :class:`sims.libero.controller.PandaController` from LIBERO's fixed initial state 0
with uniform random actions: one env-step is the controller, 25 physics substeps, proprioception,
the goal and (with cameras) ``agentview`` and ``robot0_eye_in_hand`` ray traced on the device.
Each row of ``results["rows"]`` holds ``task``, ``size``, ``num_envs``, ``env_steps_per_s``,
``frames_per_s`` (2 x env-steps/s), ``no_render_env_steps_per_s``, ``cpu_ms_per_env_step``,
``build_s`` (device model and renderer), ``first_step_s`` (kernel compilation at the first size,
CUDA graph capture) and ``graphs_captured``; a size that fails (out of memory, a contact
overflow, a failed capture) holds ``failed`` with the error, and the next size runs.
``results["model_build_s"]`` is each task's MuJoCo model build (shared by its sizes);
``best_env_steps_per_s`` the best row per camera size; ``target_met`` whether the best at 128x128
reaches the issue's 100k env-steps/s (None when no 128x128 row ran).

The JSON is rewritten after every row; rows left when ``--budget-s`` is spent are recorded as
skipped. ``--smoke`` runs 2 worlds at 16x16 on Warp's CPU device (a check of the script, not a figure).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import sys
import time
from typing import Any

import sims  # noqa: F401  (before mujoco: sims sets MuJoCo's headless GL defaults, EGL)

# isort: split
import torch
from bench_libero import bench_sim
from bench_report import output_path, write_report

from sims.libero.scene import VISUAL_FACES, build_model, load_task
from sims.libero.suites import cache_dir, parse_task_id, setup_hint
from sims.libero.toolchain.install import missing_tasks

TARGET_ENV_STEPS_PER_S = 100_000.0
TARGET_SIZE = 128


def device_name(device: str) -> str:
    """The GPU's name for ``cuda:N``, else what Warp runs on."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "Warp's CPU device (serial kernels)"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The best env-steps/s per camera size and whether the 128x128 one meets the target."""
    best: dict[str, float] = {}
    for row in rows:
        if "env_steps_per_s" in row:
            key = str(row["size"])
            best[key] = max(best.get(key, 0.0), row["env_steps_per_s"])
    at_target = best.get(str(TARGET_SIZE))
    return {"best_env_steps_per_s": best, "target_env_steps_per_s": TARGET_ENV_STEPS_PER_S,
            "target_met": None if at_target is None else at_target >= TARGET_ENV_STEPS_PER_S}


def measure(task_id: str, model: Any, size: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One row: ``n`` worlds of ``task_id`` at ``size`` x ``size``, or why it failed."""
    row: dict[str, Any] = {"task": task_id, "size": size}
    try:
        row.update(bench_sim(task_id, n, size, args.seconds, args.actions, args.visual_faces, backend="warp",
                             warp_device=args.device, model=model))
    except (ValueError, RuntimeError) as exc:  # out of memory, an overflow, a refused size: record it, go on
        row.update(num_envs=n, failed=f"{type(exc).__name__}: {exc}"[:500])
    finally:
        gc.collect()  # the last size's device buffers, before the next one allocates
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=output_path, required=True, help="write the figures here (after every row)")
    parser.add_argument("--tasks", default="spatial/0", help="comma-separated LIBERO task ids")
    parser.add_argument("--device", default="cuda:0", help='Warp device: "cuda:N", or "cpu" to exercise the script')
    parser.add_argument("--envs", default="256,1024,4096,8192", help="comma-separated numbers of worlds")
    parser.add_argument("--sizes", default="128,64", help="comma-separated camera sizes (square), in this order")
    parser.add_argument("--seconds", type=float, default=5.0, help="timed stepping per figure (at least 3 steps)")
    parser.add_argument("--actions", choices=("random", "zero"), default="random")
    parser.add_argument("--visual-faces", type=lambda v: None if v == "full" else int(v), default=VISUAL_FACES,
                        help="triangle budget of LIBERO's visual meshes ('full': none)")
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip the rows left after this long")
    parser.add_argument("--smoke", action="store_true", help="2 worlds at 16x16 on Warp's CPU device, 3 steps a figure")
    args = parser.parse_args()
    if args.smoke:
        args.device, args.envs, args.sizes, args.seconds = "cpu", "2", "16", 0.0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: torch sees no GPU here; pass --device cpu (or --smoke) to exercise the script")
    tasks = args.tasks.split(",")
    try:
        absent = missing_tasks(tasks, cache_dir())
    except ValueError as err:
        sys.exit(f"bench_libero_gpu: {err}")
    if absent:
        sys.exit(f"bench_libero_gpu: LIBERO tasks {' '.join(absent)} are not in the cache {cache_dir()}; "
                 f"{setup_hint(' '.join(absent))} (on the GPU machine: scripts/device/call4.sh, sent in .dev4, unpacks them)")

    began = time.perf_counter()
    config = {k: v for k, v in vars(args).items() if k != "json"}
    config.update(device_name=device_name(args.device), cameras="agentview + robot0_eye_in_hand",
                  versions={p: importlib.metadata.version(p) for p in ("mujoco", "mujoco-warp", "warp-lang")})
    results: dict[str, Any] = {"rows": [], "model_build_s": {}}
    for task_id in (f"{s}/{i}" for s, i in map(parse_task_id, tasks)):
        start = time.perf_counter()
        model = build_model(load_task(task_id), visual_faces=args.visual_faces)
        results["model_build_s"][task_id] = round(time.perf_counter() - start, 2)
        for size in (int(x) for x in args.sizes.split(",")):
            for n in (int(x) for x in args.envs.split(",")):
                if time.perf_counter() - began > args.budget_s:
                    row = {"task": task_id, "size": size, "num_envs": n,
                           "skipped": f"budget of {args.budget_s:.0f} s spent"}
                else:
                    row = measure(task_id, model, size, n, args)
                results["rows"].append(row)
                print({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
                results.update(summary(results["rows"]), wall_s=round(time.perf_counter() - began, 1))
                write_report(args.json, config, results)
    print(f"wrote {args.json} after {results['wall_s']:.0f} s; best env-steps/s per camera size: "
          f"{results['best_env_steps_per_s']}")


if __name__ == "__main__":
    main()

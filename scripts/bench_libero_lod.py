"""LIBERO's visual level of detail: frame cost and frame difference at each triangle budget.

    python scripts/bench_libero_lod.py --json docs/figures/libero/lod.json
    python scripts/bench_libero_lod.py --budgets 2000 --envs 2 --repeats 1    # seconds

One :class:`sims.libero.sim.LiberoSim` per row (batch backend, one GL context, both cameras at
``--size``), its environments started from the task's initial states 0..envs-1; per row the CPU
time per frame (``time.process_time`` over ``--repeats`` renders, all threads), the mesh triangles
the cameras draw, and the mean (per camera), 99th percentile and maximum absolute difference in
levels (0-255) from the full meshes without multisampling. Rows: the full meshes, the full meshes
with LIBERO's 4x multisampling, and each ``--budgets`` value.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import sims  # noqa: F401  (before mujoco: sims sets MuJoCo's headless GL defaults, EGL)

# isort: split
import mujoco
import numpy as np
from bench_report import output_path, write_report

from sims.libero.scene import load_task
from sims.libero.sim import LiberoSim, libero_render_config
from sims.libero.toolchain.install import ensure_tasks


def frames(task_id: str, envs: int, size: int, repeats: int, faces: int | None,
           samples: int) -> tuple[np.ndarray, int, float]:
    """Frames int16 [envs, 2, 3, size, size], drawn mesh triangles, CPU ms per frame."""
    sim = LiberoSim(load_task(task_id), envs, num_threads=1, visual_faces=faces,
                    render=libero_render_config(size, num_contexts=1, samples=samples))
    try:
        sim.reset(np.arange(envs))
        m = sim.model
        drawn = (m.geom_type == mujoco.mjtGeom.mjGEOM_MESH) & (m.geom_group < 3)
        triangles = int(m.mesh_facenum[m.geom_dataid[drawn]].sum())
        sim.render()  # textures and meshes reach the GL context on the first frame
        start = time.process_time()
        for _ in range(repeats):
            rgb = sim.render()
        ms = 1e3 * (time.process_time() - start) / (repeats * envs * 2)
    finally:
        sim.close()
    return rgb.astype(np.int16), triangles, ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=output_path, help="write the figures here (atomically)")
    parser.add_argument("--task", default="spatial/0")
    parser.add_argument("--budgets", type=int, nargs="+", default=[8000, 4000, 2000, 1000])
    parser.add_argument("--envs", type=int, default=16, help="initial states 0..envs-1")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ensure_tasks([args.task])
    ref, triangles, ms = frames(args.task, args.envs, args.size, args.repeats, None, 0)
    rows: list[dict[str, Any]] = [{"visual_faces": "full", "samples": 0, "drawn_triangles": triangles,
                                   "cpu_ms_per_frame": round(ms, 2)}]
    print(rows[0], flush=True)
    if args.json:
        write_report(args.json, vars(args), {"task": args.task, "rows": rows})
    for faces, samples in [(None, 4)] + [(b, 0) for b in args.budgets]:
        rgb, triangles, ms = frames(args.task, args.envs, args.size, args.repeats, faces, samples)
        diff = np.abs(rgb - ref)
        rows.append({"visual_faces": faces or "full", "samples": samples, "drawn_triangles": triangles,
                     "cpu_ms_per_frame": round(ms, 2), "mean_abs_agentview": round(float(diff[:, 0].mean()), 2),
                     "mean_abs_wrist": round(float(diff[:, 1].mean()), 2),
                     "p99_abs": float(np.percentile(diff, 99)), "max_abs": int(diff.max())})
        print(rows[-1], flush=True)
        if args.json:  # after each row: a failure later keeps the rows before it
            write_report(args.json, vars(args), {"task": args.task, "rows": rows})


if __name__ == "__main__":
    main()

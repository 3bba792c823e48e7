"""Frames of a LIBERO task for people to look at: each camera at the start and at the end of the
suite's scripted expert acting from one of LIBERO's fixed initial states, as one PNG (rows: the
cameras; columns: first and last frame), and with ``--video`` the whole episode side by side.

    python scripts/render_libero.py --task spatial/0 --out docs/figures/libero/spatial_0_frames.png
    python scripts/render_libero.py --task object/3 --state 7 --out obj.png --video obj.mp4

The task must be in the export cache (``python scripts/setup_libero.py --tasks TASK``).
"""

from __future__ import annotations

import argparse
import sys

import imageio.v2 as imageio
import numpy as np
from bench_report import output_path
from PIL import Image, ImageDraw
from tqdm import tqdm

from infra.common.files import atomic_path
from sims.libero.expert import SETTLE_STEPS, run_episodes
from sims.libero.scene import CAMERAS, load_task
from sims.libero.sim import LiberoSim, libero_render_config
from sims.libero.vec_env import CONTROLLERS, LiberoEnvConfig


def run(task_id: str, state: int, size: int, max_steps: int | None) -> tuple[list[np.ndarray], bool, str]:
    """The expert's episode from fixed initial state ``state``: frames uint8 [cams, 3, H, W] per control
    step (the first before any action), whether it succeeded, and the task's instruction."""
    task = load_task(task_id)
    sim = LiberoSim(task, 1, render=libero_render_config(size, num_contexts=1), num_threads=1,
                    arm=CONTROLLERS[LiberoEnvConfig.controller])  # the env's default arm: LIBERO's OSC
    frames: list[np.ndarray] = []
    bar = tqdm(desc=f"{task_id} state {state}", unit="step")

    def record() -> None:
        frames.append(np.asarray(sim.render())[0])
        bar.update()

    try:
        success = run_episodes(sim, np.array([state]), max_steps, on_step=record)
        return frames, bool(success[0]), task.instruction
    finally:
        bar.close()
        sim.close()


def frame_grid(first: np.ndarray, last: np.ndarray, labels: tuple[str, ...]) -> Image.Image:
    """Rows = cameras, columns = first and last frame ([cams, 3, H, W] each), a label in each tile."""
    cams, _, h, w = first.shape
    grid = Image.new("RGB", (2 * w, cams * h))
    for c in range(cams):
        for col, (frame, when) in enumerate(((first, "start"), (last, "end"))):
            tile = Image.fromarray(np.ascontiguousarray(frame[c].transpose(1, 2, 0)))
            ImageDraw.Draw(tile).text((4, 2), f"{labels[c]}, {when}", fill=(255, 255, 255))
            grid.paste(tile, (col * w, c * h))
    return grid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, help="a LIBERO task id, e.g. spatial/0")
    parser.add_argument("--state", type=int, default=0, help="LIBERO's fixed initial state, 0-49")
    parser.add_argument("--size", type=int, default=256, help="frame width and height, pixels")
    parser.add_argument("--out", required=True, type=output_path, help="the PNG")
    parser.add_argument("--video", type=output_path, default=None, help="also an .mp4 or .gif of the episode")
    parser.add_argument("--max-steps", type=int, default=None, help="default: the suite's LIBERO limit")
    args = parser.parse_args(argv)
    if not 0 <= args.state < 50:
        parser.error(f"--state {args.state}: LIBERO has 50 fixed initial states per task, 0-49")
    if args.out.suffix != ".png" or (args.video is not None and args.video.suffix not in (".mp4", ".gif")):
        parser.error("--out must end in .png and --video in .mp4 or .gif")
    try:
        frames, success, language = run(args.task, args.state, args.size, args.max_steps)
    except (ValueError, FileNotFoundError) as exc:
        print(f"render_libero.py: {exc}", file=sys.stderr)
        return 2
    with atomic_path(args.out) as tmp:
        frame_grid(frames[0], frames[-1], CAMERAS).save(tmp, format="PNG")
    if args.video is not None:
        tiles = [np.concatenate(list(f.transpose(0, 2, 3, 1)), axis=1) for f in frames]  # cameras side by side
        with atomic_path(args.video) as tmp:
            imageio.mimsave(tmp, tiles, format=args.video.suffix[1:], fps=20)
    print(f"{args.task} state {args.state} ({language!r}): {'success' if success else 'failure'} after "
          f"{len(frames) - 1 - SETTLE_STEPS} steps (and LIBERO's {SETTLE_STEPS} wait steps) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Evaluate a checkpoint: ``python scripts/eval.py --checkpoint PATH [--instructions heldout|train] [--episodes N] [--device cpu|cuda|cuda:N]``.

Prints the success rate (overall and per task) of the deterministic policy on the chosen
instruction set; ``--video PATH`` saves environment 0's first episode, ``--json PATH`` the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

from vla_rl.checkpoint import CheckpointError
from vla_rl.config import ConfigError
from vla_rl.evaluate import evaluate_checkpoint
from vla_rl.runlog import upscale


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, evaluate, print (and optionally write) the figures; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint .pt, or a run directory")
    parser.add_argument("--instructions", choices=("heldout", "train"), default="heldout")
    parser.add_argument("--episodes", type=int, default=None, help="episodes (default: the run's eval.episodes)")
    parser.add_argument("--num-envs", type=int, default=None, help="parallel environments")
    parser.add_argument("--seed", type=int, default=None, help="reset seed (default: the run's evaluation seed)")
    parser.add_argument("--video", type=Path, default=None, help="write env 0's first episode (.mp4 or .gif)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--device", default="cpu", help="where the policy runs: cpu, cuda or cuda:N (default: cpu)")
    args = parser.parse_args(argv)
    if args.episodes is not None and args.episodes < 1:
        parser.error("--episodes must be at least 1")
    try:
        metrics, cfg, frames = evaluate_checkpoint(
            args.checkpoint, args.instructions, args.episodes, args.num_envs, args.seed, device=args.device
        )
    except (CheckpointError, ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{cfg.env.task} ({args.instructions} instructions), {metrics['episodes']:.0f} episodes:")
    for key, value in metrics.items():
        print(f"  {key:24s} {value:.3f}")
    if args.video and frames:
        import imageio.v2 as iio

        iio.mimwrite(args.video, [upscale(f) for f in frames], **({"fps": 20} if args.video.suffix == ".mp4" else {"duration": 50}))
        print(f"video: {args.video}")
    if args.json:
        import torch

        out = {
            "machine": {"cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(), "torch": torch.__version__},
            "config": {
                "checkpoint": str(args.checkpoint), "instructions": args.instructions, "task": cfg.env.task,
                "device": args.device,
            },
            "results": {k.replace("/", "_"): v for k, v in metrics.items()},
        }
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

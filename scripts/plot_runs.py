#!/usr/bin/env python
"""Curves of several training runs side by side (``infra.common.runlog.plot_runs``), from their metrics.csv.

    python scripts/plot_runs.py PPO=runs/a/rl GRPO=runs/b/rl --metrics episode_success eval/validation/success \\
        --x env_steps wall_time --window 10 --png docs/figures/libero/rl_spatial_cpu_curves.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_report import output_path

from infra.common.files import write_atomic
from infra.common.runlog import METRICS, plot_runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR", help="run directories (holding metrics.csv), labelled")
    ap.add_argument("--metrics", nargs="+", default=["episode_success", "eval/validation/success"])
    ap.add_argument("--x", nargs="+", default=["env_steps", "wall_time"], help="the x axes, columns of metrics.csv")
    ap.add_argument("--window", type=int, default=1, help="running mean over this many rows (per-iteration metrics)")
    ap.add_argument("--title", default="")
    ap.add_argument("--png", type=output_path, required=True)
    args = ap.parse_args(argv)
    runs = {}
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep or not (Path(path) / METRICS).is_file():
            ap.error(f"{item}: give LABEL=RUN_DIR with a RUN_DIR holding {METRICS}")
        runs[label] = Path(path)
    if args.window < 1:
        ap.error(f"--window {args.window}: give at least 1")
    write_atomic(args.png, plot_runs(runs, args.metrics, args.x, args.window, args.title))
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

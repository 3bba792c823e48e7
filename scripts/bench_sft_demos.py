#!/usr/bin/env python
"""SFT success against the number of demonstrations: the recipe's SFT stage alone, once per count.

    python scripts/bench_sft_demos.py --episodes 500 1000 2000 3000 --json runs/sft_demos.json \\
        --png runs/sft_demos.png [--config configs/suite_sft_rl.yaml] [key=value ...]

Each count N runs ``scripts/sft_rl.py`` with ``demos.episodes=N stages=[sft]`` under its own name
(``<name>-demos-N``; a finished one is reused) and tests the SFT checkpoint on fresh episodes of the
test splits. Writes ``{git, machine, config, results: {points: [{episodes, results, wall_s}]}}`` (after each count) and the curve.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_SILENT", "true")

from bench_report import output_path, write_report

from vla_rl.config import ConfigError
from vla_rl.recipe import load_recipe, run_recipe
from vla_rl.recipe_table import plot_demos_curve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None, help="recipe YAML (default: configs/suite_sft_rl.yaml)")
    parser.add_argument("--episodes", type=int, nargs="+", required=True, help="demonstration counts")
    parser.add_argument("--json", type=output_path, required=True, help="where to write the points")
    parser.add_argument("--png", type=output_path, help="where to draw the curve (paraphrase split)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted recipe overrides")
    args = parser.parse_intermixed_args(argv)
    try:
        base = load_recipe(args.config, args.overrides)
        recipes = [load_recipe(args.config, [*args.overrides, f"demos.episodes={n}", "stages=[sft]",
                                             f"name={base.name}-demos-{n}"]) for n in args.episodes]
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    points = []
    for n, recipe in zip(args.episodes, recipes):
        out = run_recipe(recipe)
        points.append({"episodes": n, "results": out["results"]["sft"], "wall_s": out["wall_s"]})
        paraphrase = out["results"]["sft"].get("paraphrase")
        if paraphrase:
            print(f"{n:6d} demonstrations: SFT {paraphrase['success']:.1%} on paraphrase (n={paraphrase['episodes']})")
        write_report(args.json, {"overrides": args.overrides, "config": str(args.config or ""),
                                 "recipes": [dataclasses.asdict(r) for r in recipes]}, {"points": points})
    if args.png and "paraphrase" in points[0]["results"]:
        plot_demos_curve(points, "paraphrase", args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())

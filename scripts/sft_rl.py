#!/usr/bin/env python
"""Demonstrations -> SFT -> RL -> test splits, in one command (vla_rl/recipe.py).

    python scripts/sft_rl.py --json runs/sft_rl.json                               # configs/suite_sft_rl.yaml
    python scripts/sft_rl.py --config configs/reach_sft_rl.yaml --json runs/reach_sft_rl.json
    python scripts/sft_rl.py seed=1 sft.sft.iterations=400 rl.total_env_steps=1000000 --json out.json

Writes ``{git, machine, config, results: {sft: {split: {success, ci95, success_<task>...}}, rl: {...}},
checkpoints: {sft, rl}, wall_s}``, after every stage's training and test too; relaunching the same command
continues an interrupted recipe.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_SILENT", "true")

from bench_report import output_path, write_report

from vla_rl.checkpoint import CheckpointError
from vla_rl.config import ConfigError
from vla_rl.recipe import RecipeStopped, load_recipe, run_recipe


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the recipe, print and write its figures; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None, help="recipe YAML (default: configs/suite_sft_rl.yaml)")
    parser.add_argument("--json", type=output_path, required=True, help="where to write the figures")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted recipe overrides")
    args = parser.parse_intermixed_args(argv)

    def write(out: dict) -> None:  # after every stage too: a run cut short by a time limit keeps its figures
        write_report(args.json, out["config"], out["results"], **{k: v for k, v in out.items()
                                                                    if k not in ("config", "results")})

    try:
        recipe = load_recipe(args.config, args.overrides)
        out = run_recipe(recipe, on_stage=write)
    except (ConfigError, CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RecipeStopped as exc:
        print(str(exc))
        return 0
    write(out)
    for stage, results in out["results"].items():
        for split, r in results.items():
            if isinstance(r, dict) and "ci95" in r:  # (a LIBERO stage also holds its protocol)
                low, high = r["ci95"]
                print(f"{stage:3s} {split:12s} {r['success']:6.1%}  [{low:.1%}, {high:.1%}]  n={r['episodes']}")
    print(f"recipe done in {out['wall_s']:.0f} s; figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Per-task table, seed summary and a bar chart of recipe results (vla_rl/recipe_table.py).

    python scripts/recipe_report.py runs/suite_sft_rl_s0.json runs/suite_sft_rl_s1.json \\
        --md docs/figures/training/suite_recipe_table.md --png docs/figures/training/suite_recipe_tasks.png \\
        --json docs/figures/training/suite_recipe_summary.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_report import output_path, write_report

from vla_rl.recipe_table import per_task_table, plot_per_task, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="scripts/sft_rl.py --json files, one per seed")
    ap.add_argument("--md", type=output_path, help="write the per-task table (markdown) here")
    ap.add_argument("--png", type=output_path, help="write the per-task bar chart (paraphrase split) here")
    ap.add_argument("--json", type=output_path, help="write the seed summary here")
    args = ap.parse_args()
    runs = [json.loads(Path(p).read_text()) for p in args.results]
    table, stats = per_task_table(runs), summary(runs)
    print(table)
    print(json.dumps(stats, indent=2))
    for out in (args.md, args.png, args.json):
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
    if args.md:
        args.md.write_text(table + "\n")
    if args.png:
        plot_per_task(runs, "paraphrase", args.png)
    if args.json:
        write_report(args.json, {"results": args.results}, stats)


if __name__ == "__main__":
    main()

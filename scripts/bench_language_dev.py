#!/usr/bin/env python
"""Success of a suite checkpoint on phrasings it never saw, on validation episodes: the honest
place to choose language settings (augmentation, encoder), since the paraphrase split is a test.

    python scripts/bench_language_dev.py --checkpoint runs/NAME --episodes 128 --json dev.json
    python scripts/bench_language_dev.py --checkpoint runs/NAME --set structures --json dev.json   # LIBERO's sentence shapes

Each task of ``--phrasings`` (YAML: task -> templates) is run on ``--episodes`` fresh validation
episodes; without it, the phrasings of the run's suite where it has its own (LIBERO: each task's
validation paraphrases, or with ``--set structures`` its paraphrases in sentence shapes no training, validation
or test set has, ``sims.libero.paraphrase``, whole sentences by task name such as ``libero_spatial/0``), else configs/language_dev.yaml (the gantry tasks' templates with {a}/{b}). The
JSON holds success overall (episodes pooled) and per task, with 95 % Wilson intervals.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from bench_report import output_path, write_report
from tqdm import tqdm

from vla_rl.checkpoint import CheckpointError
from vla_rl.evaluate import evaluate_checkpoint, suite_dev_phrasings, wilson_interval

DEFAULT_PHRASINGS = Path(__file__).resolve().parents[1] / "configs" / "language_dev.yaml"


def main(argv: list[str] | None = None) -> int:
    """Evaluate each task on its development phrasings; print and optionally write the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint .pt, or a run directory")
    parser.add_argument("--phrasings", type=Path, default=None,
                        help="YAML: task -> templates (default: the run's suite's own, else configs/language_dev.yaml)")
    parser.add_argument("--set", dest="which", default=None,
                        help="the suite's development phrasing set (LIBERO: validation, the default, or structures: "
                             "sentence shapes no other set has)")
    parser.add_argument("--episodes", type=int, default=128, help="validation episodes per task")
    parser.add_argument("--json", type=output_path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    try:
        phrasings = None if args.phrasings else suite_dev_phrasings(args.checkpoint, args.which)
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if phrasings is None:
        source = args.phrasings or DEFAULT_PHRASINGS
        phrasings = yaml.safe_load(source.read_text())
        if not isinstance(phrasings, dict) or not all(isinstance(v, list) and v for v in phrasings.values()):
            print(f"error: {source} must map each task to a non-empty list of templates", file=sys.stderr)
            return 2
    tasks, wins, total = {}, 0, 0
    for task, templates in tqdm(phrasings.items(), desc="tasks"):
        try:
            result = evaluate_checkpoint(args.checkpoint, "validation", args.episodes, templates=templates,
                                         task=task, record=False)
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        report = result.report()
        tasks[task] = {k: report[k] for k in ("success", "episodes", "ci95")}
        wins += sum(e.success for e in result.episodes)
        total += len(result.episodes)
    overall = {"success": wins / total, "episodes": total, "ci95": list(wilson_interval(wins, total))}
    print(f"dev phrasings, validation episodes: {100 * overall['success']:.1f} % (n={total}); "
          + ", ".join(f"{t} {100 * r['success']:.0f} %" for t, r in tasks.items()))
    if args.json:
        write_report(args.json, {"checkpoint": str(args.checkpoint), "phrasings": phrasings,
                                 "set": args.which, "episodes_per_task": args.episodes, "split": "validation"},
                     {**overall, "tasks": tasks})
    return 0


if __name__ == "__main__":
    sys.exit(main())

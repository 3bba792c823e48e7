#!/usr/bin/env python
"""Evaluate a LIBERO checkpoint by LIBERO's protocol, per task and per suite, with 95 % Wilson intervals.

    python scripts/eval_libero.py --checkpoint runs/libero-spatial/rl --json runs/libero_eval.json
    python scripts/eval_libero.py --checkpoint runs/NAME --splits fixed --episodes-per-task 50 --envs-per-task 10
    python scripts/eval_libero.py --checkpoint runs/NAME --json out.json \
        --instruction libero_spatial/4 "grab the bowl in the top drawer and set it on the plate"

Each task of the run's env plays its split's fixed initial states 0..E-1 once each (E =
``--episodes-per-task``, LIBERO's 50), after LIBERO's 10 settling steps, up to LIBERO's step limit
of the suite, with the deterministic policy. Splits: ``fixed`` (LIBERO's own states and
instructions), ``lan`` (LIBERO-PRO's paraphrased instructions, held out from training, with that
variant's fixed states) and ``paraphrase`` (the project's held-out paraphrases on the fixed states);
``--instruction TASK TEXT`` (repeatable; several for one task share its episodes round robin) has that
task play the ``fixed`` states with your sentence instead of its own, reported as the entry
``instruction`` beside the splits (``sims.libero.plugin.check_instructions`` refuses a sentence with
``{a}``/``{b}`` or a task not of the run before anything runs). Each task's rate on every split is
printed side by side (``results.side_by_side``). Writes
``{git, machine, config, results}``; ``results.protocol.caveat`` states
how this simulator differs from the one LIBERO's published numbers come from (docs/sims.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench_report import output_path, write_report

from vla_rl.checkpoint import CheckpointError
from vla_rl.config import ConfigError
from vla_rl.evaluate import USER_SPLIT, libero_protocol


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, evaluate, print and write the figures; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint .pt, or a run directory")
    parser.add_argument("--json", required=True, type=output_path, help="where to write the figures")
    parser.add_argument("--splits", nargs="+", default=["fixed", "lan"], help="LIBERO splits among fixed, lan, paraphrase (default: fixed lan)")
    parser.add_argument("--episodes-per-task", type=int, default=50, help="initial states per task (LIBERO: 50)")
    parser.add_argument("--envs-per-task", type=int, default=10, help="environments per task; must divide the episodes")
    parser.add_argument("--instruction", nargs=2, action="append", default=[], metavar=("TASK", "TEXT"),
                        help="play TASK (e.g. libero_spatial/4) on the fixed states with the sentence TEXT (repeatable)")
    parser.add_argument("--device", default="cpu", help="where the policy runs: cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    said: dict[str, list[str]] = {}
    for task, text in args.instruction:
        said.setdefault(task, []).append(text)
    try:
        results = libero_protocol(args.checkpoint, tuple(args.splits), args.episodes_per_task, args.envs_per_task,
                                  args.device, instructions=said)
    except (CheckpointError, ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for split, r in results["splits"].items():
        for name, rate in [*(("suite " + s, v) for s, v in r["suites"].items()), *r["tasks"].items()]:
            low, high = rate["ci95"]
            print(f"{split:10s} {name:14s} {rate['success']:6.1%}  [{low:.1%}, {high:.1%}]  n={rate['episodes']}")
    for name, rate in (results["splits"][USER_SPLIT]["tasks"] if said else {}).items():
        for text, r in rate["by_instruction"].items():
            print(f"{USER_SPLIT:10s} {name:14s} {r['success']:6.1%}  n={r['episodes']}  '{text}'")
    splits = list(results["splits"])
    print(f"{'':17s}" + "".join(f"{s:>12s}" for s in splits))
    beside = results["side_by_side"]
    for name, row in [*(("suite " + s, v) for s, v in beside["suites"].items()), *beside["tasks"].items()]:
        print(f"  {name:15s}" + "".join(f"{row[s]:12.1%}" if s in row else " " * 12 for s in splits))
    config = {k.replace("-", "_"): str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_report(args.json, config, results)
    print(results["protocol"]["caveat"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

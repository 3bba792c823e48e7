#!/usr/bin/env python
"""Evaluate a checkpoint on fresh episodes of one split, with 95 % Wilson intervals.

    python scripts/eval.py --checkpoint runs/NAME --split paraphrase --episodes 512 --json out.json
    python scripts/eval.py --checkpoint runs/NAME --split composition
    python scripts/eval.py --checkpoint runs/NAME --task reach --instruction "hover above the {a}" --instruction "find the {a}"
    python scripts/eval.py --checkpoint runs/NAME --instructions-file my_templates.txt --task lift
    python scripts/eval.py --checkpoint runs/LIBERO_RUN --split fixed --task libero_spatial/4 \
        --instruction "grab the bowl in the top drawer and set it on the plate"

Splits (``sims``): ``train``, ``validation`` (what may stop a run), and the test splits
``paraphrase`` (held-out templates) and ``composition`` (task x colour x object combinations never
instructed in training), each from its own seed stream. ``--instruction`` (repeatable) and
``--instructions-file`` (one template per line) replace the split's instructions: ``{a}`` and
``{b}`` are filled with each episode's entities ("red block"), and success is the task's own
predicate, so give templates that describe ``--task``. A LIBERO run takes whole instructions (no
``{a}``/``{b}``) of one task: the run's, or ``--task libero_<suite>/<i>`` of it; its splits are
``train``, ``validation``, ``fixed``, ``lan`` and ``paraphrase`` (held-out paraphrases on the fixed
states). Prints success overall, per task and per
instruction; ``--json PATH`` writes ``{git, machine, config, results}``; ``--video PATH`` saves
environment 0's first episode.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from bench_report import output_path, write_report

from infra.common.runlog import upscale
from sims.libero.vec_env import LIBERO_SPLITS
from sims.tasks import SPLITS
from vla_rl.checkpoint import CheckpointError
from vla_rl.config import ConfigError
from vla_rl.evaluate import evaluate_checkpoint


def _templates(args: argparse.Namespace) -> list[str]:
    templates = list(args.instruction or [])
    if args.instructions_file is not None:
        lines = args.instructions_file.read_text().splitlines()
        templates += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for template in templates:
        try:
            template.format(a="x", b="y")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"instruction template {template!r} may use only {{a}} and {{b}} ({exc})") from exc
    return templates


def _print(report: dict, title: str) -> None:
    def line(name: str, r: dict) -> str:
        low, high = r["ci95"]
        return f"  {name:44.44s} {r['success']:6.1%}  [{low:.1%}, {high:.1%}]  n={r['episodes']}"

    print(title)
    print(line("all", report))
    for name, r in report["tasks"].items():
        print(line(f"task {name}", r))
    for text, r in list(report["instructions"].items())[:40]:
        print(line(f"'{text}'", r))
    if len(report["instructions"]) > 40:
        print(f"  ... {len(report['instructions']) - 40} more instructions (all in --json)")


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, evaluate, print (and optionally write) the figures; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint .pt, or a run directory")
    parser.add_argument("--split", choices=list(dict.fromkeys([*SPLITS, *LIBERO_SPLITS])), default="paraphrase",
                        help="episodes' split (default: paraphrase; a LIBERO run's: train, validation, fixed, lan, paraphrase)")
    parser.add_argument("--instruction", action="append", metavar="TEXT", help="an instruction template (repeatable)")
    parser.add_argument("--instructions-file", type=Path, default=None, help="instruction templates, one per line")
    parser.add_argument("--task", default=None, help="evaluate this task of a multi-task run")
    parser.add_argument("--episodes", type=int, default=None, help="episodes (default: the run's eval.episodes)")
    parser.add_argument("--num-envs", type=int, default=None, help="parallel environments")
    parser.add_argument("--seed", type=int, default=None, help="reset seed (default: the run's evaluation seed)")
    parser.add_argument("--video", type=output_path, default=None, help="write env 0's first episode (.mp4 or .gif)")
    parser.add_argument("--json", type=output_path, default=None, help="write the figures as JSON")
    parser.add_argument("--sample", action="store_true",
                        help="draw actions from the policy's distribution (as training collects) instead of its mode")
    parser.add_argument("--device", default="cpu", help="where the policy runs: cpu, cuda or cuda:N (default: cpu)")
    args = parser.parse_args(argv)
    for flag, value in (("--episodes", args.episodes), ("--num-envs", args.num_envs)):
        if value is not None and value < 1:
            parser.error(f"{flag} {value}: must be at least 1 (omit it for the run's eval setting)")
    try:
        templates = _templates(args)
        result = evaluate_checkpoint(args.checkpoint, args.split, args.episodes, args.num_envs, args.seed,
                                     device=args.device, templates=templates or None, task=args.task,
                                     record=args.video is not None, sample=args.sample, progress=f"eval {args.split}")
    except (CheckpointError, ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfg = result.config
    report = result.report()
    seed = result.seed
    source = ("custom instructions" if templates else f"the {args.split} split") + (", sampled actions" if args.sample else "")
    _print(report, f"{args.task or cfg.env.task}: {report['episodes']} episodes of {source} (seed {seed}):")
    if args.video and result.frames:
        import imageio.v2 as iio

        args.video.parent.mkdir(parents=True, exist_ok=True)
        iio.mimwrite(args.video, [upscale(f) for f in result.frames],
                     **({"fps": 20} if args.video.suffix == ".mp4" else {"duration": 50}))
        print(f"video: {args.video}")
    if args.json:
        config = {"checkpoint": str(args.checkpoint), "split": args.split, "task": args.task or cfg.env.task,
                  "templates": templates, "episodes": report["episodes"], "seed": seed,
                  "num_envs": args.num_envs or cfg.eval.num_envs, "device": args.device,
                  "actions": "sampled" if args.sample else "mode", "trained_with": dataclasses.asdict(cfg)}
        write_report(args.json, config, report | {"steps_per_s": result.steps_per_s})
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""A training job over seeds, as a user runs it: the learning check of a config's outcome and its spread.

``python scripts/bench_seeds.py [--config configs/default.yaml] [--seeds 0 1 2 3 4] [--episodes 512]
[--split paraphrase] [--eval-seed 424242] [--out-dir runs/bench_seeds] [--json OUT.json] [--plot OUT.png]
[key=value ...]``

Each seed is the shipped command, ``scripts/train.py --config CONFIG seed=S name=... [key=value ...]``
(its stop rule, evaluations and checkpoints as configured), timed from launch to exit, then its final
checkpoint on ``--episodes`` fresh episodes of ``--split`` (``scripts/eval.py``; the evaluation seed is
disjoint from training's and validation's streams). Per seed the JSON holds the command's wall seconds, the
env steps, when validation first reached 90 %, the final validation success and the test success with its
95 % Wilson interval; over seeds the median, min and max. The report is written again after each seed, and
a seed whose run and evaluation are already in ``--out-dir`` is read back, not run again (a stopped
benchmark continues where it was). ``--plot`` draws validation success against env steps, one line per seed.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_report import BenchReport, output_path

ROOT = Path(__file__).resolve().parent.parent
VALIDATION = "eval/validation/success"


def _curve(run: Path) -> list[tuple[float, float, float]]:
    """``(env_steps, wall_time_s, validation success)`` of each evaluation in ``run``'s metrics.csv."""
    with open(run / "metrics.csv", newline="") as f:
        return [(float(r["env_steps"]), float(r["wall_time"]), float(r[VALIDATION]))
                for r in csv.DictReader(f) if r.get(VALIDATION)]


def _run_seed(args: argparse.Namespace, seed: int) -> dict:
    """Train and evaluate one seed (or read back what an earlier call left); its row of the report."""
    name = f"{args.name}-s{seed}"
    run, test = args.out_dir / name, args.out_dir / f"{name}-{args.split}.json"
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--config", str(args.config),
             f"out_dir={args.out_dir}", f"name={name}", f"seed={seed}", *args.overrides]
    timing = args.out_dir / f"{name}-wall.json"
    if not (run / "summary.json").exists() or not timing.exists():
        start = time.perf_counter()
        subprocess.run(train, check=True, cwd=ROOT)
        timing.write_text(json.dumps({"wall_s": time.perf_counter() - start}))
    if not test.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts/eval.py"), "--checkpoint", str(run), "--split",
                        args.split, "--episodes", str(args.episodes), "--seed", str(args.eval_seed),
                        "--json", str(test)], check=True, cwd=ROOT)
    summary, result = json.loads((run / "summary.json").read_text()), json.loads(test.read_text())["results"]
    curve = _curve(run)
    first_90 = next(((steps, wall) for steps, wall, success in curve if success >= 0.9), (None, None))
    return {"seed": seed, "command": " ".join(train[1:]), "wall_s": json.loads(timing.read_text())["wall_s"],
            "env_steps": summary["env_steps"], "final_validation": summary["final_eval"].get(VALIDATION),
            "steps_to_validation_90": first_90[0], "seconds_to_validation_90": first_90[1],
            f"{args.split}_success": result["success"], f"{args.split}_ci95": result["ci95"],
            f"{args.split}_episodes": result["episodes"], "curve": curve}


def _spread(rows: list[dict], key: str) -> dict | None:
    """Median, min and max of ``key`` over the seeds that have it."""
    values = [row[key] for row in rows if row.get(key) is not None]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)} \
        if values else None


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        steps, _, success = zip(*row["curve"]) if row["curve"] else ((), (), ())
        ax.plot(steps, success, marker=".", label=f"seed {row['seed']}")
    ax.axhline(0.9, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="env steps", ylabel="validation success", ylim=(0, 1.02), title="validation success per seed")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs/default.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--split", default="paraphrase", help="test split of the final evaluation")
    parser.add_argument("--episodes", type=int, default=512, help="test episodes per seed")
    parser.add_argument("--eval-seed", type=int, default=424242, help="reset seed of the test episodes")
    parser.add_argument("--name", default="seeds", help="run names: NAME-sSEED")
    parser.add_argument("--out-dir", type=output_path, default=ROOT / "runs/bench_seeds")
    parser.add_argument("--json", type=output_path)
    parser.add_argument("--plot", type=output_path)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides of every seed's run")
    args = parser.parse_args()
    if not args.config.is_file():
        parser.error(f"--config {args.config}: no such file; give a YAML under configs/")
    if args.episodes < 1 or len(set(args.seeds)) != len(args.seeds):
        parser.error("--episodes must be >= 1 and --seeds distinct")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report = BenchReport(args.json, vars(args))
    rows: list[dict] = []

    def measure(seed: int) -> dict:
        rows.append(_run_seed(args, seed))
        report.results["seeds"] = rows
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "curve"}), flush=True)
        if args.plot:
            _plot(rows, args.plot)
        return {"spread": {key: _spread(rows, key) for key in
                           (f"{args.split}_success", "final_validation", "wall_s", "seconds_to_validation_90")}}

    for seed in args.seeds:
        report.part(f"seed {seed}", lambda seed=seed: measure(seed))
    sys.exit(1 if report.failed else 0)

if __name__ == "__main__":
    main()

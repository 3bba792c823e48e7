#!/usr/bin/env python
"""The shipped HalfCheetah job, whole commands: ``scripts/train.py`` against Stable-Baselines3 PPO.

``python scripts/bench_halfcheetah.py [--seeds 0,1,2] [--cores 0,1] [--steps N] [--json PATH]``

Each run is one command pinned to one core (``taskset -c CORE``; runs on different cores go at the
same time): ours is ``scripts/train.py --config configs/halfcheetah_ppo.yaml seed=S`` exactly as
shipped (evaluations, videos, checkpoints, wandb offline), SB3 is ``scripts/bench_ppo.py --learners
sb3`` (the same network and PPO settings, no evaluation). Figures per run: the command's wall
seconds; ours also its iteration seconds (collect + update, summed), its evaluation seconds and
share (``summary.json``) and wall / iteration time (target: at most 1.3); both the final return
(mean raw return of the last 10 training episodes).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import queue
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from bench_ppo import last_episodes_mean
from bench_report import output_path, write_report

from vla_rl.config import CONFIG_DIR, load_config

ROOT = CONFIG_DIR.parent
CONFIG = CONFIG_DIR / "halfcheetah_ppo.yaml"


def command(learner: str, seed: int, steps: int, out_dir: Path) -> list[str]:
    """The command line of one run (without the ``taskset`` prefix)."""
    if learner == "ours":
        return [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", str(CONFIG), f"seed={seed}",
                f"total_env_steps={steps}", f"out_dir={out_dir}", f"name=ours-s{seed}", "log.progress=false"]
    return [sys.executable, str(ROOT / "scripts" / "bench_ppo.py"), "--learners", "sb3", "--seeds", str(seed),
            "--steps", str(steps), "--split-iterations", "0", "--json", str(out_dir / f"sb3-s{seed}.json")]


def figures(learner: str, seed: int, out_dir: Path) -> dict[str, float]:
    """What a finished run reports: ours from its run directory, SB3 from its bench_ppo JSON."""
    if learner == "sb3":
        run = json.loads((out_dir / f"sb3-s{seed}.json").read_text())["results"]["sb3"][f"seed{seed}"]
        return {"final_return": run["final_return"], "train_s": run["wall_s"], "eval_share": 0.0}
    run_dir = out_dir / f"ours-s{seed}"
    summary = json.loads((run_dir / "summary.json").read_text())
    with (run_dir / "metrics.csv").open() as f:
        rows = [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(f)]
    return {
        "final_return": last_episodes_mean(rows),
        "final_eval_return": summary["final_eval"].get("eval/return"),
        "train_wall_s": summary["wall_time_s"],
        "iteration_s": summary["iteration_time_s"],
        "eval_s": summary["eval_time_s"],
        "eval_share": summary["eval_share"],
        "env_steps": float(summary["env_steps"]),
    }


def run(learner: str, seed: int, steps: int, out_dir: Path, cores: queue.Queue) -> dict[str, float]:
    """Run one command on a free core; returns its wall seconds and figures."""
    core = cores.get()
    try:
        cmd = ["taskset", "-c", str(core), *command(learner, seed, steps, out_dir)]
        print(f"[core {core}] {' '.join(cmd)}", flush=True)
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
    finally:
        cores.put(core)
    if done.returncode:
        raise SystemExit(f"{learner} seed {seed} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = {"wall_s": wall, "core": core, **figures(learner, seed, out_dir)}
    if learner == "ours":
        out["wall_over_iteration_x"] = wall / out["iteration_s"]
    print(f"  {learner} seed {seed}: {out}", flush=True)
    return out


def summarize(results: dict[str, dict]) -> None:
    """Means over seeds per learner, printed."""
    for name, runs in results.items():
        seeds = [r for k, r in runs.items() if k.startswith("seed")]
        for key in ("wall_s", "final_return", "eval_share", "wall_over_iteration_x"):
            if seeds and key in seeds[0]:
                runs[f"{key}_mean"] = float(np.mean([r[key] for r in seeds]))
        print(f"{name:5s} " + "  ".join(f"{k} {v:.3f}" for k, v in runs.items() if k.endswith("_mean")))


def main(argv: list[str] | None = None) -> int:
    """Run every (learner, seed) pinned to the given cores, print the means, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--learners", default="ours,sb3", help="comma-separated: ours, sb3")
    parser.add_argument("--cores", default=",".join(map(str, sorted(os.sched_getaffinity(0)))),
                        help="cores to pin runs to, one run per core at a time (default: all usable)")
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default: the config's, 1M)")
    parser.add_argument("--out-dir", type=output_path, default=Path("runs/bench_halfcheetah"), help="run directories")
    parser.add_argument("--json", type=output_path, default=None, help="write {machine, config, results} here")
    args = parser.parse_args(argv)
    learners = args.learners.split(",")
    if not set(learners) <= {"ours", "sb3"}:
        parser.error(f"--learners={args.learners}: choose from ours, sb3")
    seeds = [int(s) for s in args.seeds.split(",")]
    steps = args.steps or load_config(CONFIG).total_env_steps
    out_dir = (args.out_dir / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out_dir.mkdir(parents=True)
    cores: queue.Queue = queue.Queue()
    for core in args.cores.split(","):
        cores.put(int(core))
    jobs = [(learner, seed) for seed in seeds for learner in learners]
    with ThreadPoolExecutor(cores.qsize()) as pool:
        done = {job: pool.submit(run, *job, steps, out_dir, cores) for job in jobs}
    results: dict[str, dict] = {name: {f"seed{s}": done[(name, s)].result() for s in seeds} for name in learners}
    summarize(results)
    if args.json:
        config = {"config": str(CONFIG.relative_to(ROOT)), "steps": steps, "seeds": seeds, "cores": args.cores,
                  "out_dir": str(out_dir), "commands": {n: " ".join(command(n, 0, steps, out_dir)) for n in learners}}
        write_report(args.json, config, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

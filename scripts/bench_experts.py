"""Success of the scripted experts per task: the ceiling of demonstrations and of SFT on them.

    python scripts/bench_experts.py --split validation --episodes 256 --json runs/bench_experts.json

Each task runs alone (``make_vec_env(task)``) with the clean expert (no DART noise), on fresh
episodes of ``--split``; success per task with its 95 % Wilson interval.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_report, when loaded by path

from bench_report import output_path, write_report
from tqdm import tqdm

from sims.experts import run_expert
from sims.tasks import SPLITS, TASK_NAMES
from sims.vec_env import make_vec_env
from vla_rl.evaluate import wilson_interval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="validation", choices=SPLITS)
    parser.add_argument("--episodes", type=int, default=256, help="episodes per task (a multiple of --num-envs)")
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1_000_003)
    parser.add_argument("--tasks", nargs="+", default=list(TASK_NAMES), choices=TASK_NAMES)
    parser.add_argument("--json", type=output_path, help="write {machine, config, results}")
    args = parser.parse_args()
    if args.episodes < args.num_envs or args.episodes % args.num_envs:
        parser.error(f"--episodes {args.episodes} must be a positive multiple of --num-envs {args.num_envs}")

    results = {}
    for task in tqdm(args.tasks, desc="experts"):
        env = make_vec_env(task, args.num_envs, seed=args.seed, split=args.split)
        try:
            success = run_expert(env, args.episodes // args.num_envs, seed=args.seed)
        finally:
            env.close()
        k, n = int(success.sum()), int(success.size)
        results[task] = {"success": k / n, "ci95": wilson_interval(k, n), "episodes": n}
        low, high = results[task]["ci95"]
        tqdm.write(f"{task:8s} {k / n:6.1%}  [{low:.1%}, {high:.1%}]  n={n}")
    if args.json is not None:
        write_report(args.json, vars(args), results)


if __name__ == "__main__":
    main()

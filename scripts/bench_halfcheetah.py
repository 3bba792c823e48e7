#!/usr/bin/env python
"""HalfCheetah-v5: our state PPO against Stable-Baselines3 PPO, in-process or as the shipped commands.

``python scripts/bench_halfcheetah.py [--learners ours,sb3] [--commands] [--seeds 0,1,2] [--steps N]
[--split-iterations K] [--json PATH]`` or ``python scripts/bench_halfcheetah.py --merge A.json B.json --json C.json``

Both learners use the same network (separate 64-64 tanh actor and critic MLPs, state-independent
log-std), the same PPO hyper-parameters (2048 transitions per update, 10 epochs, 32 minibatches of
64, lr 3e-4 annealed, clip 0.2, GAE 0.95, gamma 0.99) and the same observation and reward
normalisation (running statistics; SB3 through ``VecNormalize``). SB3 steps one environment (its
standard setting for MuJoCo); ours steps ``--envs`` environments x ``2048 / envs`` steps.

Modes (each run's final return is the mean raw return of its last 10 training episodes):

- in-process (default): each learner trains in this process, seeds one after another, one torch
  thread; figures: wall seconds and ours' mean iteration split simulate/render/infer/update.
- ``--commands``: each (learner, seed) is one command pinned to one core (``taskset -c CORE``; runs
  on different cores go at the same time): ours is ``scripts/train.py --config
  configs/halfcheetah_ppo.yaml seed=S`` exactly as shipped (evaluations, videos, checkpoints, wandb
  offline), SB3 is this script's in-process mode. Figures: the command's wall seconds; ours also its
  iteration seconds, evaluation seconds and share (``summary.json``) and wall / iteration time.
- ``--split-iterations K`` (either mode, or alone with ``--learners none``): K PPO iterations of
  ``--split-config`` (default: the VLA reach job) timed per phase after one warm-up iteration.
- ``--merge``: combine the seeds of several ``--json`` reports of one mode (runs split over
  processes or machines) into ``--json``; runs nothing.
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

import numpy as np
import torch
from bench_report import output_path, write_report

from vla_rl.config import CONFIG_DIR, load_config
from vla_rl.trainer import Trainer

TASK = "HalfCheetah-v5"
ROOT = CONFIG_DIR.parent
CONFIG = CONFIG_DIR / "halfcheetah_ppo.yaml"
LEARNERS = ("ours", "sb3")
TRANSITIONS_PER_UPDATE = 2048
# Per-run keys averaged over seeds into "<key>_mean" when the runs report them.
MEAN_KEYS = ("wall_s", "final_return", "eval_share", "wall_over_iteration_x")
QUIET = ["log.wandb=disabled", "log.video=false", "eval.every=0", f"checkpoint_every={10**9}", "log.progress=false"]


def last_episodes_mean(rows: list[dict[str, float]], count: int = 10) -> float:
    """Mean raw return of (about) the last ``count`` finished training episodes, from per-iteration rows.

    Each row that finished episodes carries ``episodes`` (how many) and ``episode_return`` (their mean);
    NaN when no episode finished (a run shorter than one episode has no return to report).
    """
    total, n = 0.0, 0.0
    for row in reversed(rows):
        if "episodes" in row:
            total += row["episode_return"] * row["episodes"]
            n += row["episodes"]
            if n >= count:
                break
    return total / n if n else float("nan")


def phase_means(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean seconds per iteration of each phase (``time/<phase>`` columns) and of the whole iteration."""
    out = {k: float(np.mean([r[f"time/{k}"] for r in rows])) for k in ("simulate", "render", "infer", "update")}
    out["total"] = float(np.mean([r["time/iteration"] for r in rows]))
    return out


def run_ours(steps: int, seed: int, envs: int, out_dir: Path) -> dict[str, float]:
    """Train our PPO in-process; returns final return, wall time and the mean iteration time split."""
    cfg = load_config(CONFIG, [
        f"total_env_steps={steps}", f"seed={seed}", f"env.num_envs={envs}",
        f"ppo.rollout_steps={TRANSITIONS_PER_UPDATE // envs}", f"out_dir={out_dir}",
        f"name=ours-s{seed}-{int(time.time())}", *QUIET,
    ])
    start = time.perf_counter()
    trainer = Trainer(cfg)
    summary = trainer.train()
    wall = time.perf_counter() - start
    trainer.close()
    rows = trainer.log.rows
    return {
        "final_return": last_episodes_mean(rows),
        "wall_s": wall,
        "env_steps": float(summary["env_steps"]),
        "steps_per_s": summary["env_steps"] / wall,
        **{f"iteration_{k}_s": v for k, v in phase_means(rows).items()},
    }


def run_sb3(steps: int, seed: int) -> dict[str, float]:
    """Train Stable-Baselines3 PPO in-process with the matching settings; returns final return and wall time."""
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.env_util import make_vec_env
        from stable_baselines3.common.vec_env import VecNormalize
    except ImportError as e:
        raise SystemExit(f"--learners sb3 needs Stable-Baselines3 ({e}): install the bench extra, "
                         "EXTRAS=dev,bench make setup") from e

    start = time.perf_counter()
    env = VecNormalize(make_vec_env(TASK, n_envs=1, seed=seed), norm_obs=True, norm_reward=True, gamma=0.99)
    model = PPO(
        "MlpPolicy", env, n_steps=TRANSITIONS_PER_UPDATE, batch_size=64, n_epochs=10,
        learning_rate=lambda f: 3e-4 * f, gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0,
        vf_coef=0.5, max_grad_norm=0.5,
        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.Tanh},
        seed=seed, device="cpu", verbose=0,
    )
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - start
    returns = [ep["r"] for ep in list(model.ep_info_buffer)[-10:]]
    env.close()
    return {"final_return": float(np.mean(returns)), "wall_s": wall, "env_steps": float(steps),
            "steps_per_s": steps / wall}


def iteration_split(config: Path, iterations: int, out_dir: Path) -> dict[str, float]:
    """Seconds of one PPO iteration of a job, split simulate/render/infer/update (mean of ``iterations``)."""
    cfg = load_config(config, [f"out_dir={out_dir}", f"name=split-{int(time.time())}", *QUIET,
                               "total_env_steps=1000000000"])
    trainer = Trainer(cfg)
    warmup = trainer.step()  # first-call allocations are not timed
    rows = [trainer.step() for _ in range(iterations)]
    trainer.close()
    out = {f"{k}_s": v for k, v in phase_means(rows).items()}
    out["env_steps_per_iteration"] = (rows[-1]["env_steps"] - warmup["env_steps"]) / len(rows)
    out["steps_per_s"] = out["env_steps_per_iteration"] / out["total_s"]
    out["update_fraction"] = out["update_s"] / out["total_s"]
    return out


def command(learner: str, seed: int, steps: int, out_dir: Path) -> list[str]:
    """The command line of one ``--commands`` run (without the ``taskset`` prefix)."""
    if learner == "ours":
        return [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", str(CONFIG), f"seed={seed}",
                f"total_env_steps={steps}", f"out_dir={out_dir}", f"name=ours-s{seed}", "log.progress=false"]
    return [sys.executable, str(Path(__file__).resolve()), "--learners", "sb3", "--seeds", str(seed),
            "--steps", str(steps), "--json", str(out_dir / f"sb3-s{seed}.json")]


def command_figures(learner: str, seed: int, out_dir: Path) -> dict[str, float]:
    """What a finished command reports: ours from its run directory, SB3 from its in-process JSON."""
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


def run_command(learner: str, seed: int, steps: int, out_dir: Path, cores: queue.Queue) -> dict[str, float]:
    """Run one command on a free core (taken from ``cores``, given back after); returns its wall seconds and figures."""
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
    out = {"wall_s": wall, "core": core, **command_figures(learner, seed, out_dir)}
    if learner == "ours":
        out["wall_over_iteration_x"] = wall / out["iteration_s"]
    print(f"  {learner} seed {seed}: {out}", flush=True)
    return out


def run_commands(learners: list[str], seeds: list[int], steps: int, cores: list[int],
                 out_dir: Path) -> dict[str, dict]:
    """Every (learner, seed) command, one per core at a time; returns ``{learner: {"seed<S>": figures}}``."""
    free: queue.Queue = queue.Queue()
    for core in cores:
        free.put(core)
    jobs = [(learner, seed) for seed in seeds for learner in learners]
    with ThreadPoolExecutor(len(cores)) as pool:
        done = {job: pool.submit(run_command, *job, steps, out_dir, free) for job in jobs}
    return {name: {f"seed{s}": done[(name, s)].result() for s in seeds} for name in learners}


def run_in_process(learners: list[str], seeds: list[int], steps: int, envs: int, out_dir: Path) -> dict[str, dict]:
    """Every (seed, learner) trained in this process, one after another; returns ``{learner: {"seed<S>": figures}}``."""
    results: dict[str, dict] = {name: {} for name in learners}
    for seed in seeds:
        for name in learners:
            print(f"[seed {seed}] {name} PPO, {steps} steps ...", flush=True)
            run = run_ours(steps, seed, envs, out_dir) if name == "ours" else run_sb3(steps, seed)
            results[name][f"seed{seed}"] = run
            print(f"  {run}", flush=True)
    return results


def summarize(results: dict[str, dict]) -> None:
    """Add each learner's means over its seeds (``MEAN_KEYS``), the final return's std and the speed-up; print them."""
    for name in LEARNERS:
        runs = [r for k, r in results.get(name, {}).items() if k.startswith("seed")]
        for key in MEAN_KEYS:
            if runs and key in runs[0]:
                results[name][f"{key}_mean"] = float(np.mean([r[key] for r in runs]))
        if runs:
            results[name]["final_return_std"] = float(np.std([r["final_return"] for r in runs]))
    if all(results.get(name, {}).get("wall_s_mean") for name in LEARNERS):
        results["wall_speedup_x_vs_sb3"] = results["sb3"]["wall_s_mean"] / results["ours"]["wall_s_mean"]
    print(f"\n{TASK} PPO, same network and steps")
    for name in LEARNERS:
        figures = {k: v for k, v in results.get(name, {}).items() if k.endswith(("_mean", "_std"))}
        if figures:
            print(f"  {name:5s} " + "  ".join(f"{k} {v:.3f}" for k, v in figures.items()))
    if "wall_speedup_x_vs_sb3" in results:
        print(f"  wall-time speed-up vs SB3: {results['wall_speedup_x_vs_sb3']:.2f}x")


def merge_reports(paths: list[Path]) -> tuple[dict, dict]:
    """Combine the seeds of several ``--json`` reports of one mode; returns config and results."""
    results: dict[str, dict] = {name: {} for name in LEARNERS}
    sources, modes = [], set()
    for path in paths:
        report = json.loads(path.read_text())
        sources.append({"file": str(path), "machine": report["machine"], "config": report["config"]})
        modes.add(report["config"].get("mode"))
        for name in LEARNERS:
            for key, run in report["results"].get(name, {}).items():
                if key.startswith("seed"):
                    if key in results[name]:
                        raise SystemExit(f"{path}: {name} {key} is already in an earlier report; merge each run once")
                    results[name][key] = run
    if len(modes) > 1:
        raise SystemExit(f"--merge: the reports come from different modes {sorted(map(str, modes))}; "
                         "merge in-process reports and --commands reports separately")
    summarize(results)
    return {"task": TASK, "mode": modes.pop(), "merged_from": sources}, results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: learners, seeds, cores and ``--envs`` are turned into lists and ints here."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learners", default="ours,sb3", help="comma-separated: ours, sb3; or none (split only)")
    parser.add_argument("--commands", action="store_true",
                        help="run the shipped commands pinned to --cores instead of training in this process")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default: the config's, 1M)")
    parser.add_argument("--envs", type=int, default=None,
                        help="our parallel environments in-process (must divide 2048; default: the config's, 8)")
    parser.add_argument("--cores", default=",".join(map(str, sorted(os.sched_getaffinity(0)))),
                        help="--commands: cores to pin runs to, one run per core at a time (default: all usable)")
    parser.add_argument("--split-config", type=Path, default=CONFIG_DIR / "default.yaml",
                        help="job whose PPO iteration --split-iterations times (default: the VLA reach job)")
    parser.add_argument("--split-iterations", type=int, default=0, help="iterations timed per phase (0: none)")
    parser.add_argument("--out-dir", type=output_path, default=Path("runs/bench_halfcheetah"), help="run directories")
    parser.add_argument("--json", type=output_path, default=None, help="write {git, machine, config, results} here")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                        help="combine the seeds of these reports into --json (runs nothing)")
    args = parser.parse_args(argv)
    args.learners = [] if args.learners == "none" else args.learners.split(",")
    if not set(args.learners) <= set(LEARNERS):
        parser.error(f"--learners={','.join(args.learners)}: choose from ours, sb3 (comma-separated) or none")
    if not args.learners and not args.split_iterations and not args.merge:
        parser.error("--learners none runs nothing: add --split-iterations K")
    if args.commands and args.envs is not None:
        parser.error("--envs applies to in-process runs; --commands runs configs/halfcheetah_ppo.yaml as shipped")
    if args.envs is not None and (args.envs <= 0 or TRANSITIONS_PER_UPDATE % args.envs):
        parser.error(f"--envs={args.envs} must divide {TRANSITIONS_PER_UPDATE} (the transitions per update)")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.cores = [int(c) for c in args.cores.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the chosen mode, print the comparison, optionally write JSON."""
    args = parse_args(argv)
    if args.merge:
        config, results = merge_reports(args.merge)
        if args.json:
            write_report(args.json, config, results)
        return 0
    torch.set_num_threads(1)
    shipped = load_config(CONFIG)
    steps, envs = args.steps or shipped.total_env_steps, args.envs or shipped.env.num_envs
    results: dict[str, dict] = {}
    if args.split_iterations:
        print(f"timing {args.split_iterations} PPO iterations of {args.split_config} ...", flush=True)
        results["iteration_split"] = iteration_split(args.split_config, args.split_iterations, args.out_dir)
        print(f"  {results['iteration_split']}", flush=True)
    config = {"task": TASK, "mode": "commands" if args.commands else "in-process", "config": str(CONFIG.relative_to(ROOT)),
              "learners": args.learners, "steps": steps, "seeds": args.seeds,
              "net": "separate 64-64 tanh actor and critic", "split_config": str(args.split_config),
              "split_iterations": args.split_iterations}
    if args.commands:
        out_dir = (args.out_dir / time.strftime("%Y%m%d-%H%M%S")).resolve()
        out_dir.mkdir(parents=True)
        results.update(run_commands(args.learners, args.seeds, steps, args.cores, out_dir))
        config.update(cores=args.cores, out_dir=str(out_dir),
                      commands={n: " ".join(command(n, 0, steps, out_dir)) for n in args.learners})
    else:
        results.update(run_in_process(args.learners, args.seeds, steps, envs, args.out_dir))
        config.update(our_envs=envs, sb3_envs=1)
    summarize(results)
    if args.json:
        write_report(args.json, config, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

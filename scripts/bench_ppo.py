#!/usr/bin/env python
"""State PPO against Stable-Baselines3 PPO on gymnasium HalfCheetah-v5, side by side.

``python scripts/bench_ppo.py [--steps 1000000] [--seeds 0,1] [--json PATH]``

Both learners use the same network (separate 64-64 tanh actor and critic MLPs, state-independent
log-std), the same PPO hyper-parameters (2048 steps per update, 10 epochs, 32 minibatches of 64,
lr 3e-4 annealed, clip 0.2, GAE 0.95, gamma 0.99) and the same observation and reward
normalisation (running statistics; SB3 through ``VecNormalize``). SB3 steps one environment (its
standard setting for MuJoCo); ours steps ``--envs`` environments x ``2048 / envs`` steps, the same
2048 transitions per update. Figures: final return (mean of the last 10 training episodes, raw
reward), wall time, and our PPO iteration's time split simulate/render/infer/update.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import numpy as np
import torch
from bench_report import output_path, write_report

from vla_rl.config import CONFIG_DIR, load_config
from vla_rl.trainer import Trainer

TASK = "HalfCheetah-v5"


def last_episodes_mean(rows: list[dict[str, float]], count: int = 10) -> float:
    """Mean raw return of (about) the last ``count`` finished training episodes, from per-iteration rows."""
    total, n = 0.0, 0.0
    for row in reversed(rows):
        if "episodes" in row:
            total += row["episode_return"] * row["episodes"]
            n += row["episodes"]
            if n >= count:
                break
    return total / max(n, 1.0)


def run_ours(steps: int, seed: int, envs: int, out_dir: Path) -> dict[str, float]:
    """Train our PPO; returns final return, wall time and the mean iteration time split."""
    cfg = load_config(
        CONFIG_DIR / "halfcheetah_ppo.yaml",
        [
            f"total_env_steps={steps}", f"seed={seed}", f"env.num_envs={envs}", f"ppo.rollout_steps={2048 // envs}",
            f"out_dir={out_dir}", f"name=ours-s{seed}-{int(time.time())}", "log.wandb=disabled", "log.video=false",
            "eval.every=0", f"checkpoint_every={10**9}", "log.progress=false",
        ],
    )
    start = time.perf_counter()
    trainer = Trainer(cfg)
    summary = trainer.train()
    wall = time.perf_counter() - start
    trainer.close()
    rows = trainer.log.rows
    split = {k: float(np.mean([r[f"time/{k}"] for r in rows])) for k in ("simulate", "render", "infer", "update")}
    return {
        "final_return": last_episodes_mean(rows),
        "wall_s": wall,
        "env_steps": float(summary["env_steps"]),
        "steps_per_s": summary["env_steps"] / wall,
        **{f"iteration_{k}_s": v for k, v in split.items()},
        "iteration_total_s": float(np.mean([r["time/iteration"] for r in rows])),
    }


def iteration_split(config: Path, iterations: int, out_dir: Path) -> dict[str, float]:
    """Seconds of one PPO iteration of a job (default: the VLA reach job), split simulate/render/infer/update."""
    cfg = load_config(
        config,
        [f"out_dir={out_dir}", f"name=split-{int(time.time())}", "log.wandb=disabled", "log.video=false",
         "eval.every=0", f"checkpoint_every={10**9}", "log.progress=false", "total_env_steps=1000000000"],
    )
    trainer = Trainer(cfg)
    warmup = trainer.step()  # first-call allocations are not timed
    rows = [trainer.step() for _ in range(iterations)]
    trainer.close()
    out = {f"{k}_s": float(np.mean([r[f"time/{k}"] for r in rows])) for k in ("simulate", "render", "infer", "update")}
    out["total_s"] = float(np.mean([r["time/iteration"] for r in rows]))
    out["env_steps_per_iteration"] = (rows[-1]["env_steps"] - warmup["env_steps"]) / len(rows)
    out["steps_per_s"] = out["env_steps_per_iteration"] / out["total_s"]
    out["update_fraction"] = out["update_s"] / out["total_s"]
    if out["render_s"] == 0.0 and cfg.env.kind == "sims" and cfg.env.render:
        # The env exposes no timers: split "simulate" by stepping the same actions with rendering on and off.
        share = render_share(cfg, steps=cfg.ppo.rollout_steps)
        out["render_s"] = out["simulate_s"] * share
        out["simulate_s"] -= out["render_s"]
        out["render_split"] = "estimated: share of env.step time that rendering adds, measured with rendering on/off"
    return out


def render_share(cfg, steps: int) -> float:
    """Fraction of a rendering env's step time spent rendering (same actions with rendering on and off)."""
    from dataclasses import replace

    from vla_rl.envs import make_env

    seconds = {}
    actions = torch.rand(steps, cfg.env.num_envs, 4) * 2 - 1
    for render in (True, False):
        env = make_env(replace(cfg.env, render=render), seed=cfg.seed)
        env.reset_td(seed=cfg.seed)
        start = time.perf_counter()
        for a in actions:
            env.step_td(a)
        seconds[render] = time.perf_counter() - start
        env.close()
    return max(0.0, 1.0 - seconds[False] / seconds[True])


def run_sb3(steps: int, seed: int) -> dict[str, float]:
    """Train Stable-Baselines3 PPO with the matching settings; returns final return and wall time."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    start = time.perf_counter()
    env = VecNormalize(make_vec_env(TASK, n_envs=1, seed=seed), norm_obs=True, norm_reward=True, gamma=0.99)
    model = PPO(
        "MlpPolicy", env, n_steps=2048, batch_size=64, n_epochs=10, learning_rate=lambda f: 3e-4 * f,
        gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.Tanh},
        seed=seed, device="cpu", verbose=0,
    )
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - start
    returns = [ep["r"] for ep in list(model.ep_info_buffer)[-10:]]
    env.close()
    return {"final_return": float(np.mean(returns)), "wall_s": wall, "env_steps": float(steps), "steps_per_s": steps / wall}


def summarize(results: dict[str, dict]) -> None:
    """Add each learner's mean and std of final return and mean wall time over its seeds, and the speed-up."""
    for name in ("ours", "sb3"):
        runs = [r for k, r in results[name].items() if k.startswith("seed")]
        if runs:
            results[name]["final_return_mean"] = float(np.mean([r["final_return"] for r in runs]))
            results[name]["final_return_std"] = float(np.std([r["final_return"] for r in runs]))
            results[name]["wall_s_mean"] = float(np.mean([r["wall_s"] for r in runs]))
    if results["sb3"] and results["ours"]:
        results["wall_speedup_x_vs_sb3"] = results["sb3"]["wall_s_mean"] / results["ours"]["wall_s_mean"]
    print("\nHalfCheetah-v5 PPO, same network and steps")
    for name in ("ours", "sb3"):
        r = results[name]
        if r:
            print(f"  {name:5s} final return {r['final_return_mean']:9.1f} +- {r['final_return_std']:.1f}   "
                  f"wall {r['wall_s_mean']:7.1f} s")
    if "wall_speedup_x_vs_sb3" in results:
        print(f"  wall-time speed-up vs SB3: {results['wall_speedup_x_vs_sb3']:.2f}x")


def merge_reports(paths: list[Path]) -> tuple[dict, dict]:
    """Combine the seeds of several ``--json`` reports (runs split over processes); returns config and results."""
    import json

    results: dict[str, dict] = {"ours": {}, "sb3": {}}
    sources = []
    for path in paths:
        report = json.loads(path.read_text())
        sources.append({"file": str(path), "machine": report["machine"]})
        for name in ("ours", "sb3"):
            for key, run in report["results"].get(name, {}).items():
                if key.startswith("seed"):
                    if key in results[name]:
                        raise SystemExit(f"{path}: {name} {key} is already in an earlier report; merge each run once")
                    results[name][key] = run
    summarize(results)
    return {"task": TASK, "merged_from": sources}, results


def main(argv: list[str] | None = None) -> int:
    """Run both learners over the seeds, print the comparison, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000, help="environment steps per run")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2")
    parser.add_argument("--envs", type=int, default=8, help="our parallel environments (2048 must be divisible)")
    parser.add_argument("--learners", default="ours,sb3",
                        help="comma-separated learners to run: ours, sb3 (separate processes can run each)")
    parser.add_argument("--skip-halfcheetah", action="store_true", help="skip the HalfCheetah comparison")
    parser.add_argument("--split-config", type=Path, default=CONFIG_DIR / "default.yaml",
                        help="job whose PPO iteration is timed per phase (default: the VLA reach job)")
    parser.add_argument("--split-iterations", type=int, default=3, help="iterations timed (0: skip)")
    parser.add_argument("--out-dir", type=output_path, default=Path("runs/bench_ppo"), help="our runs' directory")
    parser.add_argument("--json", type=output_path, default=None, help="write the figures as JSON")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                        help="combine the HalfCheetah seeds of these reports into --json (runs nothing)")
    args = parser.parse_args(argv)
    if args.merge:
        config, results = merge_reports(args.merge)
        if args.json:
            write_report(args.json, config, results)
        return 0
    if 2048 % args.envs:
        parser.error(f"--envs={args.envs} must divide 2048 (the transitions per update)")
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    learners = set(args.learners.split(","))
    if not learners or not learners <= {"ours", "sb3"}:
        parser.error(f"--learners={args.learners}: choose from ours, sb3 (comma-separated)")
    results: dict[str, dict] = {"ours": {}, "sb3": {}}
    if args.split_iterations:
        print(f"timing {args.split_iterations} PPO iterations of {args.split_config} ...", flush=True)
        results["iteration_split"] = iteration_split(args.split_config, args.split_iterations, args.out_dir)
        print(f"  {results['iteration_split']}", flush=True)
    for seed in [] if args.skip_halfcheetah else seeds:
        if "ours" in learners:
            print(f"[seed {seed}] our PPO, {args.steps} steps ...", flush=True)
            results["ours"][f"seed{seed}"] = run_ours(args.steps, seed, args.envs, args.out_dir)
            print(f"  {results['ours'][f'seed{seed}']}", flush=True)
        if "sb3" in learners:
            print(f"[seed {seed}] Stable-Baselines3 PPO, {args.steps} steps ...", flush=True)
            results["sb3"][f"seed{seed}"] = run_sb3(args.steps, seed)
            print(f"  {results['sb3'][f'seed{seed}']}", flush=True)
    summarize(results)
    if args.json:
        config = {"task": TASK, "steps": args.steps, "seeds": seeds, "our_envs": args.envs, "sb3_envs": 1,
                  "net": "separate 64-64 tanh actor and critic", "split_config": str(args.split_config),
                  "note": "shared 2-core machine; other helpers' jobs ran at the same time"}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_report(args.json, config, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Throughput of the training job per placement mode: in process, and on a local Ray cluster.

    python scripts/bench_placement.py --json runs/bench_placement.json
    python scripts/bench_placement.py --iterations 6 env.num_envs=64 --json out.json

Runs the same job (``--config``, default ``configs/default.yaml``, plus ``key=value`` overrides)
for a few PPO iterations in each mode — ``inprocess`` (no Ray), then ``colocated``,
``disaggregated`` and ``pipelined`` through ``vla_rl.fleet.run_fleet_job`` on one local Ray cluster
whose logical GPUs are declared by ``fleet.cluster`` (loopback, CPU only) — and reports, from each
run's metrics.csv without its first (warm-up) iteration, env-steps/s and the seconds per
iteration spent simulating, rendering, inferring, updating and waiting — the median over
``--rounds`` interleaved rounds, since the load of a shared machine drifts; the comparisons
between modes are medians of per-round ratios. ``wait`` is the time shards
sat blocked on the inference server (inference that simulation did not hide, plus transport), so
``infer - wait`` is the inference the mode hid behind simulation.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("WANDB_MODE", "disabled")

from bench_report import output_path, write_report

from vla_rl.config import TrainConfig, load_config

MODES = ("inprocess", "colocated", "disaggregated", "pipelined")
PHASES = ("simulate", "render", "infer", "update", "wait")


def mode_config(args: argparse.Namespace, mode: str, out_dir: Path, round_index: int = 0) -> TrainConfig:
    """The benchmarked job in ``mode``: no evaluation, no videos, ``--iterations`` iterations."""
    base = load_config(args.config, args.overrides)
    steps = args.iterations * base.env.num_envs * base.ppo.rollout_steps
    fixed = [
        f"fleet.mode={mode}", f"total_env_steps={steps}", f"out_dir={out_dir}", f"name=bench-{mode}-r{round_index}",
        "eval.every=0", "stop_success=null", "checkpoint_every=1000", "log.wandb=disabled", "log.progress=false",
        "log.video=false",
    ]
    return load_config(args.config, [*args.overrides, *fixed])


def run_mode(cfg: TrainConfig) -> list[dict[str, float]]:
    """Train ``cfg`` (in process or on Ray, by its fleet mode); returns metrics.csv's rows."""
    if cfg.fleet.mode == "inprocess":
        from vla_rl.trainer import Trainer

        trainer = Trainer(cfg)
        try:
            summary = trainer.train()
        finally:
            trainer.close()
    else:
        from vla_rl.fleet.job import run_fleet_job

        summary = run_fleet_job(cfg)
    with open(summary["metrics"], newline="") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def summarize(rows: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """Env-steps/s and mean seconds per iteration by phase, over the rows after ``warmup``."""
    kept = rows[warmup:] or rows
    wall = sum(r["time/iteration"] for r in kept)
    steps = kept[-1]["env_steps"] - (rows[warmup - 1]["env_steps"] if warmup and len(rows) > warmup else 0.0)
    out = {"env_steps_per_s": steps / wall, "iteration_s": wall / len(kept), "iterations_measured": float(len(kept))}
    for phase in PHASES:
        out[f"{phase}_s_per_iter"] = sum(r.get(f"time/{phase}", 0.0) for r in kept) / len(kept)
    # In process nothing overlaps inference; on Ray, inference the shards did not wait for was hidden.
    on_ray = any("time/wait" in r for r in kept)
    out["infer_hidden_s_per_iter"] = max(0.0, out["infer_s_per_iter"] - out["wait_s_per_iter"]) if on_ray else 0.0
    if any("fleet/batch_envs" in r for r in kept):
        out["server_batch_envs"] = sum(r.get("fleet/batch_envs", 0.0) for r in kept) / len(kept)
    return out


def median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Per-key median over rounds, plus every round's env-steps/s."""
    out = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    out["env_steps_per_s_rounds"] = [r["env_steps_per_s"] for r in rounds]
    return out


def ratios(rounds: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Ray overhead against in-process, and pipelined against co-located: the median of per-round values.

    Each round runs every mode back to back, so comparing within a round cancels most of the
    machine's drift between rounds; the per-round values are kept (``*_rounds``) to show the spread.
    """
    sps = {mode: [r["env_steps_per_s"] for r in runs] for mode, runs in rounds.items()}
    paired: dict[str, list[float]] = {}
    if "inprocess" in sps:
        for mode in MODES[1:]:
            if mode in sps:
                paired[f"ray_overhead_pct_{mode}"] = [
                    100.0 * (1.0 - ray / local) for ray, local in zip(sps[mode], sps["inprocess"])
                ]
    if "pipelined" in sps and "colocated" in sps:
        paired["ratio_pipelined_vs_colocated"] = [p / c for p, c in zip(sps["pipelined"], sps["colocated"])]
    out: dict[str, Any] = {key: statistics.median(values) for key, values in paired.items()}
    out |= {f"{key}_rounds": values for key, values in paired.items()}
    return out


def print_table(results: dict[str, dict[str, float]], extra: dict[str, Any]) -> None:
    """The human summary."""
    from rich.console import Console  # here, not at import: bench_sims_gpu.py reuses summarize() without rich
    from rich.table import Table

    table = Table(title="placement modes: env-steps/s and seconds per iteration")
    for col in ("mode", "env-steps/s", "iter s", *PHASES, "hidden infer"):
        table.add_column(col, justify="right")
    for mode, r in results.items():
        table.add_row(
            mode, f"{r['env_steps_per_s']:.0f}", f"{r['iteration_s']:.2f}",
            *(f"{r[f'{p}_s_per_iter']:.2f}" for p in PHASES), f"{r['infer_hidden_s_per_iter']:.2f}",
        )
    console = Console(width=140)
    console.print(table)
    for key, value in extra.items():
        if not key.endswith("_rounds"):
            rounds = ", ".join(f"{v:.3f}" for v in extra[f"{key}_rounds"])
            console.print(f"{key}: {value:.3f} (median of rounds: {rounds})")


def report_config(args: argparse.Namespace, cfg) -> dict:
    """The benchmark's settings and the first mode's resolved job config, for the JSON."""
    return {
        "config_file": str(args.config or "configs/default.yaml"), "overrides": args.overrides,
        "iterations": args.iterations, "warmup_iterations": 1, "rounds": args.rounds, "statistic": "median",
        "comparisons": "median of per-round ratios", "num_envs": cfg.env.num_envs,
        "rollout_steps": cfg.ppo.rollout_steps, "task": cfg.env.task, "render": cfg.env.frames is not None,
        "shards": cfg.fleet.shards, "stages": cfg.fleet.stages,
        "cluster": {"nodes": cfg.fleet.cluster.nodes, "gpus_per_node": cfg.fleet.cluster.gpus,
                    "gpu_model": cfg.fleet.cluster.gpu_model},
        "job": dataclasses.asdict(cfg),
    }


def main(argv: list[str] | None = None) -> int:
    """Run every requested mode, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None, help="YAML config (default: configs/default.yaml)")
    parser.add_argument("--iterations", type=int, default=5, help="PPO iterations per mode (the first is warm-up)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="repeat all modes this many times, interleaved, and report medians (load drifts)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--json", type=output_path, default=None, help="write machine/config/results as JSON")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    args = parser.parse_intermixed_args(argv)  # overrides may come before or after the options
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes has unknown mode(s) {unknown}; valid: {', '.join(MODES)}")
    if args.iterations < 2:
        parser.error(f"--iterations={args.iterations}: need at least 2 (the first is warm-up)")
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be at least 1")

    out_dir = Path(tempfile.mkdtemp(prefix="bench_placement_"))
    rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    configs = {mode: mode_config(args, mode, out_dir) for mode in modes}
    ray_modes = [m for m in modes if m != "inprocess"]
    from rich.console import Console

    console = Console()
    try:
        for r in range(args.rounds):
            if "inprocess" in modes:  # without Ray running, as a user would train in process
                console.print(f"round {r + 1}/{args.rounds}: [bold]inprocess[/bold] ...")
                rows = run_mode(mode_config(args, "inprocess", out_dir, r))
                rounds["inprocess"].append(summarize(rows, warmup=1))
            if ray_modes:
                from vla_rl.fleet.job import ray_cluster

                with ray_cluster(configs[ray_modes[0]].fleet):
                    for mode in ray_modes:
                        console.print(f"round {r + 1}/{args.rounds}: [bold]{mode}[/bold] on the local Ray cluster ...")
                        rounds[mode].append(summarize(run_mode(mode_config(args, mode, out_dir, r)), warmup=1))
            if args.json:  # after each round: a failure later keeps the rounds before it
                write_report(args.json, report_config(args, configs[modes[0]]),
                             {"rounds": {m: rounds[m] for m in modes if rounds[m]}})
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    results = {mode: median_of(rounds[mode]) for mode in modes}

    extra = ratios(rounds)
    print_table(results, extra)
    if args.json:
        write_report(args.json, report_config(args, configs[modes[0]]), {**results, "comparisons": extra, "rounds": rounds})
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

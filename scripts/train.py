#!/usr/bin/env python
"""Train a policy: ``python scripts/train.py [--config FILE] [--resume] [key=value ...]``.

Examples:
    python scripts/train.py                                   # the VLA on the reach task (configs/default.yaml)
    python scripts/train.py --config configs/suite.yaml       # the multi-task suite
    python scripts/train.py --config configs/halfcheetah_ppo.yaml total_env_steps=200000
    python scripts/train.py name=myrun ppo.optim.lr=1e-3      # dotted overrides of any config field
    python scripts/train.py name=myrun --resume               # continue runs/myrun from its latest checkpoint

A run stopped before its end (SIGTERM, a crash, SIGKILL) is resumed by relaunching the same command:
a run directory with checkpoints and no summary.json continues from its latest checkpoint. SIGTERM
checkpoints at the end of the iteration in progress and exits with status 0.

Results go to ``runs/NAME/``: config.yaml, checkpoints/, metrics.csv, curves.png, videos/, summary.json
and wandb/ (offline unless ``log.wandb=online``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_SILENT", "true")

from vla_rl.checkpoint import CheckpointError
from vla_rl.config import ConfigError, load_config
from vla_rl.trainer import Trainer, unfinished


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, train, print where the results are; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None, help="YAML config (default: configs/default.yaml)")
    parser.add_argument("--resume", action="store_true", help="continue runs/NAME from checkpoints/latest.pt")
    parser.add_argument("--ray", metavar="ADDRESS", default=None,
                        help="run on a Ray cluster ('local' starts one) through its scheduler service: sets fleet.address (and fleet.mode=colocated "
                             "unless the config picks another fleet mode)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    args = parser.parse_intermixed_args(argv)  # overrides may also follow --ray ADDRESS
    overrides = list(args.overrides)
    try:
        if args.ray is not None:
            overrides.append(f"fleet.address={args.ray}")
            if load_config(args.config, overrides).fleet.mode == "inprocess":
                overrides.append("fleet.mode=colocated")
        cfg = load_config(args.config, overrides)
        resume = args.resume or unfinished(cfg)
        if resume and not args.resume:
            print(f"{Path(cfg.out_dir) / cfg.run_name} holds an unfinished run: resuming it from its latest checkpoint")
        if cfg.fleet.mode != "inprocess":
            from vla_rl.fleet import run_fleet_job

            cfg.check()  # before Ray starts; in-process, Trainer checks it

            print(f"training {cfg.run_name} on Ray ({cfg.fleet.mode}), results in {Path(cfg.out_dir) / cfg.run_name}")
            summary = run_fleet_job(cfg, resume=resume)
        else:
            trainer = Trainer(cfg, resume=resume)
            print(f"training {cfg.run_name}: {cfg.algo} on {cfg.env.kind}:{cfg.env.task}, results in {trainer.run_dir}")
            try:
                summary = trainer.train()
            finally:
                trainer.close()
    except (ConfigError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if "stopped_by" in summary:
        print(f"\nstopped by {summary['stopped_by']} after iteration {summary['iterations']} "
              f"({summary['env_steps']} env steps); checkpoint: {summary['checkpoint']}; "
              "run the same command again to continue")
        return 0
    final = summary["final_eval"]
    print("\nfinal evaluation:")
    for key, value in sorted(final.items()):
        if key.endswith(("success", "return")) or "/success/" in key:
            print(f"  {key:40s} {value:.3f}")
    if summary["time_to_90pct_s"] is not None:
        print(f"time to 90% success: {summary['time_to_90pct_s']:.0f} s ({summary['steps_to_90pct']:.0f} env steps)")
    print(f"{summary['env_steps']} env steps in {summary['wall_time_s']:.0f} s")
    print(f"results: {summary['run_dir']}  (metrics.csv, curves.png, videos/, checkpoints/latest.pt, summary.json)")
    print(json.dumps({k: summary[k] for k in ("curves", "checkpoint")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Data parallel on one GPU, for checking: two ranks sharing the device, all-reducing through gloo.

    python scripts/device/dp_one_gpu.py --json $OUT/dp_one_gpu.json                       # cuda:0, co-located
    python scripts/device/dp_one_gpu.py --device cpu --json /tmp/dp.json env.num_envs=8   # Warp's CPU device

NCCL refuses two ranks on one GPU, and the GPU machine has no Ray: this runs the data-parallel path
(:func:`vla_rl.fleet.rank.join_rank`, the ranks of ``fleet.mode=data_parallel``: each a whole trainer over
half the environments, ``env.backend=warp`` on the device, gradients averaged in one all-reduce per
minibatch) in two local processes with the ``gloo`` backend, which all-reduces CUDA tensors through
the host. The trainer's own check (``GradientSync.check_equal``) fails an iteration whose ranks' weights
differ; the JSON gives each rank's env-steps/s (the two share the device: not a scaling figure) and
whether the ranks ended with the same weights.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from vla_rl.config import CONFIG_DIR, load_config

WORLD = 2


def _rank(rank: int, address: str, overrides: list[str], iterations: int, out: str) -> None:
    from vla_rl.fleet.rank import join_rank

    cfg = load_config(CONFIG_DIR / "default.yaml", overrides)
    trainer = join_rank(cfg, rank, WORLD, address, backend="gloo")
    try:
        trainer.step()  # warm-up: kernels, graphs
        start = time.perf_counter()
        rows = [trainer.step() for _ in range(iterations)]
        wall = time.perf_counter() - start
        steps = sum(cfg.env.num_envs // WORLD * cfg.ppo.rollout_steps for _ in rows)
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for p in trainer.policy.parameters()])
        torch.save({"env_steps_per_s": steps / wall, "weights": flat, "iterations": len(rows)}, f"{out}.{rank}")
    finally:
        trainer.close()
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations after one warm-up")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    run_dir = tempfile.mkdtemp(prefix="dp_one_gpu_")
    overrides = [f"device={args.device}", "env.backend=warp", f"env.warp_device={args.device}", "env.num_envs=1024",
                 "ppo.rollout_steps=16", "eval.every=0", "eval.at_start=false", "log.wandb=disabled",
                 "log.progress=false", "log.video=false", "checkpoint_every=1000", f"out_dir={run_dir}",
                 "name=dp-one-gpu", "stop_success=null", *args.overrides]
    load_config(CONFIG_DIR / "default.yaml", overrides)  # a bad override: one line here, before any process
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    out = f"{run_dir}/rank"
    began = time.perf_counter()
    mp.spawn(_rank, args=(address, overrides, args.iterations, out), nprocs=WORLD, join=True)
    ranks = [torch.load(f"{out}.{r}", weights_only=True) for r in range(WORLD)]
    report = {"device": args.device, "backend": "gloo", "ranks": WORLD, "overrides": overrides,
              "env_steps_per_s_per_rank": [r["env_steps_per_s"] for r in ranks],
              "weights_equal": bool(torch.equal(ranks[0]["weights"], ranks[1]["weights"])),
              "iterations": ranks[0]["iterations"], "wall_s": time.perf_counter() - began}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "overrides"}))
    return 0 if report["weights_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())

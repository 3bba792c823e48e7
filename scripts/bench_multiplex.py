"""Simulated benchmark: N concurrent RLVR jobs on M GPUs, dedicated placement vs multiplexing,
and request routers across rollout instances.

    python scripts/bench_multiplex.py [--jobs 8] [--gpus 32] [--iterations 8] [--json PATH]

The workload's distributions and the cost model are documented in infra/llm/simulate.py and
docs/llm_jobs.md. Multiplexing is evaluated at several slowdown bounds (the admission rule's
``max_slowdown``); the issue's target is the 1.10 bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

from infra.llm.router import EngineCost, load_router
from infra.llm.simulate import (
    Hardware,
    RouterWorkload,
    dedicated_placement,
    mixed_workload,
    multiplexed_placement,
    simulate_routing,
)

ROUTERS = ("round_robin", "least_loaded", "prefill_decode_aware")


def machine_info() -> dict[str, object]:
    """Cores, CPU model and package versions of this machine."""
    import ray
    import torch

    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu,
        "gpu": None,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "ray": ray.__version__,
        "note": "simulation: figures do not depend on this machine's speed",
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=8, help="concurrent RLVR jobs (half math, half agent)")
    ap.add_argument("--gpus", type=int, default=32, help="GPUs in the cluster")
    ap.add_argument("--iterations", type=int, default=8, help="RLVR iterations per job")
    ap.add_argument("--slowdowns", default="1.10,1.25,1.5,3.0", help="admission slowdown bounds to evaluate")
    ap.add_argument("--seed", type=int, default=0, help="evaluation draws (the planner profiles on seed+1)")
    ap.add_argument("--router-instances", type=int, default=4)
    ap.add_argument("--router-requests", type=int, default=4000)
    ap.add_argument("--router-rate", type=float, default=40.0, help="requests per second (Poisson)")
    ap.add_argument("--json", type=Path, default=None, help="write machine/config/results here")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.gpus < 1 or args.iterations < 1:
        ap.error("--jobs, --gpus and --iterations must be >= 1")
    bounds = [float(x) for x in args.slowdowns.split(",")]
    if any(b < 1.0 for b in bounds):
        ap.error(f"--slowdowns {args.slowdowns!r}: every bound must be >= 1.0 (1.10 = at most 10% slower)")

    console = Console()
    hw = Hardware()
    jobs = mixed_workload(args.jobs, args.iterations)
    dedicated = dedicated_placement(jobs, hw, cluster_gpus=args.gpus, seed=args.seed)
    ded = {
        "user_gpu_hours": dedicated.gpu_hours,
        "gpus_used": dedicated.gpus_used,
        "gpu_utilisation_pct": 100 * dedicated.utilisation,
        "jct_mean_s": float(np.mean([r["jct_s"] for r in dedicated.jobs.values()])),
        "jct_max_s": float(max(r["jct_s"] for r in dedicated.jobs.values())),
        "jct_per_job_s": {n: r["jct_s"] for n, r in dedicated.jobs.items()},
    }
    mux_results = {}
    for bound in track(bounds, description="planning multiplexed groups", console=console):
        m = multiplexed_placement(jobs, hw, dedicated, cluster_gpus=args.gpus, max_slowdown=bound, seed=args.seed, profile_seed=args.seed + 1)
        mux_results[f"max_slowdown_{bound:.2f}"] = {
            "groups": m.groups,
            "user_gpu_hours": m.gpu_hours,
            "gpu_hours_saving_pct": 100 * (1 - m.gpu_hours / dedicated.gpu_hours),
            "gpus_used": m.gpus_used,
            "gpu_utilisation_pct": 100 * m.utilisation,
            "jct_mean_s": float(np.mean([r["jct_s"] for r in m.jobs.values()])),
            "jct_max_s": float(max(r["jct_s"] for r in m.jobs.values())),
            "slowdown_max_ratio": float(max(r["slowdown"] for r in m.jobs.values())),
            "slowdown_per_job_ratio": {n: r["slowdown"] for n, r in m.jobs.items()},
        }

    cost = EngineCost()
    wl = RouterWorkload(requests=args.router_requests, rate_per_s=args.router_rate)
    routing = {}
    for name in track(ROUTERS, description="routing", console=console):
        routing[name] = simulate_routing(load_router(name, cost), args.router_instances, wl, cost, args.seed)

    target = mux_results.get("max_slowdown_1.10")
    results = {
        "multiplex": {"dedicated": ded, **mux_results},
        "router": routing,
        "targets": {
            "gpu_hours_saving_pct_at_slowdown_1_10": target["gpu_hours_saving_pct"] if target else None,
            "gpu_hours_saving_target_met": bool(target and target["gpu_hours_saving_pct"] >= 40 and target["slowdown_max_ratio"] <= 1.10),
            "router_ttft_p99_vs_round_robin_ratio": routing["prefill_decode_aware"]["ttft_p99_s"] / routing["round_robin"]["ttft_p99_s"],
            "router_beats_round_robin_p99": routing["prefill_decode_aware"]["ttft_p99_s"] < routing["round_robin"]["ttft_p99_s"],
        },
    }

    t = Table(title=f"{args.jobs} RLVR jobs on {args.gpus} GPUs (simulated)")
    for col in ("placement", "GPU-hours", "saving %", "GPUs", "util %", "mean JCT s", "max slowdown"):
        t.add_column(col)
    t.add_row("dedicated", f"{ded['user_gpu_hours']:.1f}", "-", str(ded["gpus_used"]), f"{ded['gpu_utilisation_pct']:.0f}", f"{ded['jct_mean_s']:.0f}", "1.00")
    for k, r in mux_results.items():
        t.add_row(f"multiplexed ({k})", f"{r['user_gpu_hours']:.1f}", f"{r['gpu_hours_saving_pct']:.1f}", str(r["gpus_used"]),
                  f"{r['gpu_utilisation_pct']:.0f}", f"{r['jct_mean_s']:.0f}", f"{r['slowdown_max_ratio']:.2f}")
    console.print(t)
    t2 = Table(title=f"routing over {args.router_instances} rollout instances (simulated)")
    for col in ("router", "TTFT p50 s", "TTFT p99 s", "mean e2e s"):
        t2.add_column(col)
    for name, r in routing.items():
        t2.add_row(name, f"{r['ttft_p50_s']:.3f}", f"{r['ttft_p99_s']:.3f}", f"{r['e2e_mean_s']:.2f}")
    console.print(t2)
    console.print(results["targets"])

    if args.json:
        payload = {
            "machine": machine_info(),
            "config": {
                "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "jobs": [dataclasses.asdict(j) for j in jobs],
                "hardware": dataclasses.asdict(hw),
                "router_workload": dataclasses.asdict(wl),
                "engine_cost": dataclasses.asdict(cost),
            },
            "results": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(payload, indent=2))
        os.replace(tmp, args.json)
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

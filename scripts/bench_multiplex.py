"""Simulated benchmark: N concurrent RLVR jobs on M GPUs, dedicated placement vs phase-sliced
multiplexing vs request-level service multiplexing, and request routers across rollout instances.

    python scripts/bench_multiplex.py [--jobs 8] [--gpus 32] [--iterations 8] [--json PATH]
    python scripts/bench_multiplex.py --real [--real-compute] --json PATH   # measured on a local Ray cluster

The workload's distributions and the cost model are documented in infra/llm/sim/workload.py and
docs/llm_jobs.md; the benchmark itself is infra.llm.sim.report (this script parses arguments into
its BenchConfig and prints the results). Phase-sliced multiplexing is evaluated at several slowdown
bounds (the admission rule's ``max_slowdown``); request-level multiplexing sizes the shared pool,
static (held for the whole run) and elastic (GPUs taken and handed back as the load changes), to the
cheapest one that keeps every job within ``--service-slowdown`` (the issue's target: 1.10).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from bench_report import output_path, write_report
from rich.console import Console
from rich.progress import track
from rich.table import Table

from infra.llm.pool_shape import PoolShape
from infra.llm.sim.real_bench import RealBenchConfig, run_real
from infra.llm.sim.report import BenchConfig, run_simulated


def _parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=d.jobs, help="concurrent RLVR jobs (half math, half agent)")
    ap.add_argument("--gpus", type=int, default=d.gpus, help="GPUs in the cluster")
    ap.add_argument("--iterations", type=int, default=d.iterations, help="RLVR iterations per job")
    ap.add_argument(
        "--slowdowns",
        default=",".join(f"{b:g}" for b in d.slowdowns),
        help="admission slowdown bounds to evaluate (comma-separated)",
    )
    ap.add_argument(
        "--seed", type=int, default=d.seed, help="evaluation draws (the planner profiles on seed+1)"
    )
    ap.add_argument(
        "--service-slowdown",
        type=float,
        default=d.service_slowdown,
        help="slowdown bound the shared service pool is sized for",
    )
    ap.add_argument(
        "--home-nodes",
        type=int,
        default=d.home_nodes,
        help="nodes holding each job's state (request-level affinity)",
    )
    ap.add_argument(
        "--stagger-s",
        type=float,
        default=d.stagger_s,
        help="request-level runs only: job k arrives at k * this (default 0: all start together, as the other placements)",
    )
    ap.add_argument(
        "--max-resident",
        type=int,
        default=d.max_resident,
        help="jobs' weights resident on one rollout GPU at once",
    )
    ap.add_argument(
        "--keep-alive-s",
        type=float,
        default=d.keep_alive_s,
        help="elastic pool: seconds a GPU stays idle before it is handed back to the cluster",
    )
    ap.add_argument(
        "--provision-s",
        type=float,
        default=d.provision_s,
        help="elastic pool: seconds from taking a GPU to its first function",
    )
    ap.add_argument(
        "--priority",
        choices=("edf", "fifo"),
        default=d.priority,
        help="request-level queues: earliest deadline first from profiled paces (draws seed+10), or first-come first-served",
    )
    ap.add_argument("--router-instances", type=int, default=d.router_instances)
    ap.add_argument("--router-requests", type=int, default=d.router_requests)
    ap.add_argument("--router-rate", type=float, default=d.router_rate, help="requests per second (Poisson)")
    ap.add_argument("--json", type=output_path, default=None, help="write machine/config/results here")
    real = ap.add_argument_group("--real: the same comparison measured on a local Ray cluster (infra.llm.sim.real_bench)")
    r = RealBenchConfig()
    real.add_argument("--real", action="store_true", help="run the jobs on the elastic pool of the running system")
    real.add_argument("--real-compute", action="store_true",
                      help="with --real: the tiny model's real compute only (default: emulated compute)")
    real.add_argument("--real-jobs", type=int, default=r.jobs)
    real.add_argument("--real-iterations", type=int, default=r.iterations)
    real.add_argument("--time-scale", type=float, default=r.time_scale, help="wall seconds per workload second")
    real.add_argument("--rollout-slots", type=int, default=r.pool.rollout_gpus)
    real.add_argument("--trainer-slots", type=int, default=r.pool.trainer_gpus)
    real.add_argument("--real-keep-alive-s", type=float, default=r.pool.keep_alive_s, help="in workload seconds")
    return ap


def _real(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    cfg = RealBenchConfig(jobs=args.real_jobs, iterations=args.real_iterations, time_scale=args.time_scale,
                          seed=args.seed, emulate=not args.real_compute,
                          pool=PoolShape(args.rollout_slots, args.trainer_slots, rollout_homes=args.home_nodes,
                                         keep_alive_s=args.real_keep_alive_s))
    try:
        cfg.validate()
    except ValueError as e:
        ap.error(str(e))
    console = Console()
    results = run_real(cfg)
    console.print_json(data={k: results[k] for k in ("compute", "real", "sim_vs_real_error_pct", "routers_real_pool")})
    if args.json:
        write_report(args.json, {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                 "real": dataclasses.asdict(cfg)}, results)
        console.print(f"wrote {args.json}")
    return 0


def _config(ap: argparse.ArgumentParser, args: argparse.Namespace) -> BenchConfig:
    try:
        slowdowns = tuple(float(x) for x in args.slowdowns.split(","))
    except ValueError:
        ap.error(f"--slowdowns {args.slowdowns!r}: give comma-separated numbers, e.g. 1.10,1.25")
    cfg = BenchConfig(
        jobs=args.jobs,
        gpus=args.gpus,
        iterations=args.iterations,
        slowdowns=slowdowns,
        seed=args.seed,
        service_slowdown=args.service_slowdown,
        home_nodes=args.home_nodes,
        stagger_s=args.stagger_s,
        max_resident=args.max_resident,
        keep_alive_s=args.keep_alive_s,
        provision_s=args.provision_s,
        priority=args.priority,
        router_instances=args.router_instances,
        router_requests=args.router_requests,
        router_rate=args.router_rate,
    )
    try:
        cfg.validate()
    except ValueError as e:
        ap.error(str(e))
    return cfg


def _print_placements(console: Console, cfg: BenchConfig, multiplex: dict[str, Any]) -> None:
    t = Table(title=f"{cfg.jobs} RLVR jobs on {cfg.gpus} GPUs (simulated)")
    for col in ("placement", "GPU-hours", "saving %", "GPUs", "util %", "mean JCT s", "max slowdown"):
        t.add_column(col)
    ded = multiplex["dedicated"]
    t.add_row(
        "dedicated",
        f"{ded['user_gpu_hours']:.1f}",
        "-",
        str(ded["gpus_used"]),
        f"{ded['gpu_utilisation_pct']:.0f}",
        f"{ded['jct_mean_s']:.0f}",
        "1.00",
    )
    for k, r in multiplex.items():
        if k == "dedicated":
            continue
        t.add_row(
            f"multiplexed ({k})",
            f"{r['user_gpu_hours']:.1f}",
            f"{r['gpu_hours_saving_pct']:.1f}",
            str(r["gpus_used"]),
            f"{r['gpu_utilisation_pct']:.0f}",
            f"{r['jct_mean_s']:.0f}",
            f"{r['slowdown_max_ratio']:.2f}",
        )
    console.print(t)


def _print_routing(console: Console, cfg: BenchConfig, routing: dict[str, Any]) -> None:
    t = Table(title=f"routing over {cfg.router_instances} rollout instances (simulated)")
    for col in ("router", "TTFT p50 s", "TTFT p99 s", "mean e2e s"):
        t.add_column(col)
    for name, r in routing.items():
        t.add_row(name, f"{r['ttft_p50_s']:.3f}", f"{r['ttft_p99_s']:.3f}", f"{r['e2e_mean_s']:.2f}")
    console.print(t)


def _print_services(console: Console, cfg: BenchConfig, services: dict[str, Any]) -> None:
    t = Table(
        title=f"request-level service multiplexing, pools sized for slowdown <= {cfg.service_slowdown:.2f} (simulated)"
    )
    for col in (
        "placement",
        "GPUs (peak)",
        "reserved GPU-h",
        "charged GPU-h",
        "util %",
        "mean JCT s",
        "max slowdown",
    ):
        t.add_column(col)
    sd = services["static"]["dedicated"]
    t.add_row(
        "dedicated (same engine)",
        str(sd["gpus_used"]),
        f"{sd['user_gpu_hours_reserved']:.1f}",
        f"{sd['user_gpu_hours_charged']:.1f}",
        f"{sd['gpu_utilisation_pct']:.0f}",
        f"{sd['jct_mean_s']:.0f}",
        "1.00",
    )
    for kind, r in services.items():
        rl = r["request_level"]
        if rl is None:
            t.add_row(f"{kind}: {r['error']}", *["-"] * 6)
            continue
        t.add_row(
            f"{kind}: {rl['pool']['shape']['rollout_gpus']} rollout + {rl['pool']['shape']['trainer_gpus']} trainer (draw {cfg.seed})",
            f"{rl['gpus_used']} ({rl['peak_gpus']})",
            f"{rl['user_gpu_hours_reserved']:.1f} ({rl['saving_reserved_vs_dedicated_reserved_pct']:.0f}% less)",
            f"{rl['user_gpu_hours_charged']:.1f} ({rl['saving_charged_vs_dedicated_reserved_pct']:.0f}% less)",
            f"{rl['gpu_utilisation_pct']:.0f}",
            f"{rl['jct_mean_s']:.0f}",
            f"{rl['slowdown_max_ratio']:.3f}",
        )
        rb = r["sized_on_two_draws"]
        ev = rb["evaluated_on_third_draw"]
        t.add_row(
            f"{kind}, sized on 2 draws: {rb['pool']['shape']['rollout_gpus']} + {rb['pool']['shape']['trainer_gpus']} (draw {ev['seed']})",
            f"{rb['gpus_used']} ({ev['peak_gpus']})",
            f"{ev['saving_reserved_vs_dedicated_reserved_pct']:.0f}% less",
            f"{ev['saving_charged_vs_dedicated_reserved_pct']:.0f}% less",
            "-",
            "-",
            f"{ev['slowdown_max_ratio']:.3f}",
        )
    console.print(t)


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.real:
        return _real(ap, args)
    cfg = _config(ap, args)
    console = Console()
    run = run_simulated(cfg, progress=lambda items, desc: track(items, description=desc, console=console))
    results = run.results
    _print_placements(console, cfg, results["multiplex"])
    _print_routing(console, cfg, results["router"])
    _print_services(console, cfg, results["services"])
    console.print(results["targets"])
    if args.json:
        recorded = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        write_report(args.json, {"args": recorded, **run.config}, results)
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Simulated benchmark: N concurrent RLVR jobs on M GPUs, dedicated placement vs phase-sliced
multiplexing vs request-level service multiplexing, and request routers across rollout instances.

    python scripts/bench_multiplex.py [--jobs 8] [--gpus 32] [--iterations 8] [--json PATH]

The workload's distributions and the cost model are documented in infra/llm/simulate.py and
docs/llm_jobs.md. Phase-sliced multiplexing is evaluated at several slowdown bounds (the admission
rule's ``max_slowdown``); request-level multiplexing sizes the shared pool, static (held for the
whole run) and elastic (GPUs taken and handed back as the load changes), to the cheapest one that
keeps every job within ``--service-slowdown`` (the issue's target: 1.10).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from bench_report import write_report
from rich.console import Console
from rich.progress import track
from rich.table import Table

from infra.llm.router import EngineCost, load_router
from infra.llm.simulate import (
    Hardware,
    JobProfile,
    RouterWorkload,
    ServicePool,
    dedicated_placement,
    dedicated_service_jct,
    estimate_pace,
    mixed_workload,
    multiplexed_placement,
    simulate_routing,
    simulate_services,
    size_service_pool,
)

ROUTERS = ("round_robin", "least_loaded", "prefill_decode_aware")


def _hours(gpu_s: float) -> float:
    return gpu_s / 3600


def _evaluate_pool(
    jobs: list[JobProfile],
    hw: Hardware,
    pool: ServicePool,
    seed: int,
    arrivals: list[float],
    pace: dict[str, float] | None,
) -> dict[str, object]:
    ded = dedicated_service_jct(jobs, hw, seed)
    out = simulate_services(jobs, hw, pool, seed, arrivals=arrivals, pace=pace)
    slow = {n: out.jobs[n]["jct_s"] / ded[n].jobs[n]["jct_s"] for n in out.jobs}
    reserved = sum(p.gpus * ded[p.name].jobs[p.name]["jct_s"] for p in jobs)
    return {
        "seed": seed,
        "slowdown_max_ratio": max(slow.values()),
        "slowdown_per_job_ratio": slow,
        "saving_reserved_vs_dedicated_reserved_pct": 100 * (1 - out.reserved_gpu_s / reserved),
        "saving_charged_vs_dedicated_reserved_pct": 100 * (1 - out.busy_gpu_s / reserved),
        "peak_gpus": out.peak_gpus,
    }


def request_level(
    jobs: list[JobProfile],
    hw: Hardware,
    base: ServicePool,
    *,
    bound: float,
    seed: int,
    max_gpus: int,
    arrivals: list[float],
    pace: dict[str, float] | None,
) -> dict[str, object]:
    """Dedicated baseline and the cheapest shared service pool within ``bound`` on ``seed``, in the
    service engine; that pool re-run on ``seed + 1``; and a pool sized on seeds ``seed, seed + 1``
    evaluated on ``seed + 2`` (how much the size depends on the draws it is sized on)."""
    ded = dedicated_service_jct(jobs, hw, seed)
    ded_jct = {n: r.jobs[n]["jct_s"] for n, r in ded.items()}
    ded_reserved = sum(p.gpus * ded_jct[p.name] for p in jobs)
    ded_busy = sum(r.busy_gpu_s for r in ded.values())
    dedicated = {
        "gpus_used": sum(p.gpus for p in jobs),
        "user_gpu_hours_reserved": _hours(ded_reserved),
        "user_gpu_hours_charged": _hours(ded_busy),
        "gpu_utilisation_pct": 100 * ded_busy / ded_reserved,
        "jct_mean_s": float(np.mean(list(ded_jct.values()))),
        "jct_max_s": max(ded_jct.values()),
        "jct_per_job_s": ded_jct,
    }
    try:
        sized = size_service_pool(
            jobs, hw, base, max_slowdown=bound, seeds=[seed], max_gpus=max_gpus, arrivals=arrivals, pace=pace
        )
        robust = size_service_pool(
            jobs,
            hw,
            base,
            max_slowdown=bound,
            seeds=[seed, seed + 1],
            max_gpus=max_gpus,
            arrivals=arrivals,
            pace=pace,
        )
    except ValueError as e:  # no pool within the cluster meets the bound: a result, not a crash
        return {"dedicated": dedicated, "request_level": None, "error": str(e)}
    out = sized.result
    return {
        "dedicated": dedicated,
        "request_level": {
            "pool": dataclasses.asdict(sized.pool),
            "gpus_used": sized.pool.rollout_gpus + sized.pool.trainer_gpus,
            "peak_gpus": out.peak_gpus,
            "makespan_s": out.makespan_s,
            "user_gpu_hours_reserved": _hours(out.reserved_gpu_s),
            "user_gpu_hours_charged": _hours(out.busy_gpu_s),
            "saving_reserved_vs_dedicated_reserved_pct": 100 * (1 - out.reserved_gpu_s / ded_reserved),
            "saving_charged_vs_dedicated_reserved_pct": 100 * (1 - out.busy_gpu_s / ded_reserved),
            "saving_charged_vs_dedicated_charged_pct": 100 * (1 - out.busy_gpu_s / ded_busy),
            "swap_gpu_hours": _hours(sum(r["swap_gpu_s"] for r in out.jobs.values())),
            "gpu_utilisation_pct": 100 * out.busy_gpu_s / out.reserved_gpu_s,
            "jct_mean_s": float(np.mean([r["jct_s"] for r in out.jobs.values()])),
            "jct_max_s": max(r["jct_s"] for r in out.jobs.values()),
            "jct_per_job_s": {n: r["jct_s"] for n, r in out.jobs.items()},
            "slowdown_max_ratio": max(sized.slowdown.values()),
            "slowdown_per_job_ratio": sized.slowdown,
            "charged_gpu_hours_per_job": {n: _hours(r["charged_gpu_s"]) for n, r in out.jobs.items()},
            "pool_sizes_tried": sized.tried,
        },
        "same_pool_other_draws": _evaluate_pool(jobs, hw, sized.pool, seed + 1, arrivals, pace),
        "sized_on_two_draws": {
            "sizing_seeds": [seed, seed + 1],
            "pool": dataclasses.asdict(robust.pool),
            "gpus_used": robust.pool.rollout_gpus + robust.pool.trainer_gpus,
            "slowdown_max_ratio_on_sizing_seeds": max(robust.slowdown.values()),
            "pool_sizes_tried": robust.tried,
            "evaluated_on_third_draw": _evaluate_pool(jobs, hw, robust.pool, seed + 2, arrivals, pace),
        },
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=8, help="concurrent RLVR jobs (half math, half agent)")
    ap.add_argument("--gpus", type=int, default=32, help="GPUs in the cluster")
    ap.add_argument("--iterations", type=int, default=8, help="RLVR iterations per job")
    ap.add_argument("--slowdowns", default="1.10,1.25,1.5,3.0", help="admission slowdown bounds to evaluate")
    ap.add_argument("--seed", type=int, default=0, help="evaluation draws (the planner profiles on seed+1)")
    ap.add_argument(
        "--service-slowdown",
        type=float,
        default=1.10,
        help="slowdown bound the shared service pool is sized for",
    )
    ap.add_argument(
        "--home-nodes", type=int, default=2, help="nodes holding each job's state (request-level affinity)"
    )
    ap.add_argument(
        "--stagger-s",
        type=float,
        default=0.0,
        help="request-level runs only: job k arrives at k * this (default 0: all start together, as the other placements)",
    )
    ap.add_argument(
        "--max-resident", type=int, default=1, help="jobs' weights resident on one rollout GPU at once"
    )
    ap.add_argument(
        "--keep-alive-s",
        type=float,
        default=5.0,
        help="elastic pool: seconds a GPU stays idle before it is handed back to the cluster",
    )
    ap.add_argument(
        "--provision-s",
        type=float,
        default=2.0,
        help="elastic pool: seconds from taking a GPU to its first function",
    )
    ap.add_argument(
        "--priority",
        choices=("edf", "fifo"),
        default="edf",
        help="request-level queues: earliest deadline first from profiled paces (draws seed+10), or first-come first-served",
    )
    ap.add_argument("--router-instances", type=int, default=4)
    ap.add_argument("--router-requests", type=int, default=4000)
    ap.add_argument("--router-rate", type=float, default=40.0, help="requests per second (Poisson)")
    ap.add_argument("--json", type=Path, default=None, help="write machine/config/results here")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.gpus < 1 or args.iterations < 1:
        ap.error("--jobs, --gpus and --iterations must be >= 1")
    bounds = [float(x) for x in args.slowdowns.split(",")]
    if any(b < 1.0 for b in [*bounds, args.service_slowdown]):
        ap.error(f"--slowdowns {args.slowdowns!r}: every bound must be >= 1.0 (1.10 = at most 10% slower)")

    if min(args.stagger_s, args.keep_alive_s, args.provision_s) < 0:
        ap.error("--stagger-s, --keep-alive-s and --provision-s must be >= 0 seconds")
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
        m = multiplexed_placement(
            jobs,
            hw,
            dedicated,
            cluster_gpus=args.gpus,
            max_slowdown=bound,
            seed=args.seed,
            profile_seed=args.seed + 1,
        )
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

    base = ServicePool(1, jobs[0].gpus, home_nodes=args.home_nodes, max_resident=args.max_resident)
    bases = {
        "static": base,
        "elastic": dataclasses.replace(base, keep_alive_s=args.keep_alive_s, provision_s=args.provision_s),
    }
    arrivals = [k * args.stagger_s for k in range(len(jobs))]
    pace = estimate_pace(jobs, hw, args.seed + 10) if args.priority == "edf" else None
    services = {}
    for kind in track(bases, description="sizing shared service pools (request-level)", console=console):
        services[kind] = request_level(
            jobs,
            hw,
            bases[kind],
            bound=args.service_slowdown,
            seed=args.seed,
            max_gpus=args.gpus,
            arrivals=arrivals,
            pace=pace,
        )

    cost = EngineCost()
    wl = RouterWorkload(requests=args.router_requests, rate_per_s=args.router_rate)
    routing = {}
    for name in track(ROUTERS, description="routing", console=console):
        routing[name] = simulate_routing(load_router(name, cost), args.router_instances, wl, cost, args.seed)

    target = mux_results.get("max_slowdown_1.10")
    held_out = {
        kind: r["sized_on_two_draws"]["evaluated_on_third_draw"] if r["request_level"] else None
        for kind, r in services.items()
    }
    results = {
        "multiplex": {"dedicated": ded, **mux_results},
        "services": services,
        "pace_s_per_iteration": pace,
        "router": routing,
        "targets": {
            "gpu_hours_saving_pct_at_slowdown_1_10": target["gpu_hours_saving_pct"] if target else None,
            "gpu_hours_saving_target_met": bool(
                target and target["gpu_hours_saving_pct"] >= 40 and target["slowdown_max_ratio"] <= 1.10
            ),
            **{
                f"{kind}_pool_sized_on_2_draws_{k}_on_3rd": ev and ev[f"{k}"]
                for kind, ev in held_out.items()
                for k in (
                    "saving_reserved_vs_dedicated_reserved_pct",
                    "saving_charged_vs_dedicated_reserved_pct",
                    "slowdown_max_ratio",
                )
            },
            "request_level_target_met_on_3rd_draw": {
                kind: bool(
                    ev
                    and ev["saving_reserved_vs_dedicated_reserved_pct"] >= 40
                    and ev["slowdown_max_ratio"] <= args.service_slowdown
                )
                for kind, ev in held_out.items()
            },
            "router_ttft_p99_vs_round_robin_ratio": routing["prefill_decode_aware"]["ttft_p99_s"]
            / routing["round_robin"]["ttft_p99_s"],
            "router_beats_round_robin_p99": routing["prefill_decode_aware"]["ttft_p99_s"]
            < routing["round_robin"]["ttft_p99_s"],
        },
    }

    t = Table(title=f"{args.jobs} RLVR jobs on {args.gpus} GPUs (simulated)")
    for col in ("placement", "GPU-hours", "saving %", "GPUs", "util %", "mean JCT s", "max slowdown"):
        t.add_column(col)
    t.add_row(
        "dedicated",
        f"{ded['user_gpu_hours']:.1f}",
        "-",
        str(ded["gpus_used"]),
        f"{ded['gpu_utilisation_pct']:.0f}",
        f"{ded['jct_mean_s']:.0f}",
        "1.00",
    )
    for k, r in mux_results.items():
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
    t2 = Table(title=f"routing over {args.router_instances} rollout instances (simulated)")
    for col in ("router", "TTFT p50 s", "TTFT p99 s", "mean e2e s"):
        t2.add_column(col)
    for name, r in routing.items():
        t2.add_row(name, f"{r['ttft_p50_s']:.3f}", f"{r['ttft_p99_s']:.3f}", f"{r['e2e_mean_s']:.2f}")
    console.print(t2)

    t3 = Table(
        title=f"request-level service multiplexing, pools sized for slowdown <= {args.service_slowdown:.2f} (simulated)"
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
        t3.add_column(col)
    sd = services["static"]["dedicated"]
    t3.add_row(
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
            t3.add_row(f"{kind}: {r['error']}", *["-"] * 6)
            continue
        t3.add_row(
            f"{kind}: {rl['pool']['rollout_gpus']} rollout + {rl['pool']['trainer_gpus']} trainer (draw {args.seed})",
            f"{rl['gpus_used']} ({rl['peak_gpus']})",
            f"{rl['user_gpu_hours_reserved']:.1f} ({rl['saving_reserved_vs_dedicated_reserved_pct']:.0f}% less)",
            f"{rl['user_gpu_hours_charged']:.1f} ({rl['saving_charged_vs_dedicated_reserved_pct']:.0f}% less)",
            f"{rl['gpu_utilisation_pct']:.0f}",
            f"{rl['jct_mean_s']:.0f}",
            f"{rl['slowdown_max_ratio']:.3f}",
        )
        rb = r["sized_on_two_draws"]
        ev = rb["evaluated_on_third_draw"]
        t3.add_row(
            f"{kind}, sized on 2 draws: {rb['pool']['rollout_gpus']} + {rb['pool']['trainer_gpus']} (draw {ev['seed']})",
            f"{rb['gpus_used']} ({ev['peak_gpus']})",
            f"{ev['saving_reserved_vs_dedicated_reserved_pct']:.0f}% less",
            f"{ev['saving_charged_vs_dedicated_reserved_pct']:.0f}% less",
            "-",
            "-",
            f"{ev['slowdown_max_ratio']:.3f}",
        )
    console.print(t3)
    console.print(results["targets"])

    if args.json:
        config = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "jobs": [dataclasses.asdict(j) for j in jobs],
            "hardware": dataclasses.asdict(hw),
            "service_pools_base": {k: dataclasses.asdict(b) for k, b in bases.items()},
            "router_workload": dataclasses.asdict(wl),
            "engine_cost": dataclasses.asdict(cost),
            "note": "simulation: figures do not depend on this machine's speed",
        }
        write_report(args.json, config, results)
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Replay a GPU-cluster pod trace with several placement policies and seeds (FGD simulator protocol).

    python scripts/replay_trace.py \
        --pods ../shared/traces/alibaba-openb-2023/openb_pod_list_default.csv \
        --nodes ../shared/traces/alibaba-openb-2023/openb_node_list_gpu_node.csv \
        --policies random,bestfit,fgd,fgd-strand --seeds 42-51 --inflate 1.3 --json runs/replay.json

``--dynamic`` replays the trace's arrivals and departures with their times through the scheduler
itself (``Scheduler.submit`` / ``release``, queue and preemption included; ``infra.replay.dynamic``)
and prints allocation over time, queueing delay p50/p99 per priority class and failed pods.

The static protocol prints a table per policy (allocation % at 100% and 130% arrived, mean and std over seeds,
fragmentation %, failed pods, decision latency p50/p99) and, with ``--json``, writes the figures
plus a PNG of allocation % against arrived % beside the JSON. ``--expected`` compares the means
with a reference CSV of the FGD simulator (columns ``sc_policy,seed,0..130``).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np
from bench_report import output_path, write_report
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.common.files import atomic_path
from infra.replay.dynamic import read_timed_pods, replay_dynamic
from infra.replay.trace import VARIANTS, Pod, ReplayResult, arrival_sequence, make_variant, read_pods, replay
from infra.scheduler import node_scoring
from infra.scheduler.frag import TypicalPods
from infra.scheduler.resources import Cluster, ClusterState

REFERENCE_NAMES = {"random": "01-Random", "bestfit": "05-BestFit", "fgd": "06-FGD"}
"""Our policy names -> the FGD simulator's names in expected_alloc_default.csv."""


def parse_seeds(text: str) -> list[int]:
    """``"42-51"`` or ``"42,43,50"`` -> list of seeds."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            if hi < lo:
                raise ValueError
            return list(range(lo, hi + 1))
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds {text!r}: give a range like 42-51 or a list like 42,43,44"
        ) from None


def summarize(results: list[ReplayResult], seconds: list[float]) -> dict[str, float]:
    """Figures of one policy over its seeds."""
    alloc = np.array([r.alloc_curve for r in results])
    frag = np.array([r.frag_curve for r in results])
    lat = np.concatenate([r.latencies_ns for r in results]) / 1e6
    failed = np.array([r.failed for r in results], dtype=float)
    return {
        "alloc_pct_at_100_mean": float(alloc[:, 100].mean()),
        "alloc_pct_at_100_std": float(alloc[:, 100].std()),
        "alloc_pct_at_130_mean": float(alloc[:, 130].mean()),
        "alloc_pct_at_130_std": float(alloc[:, 130].std()),
        "frag_pct_at_100_mean": float(frag[:, 100].mean()),
        "frag_pct_at_130_mean": float(frag[:, 130].mean()),
        "failed_pods_mean": float(failed.mean()),
        "failed_pods_std": float(failed.std()),
        "decision_latency_p50_ms": float(np.percentile(lat, 50)),
        "decision_latency_p99_ms": float(np.percentile(lat, 99)),
        "replay_seconds_per_seed": float(np.mean(seconds)),
    }


def read_expected(path: Path) -> dict[str, tuple[float, float]]:
    """Reference means at 100% and 130% arrived, by simulator policy name."""
    rows: dict[str, list[tuple[float, float]]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            rows.setdefault(row["sc_policy"], []).append((float(row["100"]), float(row["130"])))
    return {k: tuple(np.mean(v, axis=0)) for k, v in rows.items()}


def plot(curves: dict[str, np.ndarray], path: Path, title: str) -> None:
    """Mean allocation % against arrived % per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    x = np.arange(curves[next(iter(curves))].size)
    ax.plot(x, np.minimum(x, 100), "k:", lw=1, label="ideal")
    for name, curve in curves.items():
        ax.plot(x, curve, lw=1.5, label=name)
    ax.set(xlabel="arrived GPU demand (% of capacity)", ylabel="allocated GPU (% of capacity)", title=title)
    ax.set_xlim(60, x[-1])
    ax.set_ylim(60, 100)
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:  # a reader never sees half a plot
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def run_dynamic(args: argparse.Namespace) -> None:
    """``--dynamic``: one replay per policy, seed and speed-up through the scheduler's queue."""
    console = Console(width=160)
    cluster = Cluster.from_csv(args.nodes)
    names = [p for p in args.policies.split(",") if p]
    results: dict[str, dict[str, float]] = {}
    table = Table(title=f"dynamic replay of {args.pods.name} on {args.nodes.name} (queue delay in trace seconds)")
    for col in ("policy", "seed", "speedup", "alloc mean/max %", "delay p50/p99 s per class 0..3", "failed",
                "never ran", "preempted", "submit p99 ms", "release p99 ms", "wall s"):
        table.add_column(col, justify="right")
    for speedup in args.speedup:
        pods = read_timed_pods(args.pods, speedup)
        for name in names:
            for seed in args.seeds:
                r = replay_dynamic(cluster, pods, policy=name, seed=seed, timeout_s=args.timeout).summary()
                results[f"{name}/seed{seed}/speedup{speedup:g}"] = r
                delays = " | ".join(f"{r[f'class{c}_delay_p50_s']:.0f}/{r[f'class{c}_delay_p99_s']:.0f}"
                                    for c in range(4) if f"class{c}_placed" in r)
                table.add_row(name, str(seed), f"{speedup:g}", f"{r['alloc_pct_mean']:.1f}/{r['alloc_pct_max']:.1f}",
                              delays, f"{r['invalid'] + r['timed_out']}", f"{r['never_ran']}", f"{r['preemptions']}",
                              f"{r['submit_p99_ms']:.2f}", f"{r['release_p99_ms']:.2f}", f"{r['wall_s']:.1f}")
    console.print(table)
    if args.json:
        config = {"pods": str(args.pods), "nodes": str(args.nodes), "policies": names, "seeds": args.seeds,
                  "speedups": args.speedup, "timeout_s": args.timeout, "mode": "dynamic"}
        write_report(args.json, config, results)
        console.print(f"wrote {args.json}")


MAX_INFLATE = 10.0
"""Largest ``--inflate``: the curves stop at 130 % arrived, and each unit of inflation is another cluster's worth of pods."""


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and replay; returns the exit status (2, with a one-line message, on a bad input file)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", required=True, type=Path, help="pod list CSV (openb columns)")
    ap.add_argument(
        "--nodes", required=True, type=Path, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)"
    )
    ap.add_argument(
        "--policies", default="random,bestfit,fgd,fgd-strand", help=f"comma list of {node_scoring.names()}"
    )
    ap.add_argument("--seeds", default="42-51", type=parse_seeds, help="a range 42-51 or a list 42,43")
    ap.add_argument("--inflate", default=1.3, type=float, help="append pod copies up to this x GPU capacity")
    ap.add_argument(
        "--variant",
        help=f"replay a variant of the pod list instead: KIND:FRACTION with KIND in {VARIANTS}, e.g. gpushare:0.8",
    )
    ap.add_argument("--variant-seed", type=int, default=0, help="seed of the variant's random changes")
    ap.add_argument(
        "--latency-repeats",
        type=int,
        default=1,
        help="time each decision N times and keep the fastest (filters waits for a core on a busy machine)",
    )
    ap.add_argument("--json", type=output_path, help="write figures here (and a PNG plot beside it)")
    ap.add_argument("--expected", type=Path, help="reference CSV of the FGD simulator to compare with")
    ap.add_argument("--dynamic", action="store_true",
                    help="replay arrivals and departures with the trace's times through Scheduler.submit/release")
    ap.add_argument("--speedup", type=float, nargs="+", default=[1.0],
                    help="--dynamic: arrivals this many times faster (runtimes kept), one replay each")
    ap.add_argument("--timeout", type=float, default=None, help="--dynamic: pods waiting longer fail (seconds)")
    args = ap.parse_args(argv)
    if not 1.0 <= args.inflate <= MAX_INFLATE:  # also refuses NaN, which made the copy loop endless
        ap.error(f"--inflate {args.inflate}: must be in [1, {MAX_INFLATE:g}] (1.3 replays 130% of the GPU capacity)")
    if not all(0 < x < float("inf") for x in args.speedup) or not (args.timeout is None or 0 < args.timeout < float("inf")):
        ap.error(f"--speedup {args.speedup} and --timeout {args.timeout} must be finite numbers > 0")
    if args.latency_repeats < 1:
        ap.error(f"--latency-repeats {args.latency_repeats}: must be >= 1")
    try:
        if args.dynamic:
            run_dynamic(args)
        else:
            run_static(ap, args)
    except (OSError, ValueError) as exc:  # input files: RowError names the file and line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def run_static(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The FGD simulator's protocol: every policy and seed on the inflated arrival sequence."""
    names = [p for p in args.policies.split(",") if p]
    for name in names:
        node_scoring.load(name)  # fail early with the list of valid names
    console = Console(width=160)
    state = ClusterState(Cluster.from_csv(args.nodes))
    pods = _workload(ap, args, state)
    typical = TypicalPods.from_shapes([p.shape for p in pods])
    capacity = state.total_gpu_milli()
    sequences = {s: arrival_sequence(pods, capacity, args.inflate, s) for s in args.seeds}
    summary, curves = _replay_policies(console, args, names, state, sequences, typical)
    workload = args.pods.name + (f" ({args.variant})" if args.variant else "")
    _print_summary(console, args, summary, workload)
    if args.json:
        png = args.json.with_suffix(".png")
        plot(curves, png, f"{workload} ({len(args.seeds)} seeds)")
        config = {
            "pods": str(args.pods),
            "nodes": str(args.nodes),
            "policies": names,
            "seeds": args.seeds,
            "inflate": args.inflate,
            "latency_repeats": args.latency_repeats,
            "variant": args.variant,
            "variant_seed": args.variant_seed if args.variant else None,
            "num_nodes": state.num_nodes,
            "gpu_capacity_milli": capacity,
            "typical_pod_shapes": len(typical.shapes),
            "plot": str(png),
        }
        for name, curve in curves.items():
            summary[name]["alloc_pct_curve_by_arrived_pct"] = [
                None if np.isnan(v) else round(float(v), 3) for v in curve
            ]
        write_report(args.json, config, summary)
        console.print(f"wrote {args.json} and {png}")


def _workload(ap: argparse.ArgumentParser, args: argparse.Namespace, state: ClusterState) -> list[Pod]:
    """The trace's pods, or (``--variant KIND:FRACTION``) its variant on the cluster's GPU models."""
    pods = read_pods(args.pods)
    if not args.variant:
        return pods
    kind, _, frac = args.variant.partition(":")
    try:
        fraction = float(frac)
    except ValueError:
        ap.error(f"--variant {args.variant!r}: give KIND:FRACTION, e.g. multigpu:0.3")
    models = [g.model for n in state.cluster.nodes for g in n.gpus]
    return make_variant(pods, kind, fraction, models, args.variant_seed)


def _replay_policies(
    console: Console, args: argparse.Namespace, names: list[str], state: ClusterState,
    sequences: dict[int, list[Pod]], typical: TypicalPods,
) -> tuple[dict[str, dict[str, float]], dict[str, np.ndarray]]:
    """Replay each policy on each seed's arrival sequence: its summary over the seeds and its mean allocation curve."""
    summary: dict[str, dict[str, float]] = {}
    curves: dict[str, np.ndarray] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("replay", total=len(names) * len(args.seeds))
        for name in names:
            results, seconds = [], []
            for s in args.seeds:
                progress.update(task, description=f"{name} seed {s}")
                t0 = time.perf_counter()
                policy = node_scoring.load(name, typical=typical)
                results.append(
                    replay(state, sequences[s], policy, typical, s, timing_repeats=args.latency_repeats)
                )
                seconds.append(time.perf_counter() - t0)
                progress.advance(task)
            summary[name] = summarize(results, seconds)
            curves[name] = np.nanmean([r.alloc_curve for r in results], axis=0)
    return summary, curves


def _print_summary(console: Console, args: argparse.Namespace, summary: dict[str, dict[str, float]],
                   workload: str) -> None:
    """The table of every policy's figures, each beside its published reference (``--expected``), which is also
    written into its summary."""
    expected = read_expected(args.expected) if args.expected else {}
    table = Table(
        title=f"{workload} on {args.nodes.name}, seeds {args.seeds[0]}..{args.seeds[-1]}, inflate {args.inflate}"
    )
    for col in (
        "policy",
        "alloc@100 %",
        "alloc@130 %",
        "frag@100 %",
        "failed",
        "p50 ms",
        "p99 ms",
        "s/seed",
    ):
        table.add_column(col, justify="right")
    for name, r in summary.items():
        ref = expected.get(REFERENCE_NAMES.get(name, ""))
        if ref:
            r["reference_alloc_pct_at_100"], r["reference_alloc_pct_at_130"] = ref
        note = f" (ref {ref[0]:.2f})" if ref else ""
        table.add_row(
            name,
            f"{r['alloc_pct_at_100_mean']:.2f} ± {r['alloc_pct_at_100_std']:.2f}{note}",
            f"{r['alloc_pct_at_130_mean']:.2f} ± {r['alloc_pct_at_130_std']:.2f}",
            f"{r['frag_pct_at_100_mean']:.2f}",
            f"{r['failed_pods_mean']:.0f}",
            f"{r['decision_latency_p50_ms']:.3f}",
            f"{r['decision_latency_p99_ms']:.3f}",
            f"{r['replay_seconds_per_seed']:.1f}",
        )
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())

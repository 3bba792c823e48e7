"""Decision latency on the path a job takes (``Scheduler.submit`` / ``release``) and the dynamic replay.

    python scripts/bench_scheduler.py --json docs/figures/bench/bench_scheduler_quiet.json

* ``fill``: the default trace's pods, inflated to 1.3x the GPU capacity as in the FGD protocol
  (seed 42), submitted one by one to a ``Scheduler`` over all 1,523 nodes until the end; every
  ``submit`` timed once (wall clock, and the thread's CPU time, which excludes waits for a core
  on a shared machine). Pods that do not fit wait in the queue.
* ``release``: the same fill stopped when 1,000 gangs wait; then random placed gangs are released
  one by one (each timed) while a new pod arrives after each, so that about 1,000 always wait.
* ``dynamic``: the trace replayed with its arrival and departure times through ``submit`` /
  ``release`` (``infra.replay.dynamic``), at the trace's speed and with arrivals compressed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np
from bench_report import output_path, write_report

from infra.replay.dynamic import read_timed_pods, replay_dynamic
from infra.replay.trace import arrival_sequence, read_pods
from infra.scheduler import Scheduler
from infra.scheduler.frag import TypicalPods
from infra.scheduler.requests import RequestError
from infra.scheduler.resources import Cluster

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-openb-2023"


def _percentiles(ns: list[int]) -> dict[str, float]:
    ms = np.array(ns) / 1e6
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "max": float(ms.max())}


def _timed(fn, wall: list[int], cpu: list[int]):
    t, c = time.perf_counter_ns(), time.thread_time_ns()
    try:
        return fn()
    finally:
        wall.append(time.perf_counter_ns() - t)
        cpu.append(time.thread_time_ns() - c)


def _setup(args):
    from infra.replay.dynamic import TimedPod

    pods = read_pods(args.pods)
    cluster = Cluster.from_csv(args.nodes)
    typical = TypicalPods.from_shapes([p.shape for p in pods])
    sched = Scheduler(cluster, policy=args.policy, typical=typical, seed=args.seed)
    seq = arrival_sequence(pods, sched.state.total_gpu_milli(), args.inflate, args.seed)
    reqs = [dataclasses.replace(TimedPod(p, 0.0, 1.0, 0).request(None), name=f"{p.name}#{i}") for i, p in enumerate(seq)]
    return sched, reqs


def bench_fill(args) -> dict:
    """Every submit of the inflated fill, timed once."""
    sched, reqs = _setup(args)
    wall, cpu = [], []
    placed = 0
    for i, req in enumerate(reqs):
        try:
            placed += _timed(lambda req=req, i=i: sched.submit(req, now=float(i)), wall, cpu) is not None
        except RequestError:
            continue
    return {
        "submits": len(wall), "placed_at_once": placed, "waiting_at_end": len(sched.queue),
        "alloc_pct_at_end": 100.0 * sched.state.used_gpu_milli() / sched.state.total_gpu_milli(),
        "submit_latency_p50_ms": _percentiles(wall)["p50"], "submit_latency_p99_ms": _percentiles(wall)["p99"],
        "submit_latency_max_ms": _percentiles(wall)["max"],
        "submit_cpu_p50_ms": _percentiles(cpu)["p50"], "submit_cpu_p99_ms": _percentiles(cpu)["p99"],
    }


def bench_release(args) -> dict:
    """Releases while about ``args.waiting`` gangs wait in the queue."""
    sched, reqs = _setup(args)
    rng = np.random.default_rng(args.seed)
    it = iter(enumerate(reqs))
    for i, req in it:
        with contextlib.suppress(RequestError):
            sched.submit(req, now=float(i))
        if len(sched.queue) >= args.waiting:
            break
    wall, cpu, queue = [], [], []
    for k, (_, req) in zip(range(args.releases), it):
        placed = sorted(sched.placements)
        victim = placed[int(rng.integers(len(placed)))]
        queue.append(len(sched.queue))
        _timed(lambda victim=victim, k=k: sched.release(victim, now=1e6 + k), wall, cpu)
        with contextlib.suppress(RequestError):
            sched.submit(req, now=1e6 + k + 0.5)
    return {
        "releases": len(wall), "waiting_mean": float(np.mean(queue)), "waiting_min": int(np.min(queue)),
        "release_latency_p50_ms": _percentiles(wall)["p50"], "release_latency_p99_ms": _percentiles(wall)["p99"],
        "release_latency_max_ms": _percentiles(wall)["max"],
        "release_cpu_p50_ms": _percentiles(cpu)["p50"], "release_cpu_p99_ms": _percentiles(cpu)["p99"],
    }


def bench_dynamic(args) -> dict:
    """The dynamic replay at each speed-up."""
    cluster = Cluster.from_csv(args.nodes)
    out = {}
    for speedup in args.speedups:
        pods = read_timed_pods(args.pods, speedup)
        out[f"speedup_{speedup:g}"] = replay_dynamic(cluster, pods, policy=args.policy, seed=args.seed).summary()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=Path, default=TRACE / "openb_pod_list_default.csv")
    parser.add_argument("--nodes", type=Path, default=TRACE / "openb_node_list_all_node.csv")
    parser.add_argument("--policy", default="fgd-strand")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--inflate", type=float, default=1.3)
    parser.add_argument("--waiting", type=int, default=1000, help="gangs waiting during the release benchmark")
    parser.add_argument("--releases", type=int, default=500)
    parser.add_argument("--speedups", type=float, nargs="+", default=[1.0, 50000.0])
    parser.add_argument("--only", choices=["fill", "release", "dynamic"], nargs="+", default=["fill", "release", "dynamic"])
    parser.add_argument("--json", type=output_path, default=None)
    args = parser.parse_args(argv)
    if not args.pods.is_file() or not args.nodes.is_file():
        parser.error(f"trace files not found ({args.pods}, {args.nodes}); pass --pods and --nodes")
    results = {}
    for name in args.only:
        start = time.perf_counter()
        results[name] = {"fill": bench_fill, "release": bench_release, "dynamic": bench_dynamic}[name](args)
        print(f"{name} ({time.perf_counter() - start:.1f} s, load {os.getloadavg()[0]:.2f}):", flush=True)
        for key, value in results[name].items():
            print(f"  {key}: {value}")
    results["load_average_at_end"] = list(os.getloadavg())
    if args.json:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"}
        write_report(args.json, config, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Seeded synthetic traces in the openb format, for tests and synthetic workloads.

    python -m infra.replay.synthetic --out runs/synthetic --seed 0 --nodes 400 --pods 2000

Writes ``openb_node_list_gpu_node.csv`` (``sn,cpu_milli,memory_mib,gpu,model``) and
``openb_pod_list_default.csv`` (``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
pod_phase,creation_time,deletion_time,scheduled_time``), the files and columns of the Alibaba openb
trace, so every reader of that trace (``read_pods``, ``read_timed_pods``, ``Cluster.from_csv``,
``scripts/replay_trace.py --pods/--nodes``) takes them unchanged. The mix follows the openb trace's
published shape in round numbers: node types of seven GPU models (G2 the most GPUs, then T4), about
13 % CPU-only pods, 38 % GPU-sharing pods (a fraction of one GPU), 1 % multi-GPU pods (2, 4 or 8),
a few dozen request shapes, QoS classes BE/LS/Burstable/Guaranteed, arrivals over
150 days with heavy-tailed runtimes. Unlike the default openb pod list, ``spec_share`` of the GPU
pods carry a ``gpu_spec`` (one model or several, ``|``-separated). No row of the real trace is used.
"""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

import numpy as np

from infra.common.files import write_atomic

NODE_TYPES: tuple[tuple[int, int, int, str, float], ...] = (
    (96000, 393216, 8, "G2", 0.45),
    (104000, 524288, 2, "T4", 0.32),
    (16000, 122880, 2, "P100", 0.09),
    (128000, 786432, 8, "G3", 0.03),
    (32000, 131072, 4, "V100M16", 0.025),
    (96000, 786432, 8, "V100M32", 0.02),
    (8000, 32768, 1, "V100M16", 0.015),
    (96000, 393216, 4, "T4", 0.015),
    (48000, 376832, 4, "V100M32", 0.01),
    (128000, 1048576, 1, "A10", 0.005),
)
"""``(cpu_milli, memory_mib, gpus, model, share of nodes)``: the node types of the synthetic cluster."""

SHARING_MILLI = (810, 470, 320, 650, 230, 460, 590, 160, 550, 220, 370)
"""GPU fractions (milli) of GPU-sharing pods."""
REQUESTS: dict[str, tuple[tuple[int, int, float], ...]] = {
    "cpu": ((12500, 57344, 0.35), (32000, 49152, 0.27), (8000, 30517, 0.16), (15400, 51200, 0.12),
            (16500, 51200, 0.1)),
    "sharing": ((3152, 5600, 0.4), (11908, 47104, 0.22), (8000, 30517, 0.17), (4000, 22888, 0.07),
                (4000, 15258, 0.07), (4152, 10600, 0.07)),
    "whole": ((11300, 49152, 0.3), (11400, 48128, 0.2), (3152, 5600, 0.17), (18708, 64512, 0.1),
              (9810, 41560, 0.08), (12000, 24576, 0.06), (32000, 131072, 0.05), (6000, 12288, 0.04)),
}
"""``(cpu_milli, memory_mib, weight)`` requests of CPU-only, GPU-sharing and one-whole-GPU pods: as in
openb, a few shapes make most pods (CPU and memory go together)."""
SPECS = ("T4", "P100", "G2", "G3", "V100M16|V100M32", "P100|T4", "G2|T4|V100M16|V100M32")
"""``gpu_spec`` values of constrained GPU pods: single models and openb-like model sets."""
QOS = (("LS", 0.57), ("BE", 0.417), ("Burstable", 0.012), ("Guaranteed", 0.001))
PHASES = (("Running", 0.64), ("Failed", 0.23), ("Succeeded", 0.02), ("Pending", 0.11))
SPAN_S = 12_900_000
"""Arrivals spread over this many seconds (the openb trace's 150 days)."""


def _pick(rng: np.random.Generator, table: tuple[tuple[str, float], ...]) -> str:
    p = np.array([w for _, w in table])
    return table[int(rng.choice(len(table), p=p / p.sum()))][0]


def node_rows(num_nodes: int, rng: np.random.Generator) -> list[dict[str, object]]:
    """``num_nodes`` node rows, each type's count in proportion to its share (at least one each)."""
    shares = np.array([t[4] for t in NODE_TYPES])
    counts = np.maximum(1, np.round(shares / shares.sum() * num_nodes)).astype(int)
    counts[0] += num_nodes - counts.sum()  # rounding: the most common type takes up the difference
    types = [t for t, c in zip(NODE_TYPES, counts) for _ in range(c)]
    rng.shuffle(types)
    return [{"sn": f"synth-node-{i:04d}", "cpu_milli": cpu, "memory_mib": mem, "gpu": gpus, "model": model}
            for i, (cpu, mem, gpus, model, _) in enumerate(types)]


def pod_row(i: int, arrival: int, spec_share: float, rng: np.random.Generator) -> dict[str, object]:
    """One pod row: its request (CPU-only, sharing, whole or multi-GPU), spec, QoS and times."""
    kind = rng.random()
    num_gpu, milli = (0, 0) if kind < 0.13 else (1, int(rng.choice(SHARING_MILLI))) if kind < 0.51 else (1, 1000)
    if kind > 0.99:
        num_gpu = int(rng.choice((2, 4, 8), p=(0.2, 0.2, 0.6)))
    table = REQUESTS["cpu" if not num_gpu else "sharing" if milli < 1000 else "whole"]
    weights = np.array([w for *_, w in table])
    cpu, mem, _ = table[int(rng.choice(len(table), p=weights / weights.sum()))]
    if num_gpu > 1:  # openb's multi-GPU pods ask for 8-15 cores and 32-40 GiB per GPU
        cpu, mem = num_gpu * int(rng.choice((8000, 11000, 15000))), num_gpu * int(rng.choice((32768, 40960)))
    spec = str(rng.choice(SPECS)) if num_gpu and rng.random() < spec_share else ""
    phase = _pick(rng, PHASES)
    runtime = max(1, int(rng.lognormal(np.log(540), 1.95)))
    start = arrival + int(rng.integers(0, 3))
    return {
        "name": f"synth-pod-{i:04d}", "cpu_milli": cpu, "memory_mib": mem,
        "num_gpu": num_gpu, "gpu_milli": milli, "gpu_spec": spec, "qos": _pick(rng, QOS), "pod_phase": phase,
        "creation_time": arrival, "deletion_time": (arrival if phase == "Pending" else start) + runtime,
        "scheduled_time": "" if phase == "Pending" else start,
    }


def _csv(rows: list[dict[str, object]]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


def write_synthetic_trace(
    out: str | Path, seed: int = 0, num_nodes: int = 400, num_pods: int = 2000, spec_share: float = 0.05
) -> tuple[Path, Path]:
    """Write a synthetic openb node list and pod list into ``out``; the same arguments give the same bytes.

    Args:
        out: output directory (created).
        seed: seeds every draw.
        num_nodes: GPU nodes (>= the number of node types, each type appears).
        num_pods: pods, named ``synth-pod-0000`` ... in arrival order.
        spec_share: share of GPU pods with a ``gpu_spec``, in [0, 1].

    Returns:
        ``(node list, pod list)`` paths.
    """
    if num_nodes < len(NODE_TYPES) or num_pods < 1:
        raise ValueError(f"num_nodes={num_nodes}, num_pods={num_pods}: need >= {len(NODE_TYPES)} nodes and >= 1 pod.")
    if not 0.0 <= spec_share <= 1.0:
        raise ValueError(f"spec_share={spec_share} must be in [0, 1].")
    rng = np.random.default_rng(seed)
    nodes = node_rows(num_nodes, rng)
    arrivals = np.sort(rng.integers(0, SPAN_S, num_pods))
    pods = [pod_row(i, int(t), spec_share, rng) for i, t in enumerate(arrivals)]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    node_path, pod_path = out / "openb_node_list_gpu_node.csv", out / "openb_pod_list_default.csv"
    write_atomic(node_path, _csv(nodes))
    write_atomic(pod_path, _csv(pods))
    return node_path, pod_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=400, help="GPU nodes")
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--spec-share", type=float, default=0.05, help="share of GPU pods with a gpu_spec")
    args = ap.parse_args()
    for path in write_synthetic_trace(args.out, args.seed, args.nodes, args.pods, args.spec_share):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Write GPU-model-constrained workloads from an openb pod list, seeded, the way the FGD authors made theirs.

    python scripts/make_gpuspec_workloads.py --mix cluster --seed 0 --out runs/workloads
    python scripts/make_gpuspec_workloads.py --mix openb --seed 0 --out runs/workloads

The FGD authors (Weng et al., ATC'23; ``openb_pod_list_gpuspec{05,10,20,25,33}.csv`` in
alibaba/clusterdata) started from the default pod list and, for each share independently (the
constrained pods of one share are not a subset of the next one's), drew that share of the GPU pods
and gave each a ``gpu_spec`` (allowed GPU models, ``|``-separated); every other column is kept.
This script does the same for each ``--fractions`` entry, with the model drawn one of two ways:

* ``cluster``: one model, drawn in proportion to the cluster's GPUs of each model
  (``infra.replay.trace.make_variant``'s ``gpuspec`` kind, the same as ``replay_trace.py --variant gpuspec:F``);
* ``openb``: the constraint mix of the authors' files, which follows their production cluster,
  not the cluster's GPU counts: a pod's spec is drawn from the specs that GPU pods of its kind
  (GPU-sharing, one whole GPU, several GPUs) carry in ``openb_pod_list_gpuspec33.csv``
  (``OPENB_SPEC_COUNTS``); two thirds of those ask for T4 or P100, 14 % and 4 % of the GPUs.
  Models the node list lacks are dropped from a spec (a spec left empty is redrawn).

Output: ``OUT/openb_pod_list_gpuspec{PP}_{mix}_seed{S}.csv`` (the openb columns of the input),
read by ``scripts/replay_trace.py --pods``. They are derived data: regenerate, do not commit.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_report import output_path

from infra.common.files import write_atomic
from infra.replay.trace import Pod, make_variant, read_pods
from infra.scheduler.resources import MILLI, Cluster

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-openb-2023"
FRACTIONS = (0.05, 0.10, 0.20, 0.25, 0.33)
"""The shares of GPU pods the FGD authors constrained."""

OPENB_SPEC_COUNTS: dict[str, dict[str, int]] = {
    "sharing": {"T4": 593, "P100": 278, "G2|P100|T4|V100M16|V100M32": 13},
    "whole": {
        "T4": 698, "G2": 321, "V100M16|V100M32": 156, "P100|V100M16|V100M32": 102, "G3": 80,
        "P100|T4|V100M16|V100M32": 33, "G2|P100|T4|V100M16|V100M32": 26, "A10|G2|T4|V100M16|V100M32": 24,
        "V100M32": 18, "A10|T4": 6, "P100|V100M16": 4, "A10|G2|P100|T4|V100M16|V100M32": 3, "V100M16": 3,
        "P100": 1, "T4|V100M16|V100M32": 1,
    },
    "multi": {"G2": 10, "V100M16|V100M32": 7, "G3": 6, "T4|V100M16|V100M32": 2, "V100M32": 2,
              "P100|V100M16|V100M32": 1},
}
"""Constrained GPU pods per ``gpu_spec`` in the FGD authors' ``openb_pod_list_gpuspec33.csv``, by
pod kind: ``sharing`` (one GPU, < 1000 milli), ``whole`` (one whole GPU), ``multi`` (2-8 GPUs)."""


def pod_kind(num_gpu: int, gpu_milli: int) -> str:
    """``sharing``, ``whole`` or ``multi`` (the keys of ``OPENB_SPEC_COUNTS``); GPU pods only."""
    if num_gpu > 1:
        return "multi"
    return "sharing" if gpu_milli < MILLI else "whole"


def openb_spec_drawer(models: set[str], rng: np.random.Generator) -> Callable[[int, int], str]:
    """A function ``(num_gpu, gpu_milli) -> gpu_spec`` drawing from ``OPENB_SPEC_COUNTS``, restricted
    to ``models`` (the cluster's); raises ValueError if a kind has no spec left."""
    tables = {}
    for kind, counts in OPENB_SPEC_COUNTS.items():
        specs = {"|".join(m for m in spec.split("|") if m in models): n for spec, n in counts.items()}
        merged: dict[str, int] = {}
        for spec, n in specs.items():
            if spec:
                merged[spec] = merged.get(spec, 0) + n
        if not merged:
            raise ValueError(f"no GPU model of the openb {kind} specs is in the cluster ({sorted(models)}).")
        weights = np.array(list(merged.values()), dtype=float)
        tables[kind] = (list(merged), weights / weights.sum())

    def draw(num_gpu: int, gpu_milli: int) -> str:
        specs, p = tables[pod_kind(num_gpu, gpu_milli)]
        return specs[int(rng.choice(len(specs), p=p))]

    return draw


def constrain(
    rows: list[dict[str, str]], pods: list[Pod], fraction: float, mix: str, gpu_models: list[str], seed: int
) -> None:
    """Set ``gpu_spec`` of ``round(fraction * GPU pods)`` random GPU pods of ``rows`` (in place).

    Args:
        rows: the pod list's rows (openb columns); existing specs are replaced or cleared.
        pods: the same pods as ``read_pods`` returns them (the ``cluster`` mix draws on these).
        fraction: share of GPU pods to constrain, in [0, 1].
        mix: ``cluster`` or ``openb`` (see the module docstring).
        gpu_models: the cluster's GPU models, one entry per GPU.
        seed: seeds the choice of pods and of their models.
    """
    for row in rows:
        row["gpu_spec"] = ""
    if mix == "cluster":  # the input's own specs are cleared first, as for the openb mix
        pods = [dataclasses.replace(p, models=frozenset()) for p in pods]
        pods = {p.name: p for p in make_variant(pods, "gpuspec", fraction, gpu_models, seed)}
        for row in rows:
            row["gpu_spec"] = "|".join(sorted(pods[row["name"]].models))
        return
    rng = np.random.default_rng(seed)
    gpu_rows = [r for r in rows if int(r["num_gpu"]) > 0]
    draw = openb_spec_drawer(set(gpu_models), rng)
    for i in rng.choice(len(gpu_rows), size=round(fraction * len(gpu_rows)), replace=False):
        row = gpu_rows[int(i)]
        row["gpu_spec"] = draw(int(row["num_gpu"]), int(row["gpu_milli"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=Path, default=TRACE / "openb_pod_list_default.csv", help="openb pod list")
    ap.add_argument("--nodes", type=Path, default=TRACE / "openb_node_list_gpu_node.csv", help="openb node list")
    ap.add_argument("--mix", choices=("cluster", "openb"), default="cluster", help="how models are drawn")
    ap.add_argument("--fractions", default=",".join(f"{f:g}" for f in FRACTIONS), help="comma list in [0, 1]")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws (each fraction adds its percent)")
    ap.add_argument("--out", type=output_path, default=Path("runs/workloads"), help="output directory")
    args = ap.parse_args()
    for path in (args.pods, args.nodes):
        if not path.is_file():
            ap.error(f"{path} not found: pass --pods/--nodes with existing openb CSV files.")
    try:
        fractions = [float(f) for f in args.fractions.split(",")]
    except ValueError:
        ap.error(f"--fractions {args.fractions!r}: give numbers in [0, 1] separated by commas, e.g. 0.05,0.33")
    with args.pods.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or ())
        original = list(reader)
    pods = read_pods(args.pods)
    if "gpu_spec" not in fields:
        fields.insert(fields.index("gpu_milli") + 1, "gpu_spec")
    gpu_models = [g.model for n in Cluster.from_csv(args.nodes).nodes for g in n.gpus]
    args.out.mkdir(parents=True, exist_ok=True)
    for fraction in fractions:
        pct = round(100 * fraction)
        rows = [dict(r) for r in original]
        constrain(rows, pods, fraction, args.mix, gpu_models, args.seed + pct)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        path = args.out / f"openb_pod_list_gpuspec{pct:02d}_{args.mix}_seed{args.seed}.csv"
        write_atomic(path, buf.getvalue().encode())
        print(f"wrote {path}: {sum(1 for r in rows if r['gpu_spec'])} constrained GPU pods")


if __name__ == "__main__":
    main()

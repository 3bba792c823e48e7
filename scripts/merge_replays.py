"""Merge ``replay_trace.py --json`` reports of one workload run on disjoint seed ranges into one table.

    python scripts/merge_replays.py --out docs/figures/scheduler_gpuspec/summary.json \
        gpuspec33=runs/a_s42-44.json:fgd-strand=old,runs/b_s42-44.json,runs/b_s45-51.json \
        default=docs/figures/scheduler_variants/default.json

Each argument is ``WORKLOAD=REPORT[,REPORT...]``; a policy's figures in the reports of one workload
are pooled over their seeds (the reports' seed lists must not overlap for a policy). A report may
end in ``:POLICY=NAME`` to list that policy under another name (the same policy measured with
older code). Writes, per workload and policy, the mean and the (population) std of the allocation
% at 100 % arrived over all seeds and the seeds used, and prints the table as Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench_report import output_path, write_report


def pool(parts: list[tuple[float, float, int]]) -> tuple[float, float]:
    """Mean and population std of the union of groups given as ``(mean, std, n)``."""
    n = sum(k for _, _, k in parts)
    mean = sum(m * k for m, _, k in parts) / n
    second = sum((s * s + m * m) * k for m, s, k in parts) / n
    return mean, math.sqrt(max(0.0, second - mean * mean))


def merge(reports: list[str]) -> dict[str, dict[str, object]]:
    """``{policy: {"alloc_pct_at_100_mean", "alloc_pct_at_100_std", "seeds"}}`` over ``reports``."""
    parts: dict[str, list[tuple[float, float, int]]] = {}
    seeds: dict[str, list[int]] = {}
    for spec in reports:
        path, _, rename = spec.partition(":")
        old, _, new = rename.partition("=")
        report = json.loads(Path(path).read_text())
        for policy, r in report["results"].items():
            name = new if rename and policy == old else policy
            run = report["config"]["seeds"]
            if set(run) & set(seeds.get(name, [])):
                raise ValueError(f"{path}: seeds {sorted(set(run) & set(seeds[name]))} of {name} appear twice.")
            seeds.setdefault(name, []).extend(run)
            parts.setdefault(name, []).append((r["alloc_pct_at_100_mean"], r["alloc_pct_at_100_std"], len(run)))
    out = {}
    for name, p in parts.items():
        mean, std = pool(p)
        out[name] = {"alloc_pct_at_100_mean": mean, "alloc_pct_at_100_std": std, "seeds": sorted(seeds[name])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="+", help="WORKLOAD=[LABEL:]REPORT[,[LABEL:]REPORT...]")
    ap.add_argument("--out", type=output_path, required=True, help="summary JSON to write")
    ap.add_argument("--baseline", default="fgd", help="policy the others are compared with (mean and worst gap)")
    args = ap.parse_args()
    table: dict[str, dict[str, object]] = {}
    for item in args.workloads:
        workload, sep, reports = item.partition("=")
        if not sep or not reports:
            ap.error(f"{item!r}: give WORKLOAD=REPORT[,REPORT...]")
        table[workload] = merge(reports.split(","))
    policies = sorted({p for t in table.values() for p in t})
    print("| workload | " + " | ".join(policies) + " |")
    print("|---" * (len(policies) + 1) + "|")
    for workload, t in table.items():
        cells = [
            f"{t[p]['alloc_pct_at_100_mean']:.2f} ± {t[p]['alloc_pct_at_100_std']:.2f} ({len(t[p]['seeds'])})"
            if p in t else "–"
            for p in policies
        ]
        print(f"| {workload} | " + " | ".join(cells) + " |")
    gaps = {p: [t[p]["alloc_pct_at_100_mean"] - t[args.baseline]["alloc_pct_at_100_mean"]
                for t in table.values() if p in t and args.baseline in t] for p in policies if p != args.baseline}
    for p, g in gaps.items():
        if g:
            print(f"{p} - {args.baseline}: mean {sum(g) / len(g):+.2f} points over {len(g)} workloads, worst {min(g):+.2f}")
    write_report(args.out, {"workloads": {w: item for w, item in zip(table, args.workloads)}}, table)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

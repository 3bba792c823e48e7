#!/usr/bin/env python
"""Export a checkpoint's actor: ``python scripts/export_policy.py --checkpoint PATH --format onnx|torchscript --out FILE``.

The exported graph maps the camera frames, the instruction's sentence embedding and the
proprioception to the mode action (see vla_rl/deploy.py and docs/policies.md); it prints the
graph's inputs and output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench_report import output_path

from vla_rl.checkpoint import CheckpointError
from vla_rl.config import ConfigError
from vla_rl.deploy import EXPORT_FORMATS, load_policy


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the checkpoint, export its actor; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint .pt, or a run directory")
    parser.add_argument("--format", choices=EXPORT_FORMATS, default="onnx")
    parser.add_argument("--out", required=True, type=output_path, help="file to write (.onnx or .pt)")
    parser.add_argument("--device", default="cpu", help="device to trace on: cpu, cuda or cuda:N (default: cpu)")
    args = parser.parse_args(argv)
    try:
        policy = load_policy(args.checkpoint, device=args.device)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        path = policy.export(args.out, format=args.format)
    except (CheckpointError, ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    meta = policy.metadata()
    print(f"{args.format}: {path}")
    for name, spec in (meta["inputs"] | meta["outputs"]).items():
        print(f"  {name:24s} {spec['dtype']:16s} {spec['shape']}")
    if meta["instruction_embedding"]:
        print(f"  instruction_embedding: {meta['instruction_embedding']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The benchmark JSON contract shared by every ``scripts/bench_*.py`` (see docs/ARCHITECTURE.md).

One object ``{"machine": ..., "config": ..., "results": ...}`` whose result keys name the figure
and its unit. Scripts import it as a sibling module (``from bench_report import write_report``):
``python scripts/bench_x.py`` puts ``scripts/`` first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from infra.common.files import unwritable, write_atomic

_PACKAGES = ("numpy", "torch", "mujoco", "jax", "ray", "tensordict", "gymnasium", "stable-baselines3")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _gpu() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return "; ".join(line.strip() for line in out.stdout.splitlines() if line.strip()) or None


def device_sync(device: Any) -> None:
    """Wait for the work queued on ``device`` when it is a CUDA device (timings of GPU work end there); else nothing."""
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)


def machine_info() -> dict[str, Any]:
    """Where the figures were measured: cores, CPU and GPU model, load, package versions."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "gpu": _gpu(),
        "python": platform.python_version(),
        "load_average_at_start": list(os.getloadavg()),
        "packages": versions,
    }


def output_path(text: str) -> Path:
    """``argparse`` type of an output file or folder: refused when the arguments are parsed, before any
    work, if it cannot be written there (missing parent folders are fine: the writer creates them)."""
    why = unwritable(text)
    if why:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written: {why}; give a writable path")
    return Path(text)


def write_report(path: str | Path, config: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """Write the report atomically (temp file + rename) and return it."""
    report = {"machine": machine_info(), "config": config, "results": results}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(report, indent=2, default=str).encode())
    return report

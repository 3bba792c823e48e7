"""What made a result: the fields every result JSON the project writes carries.

:func:`provenance` is the one place they are gathered; the benchmark writer
(``scripts/bench_report.py``), the evaluation and recipe scripts and a run's ``summary.json``
(:class:`infra.common.runlog.RunLog`) all call it, so a figure can be traced to the commit, the tree,
the configuration, the machine and the load that produced it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
"""The project's checkout (the commit is read from its git repository, when it is one)."""
_PACKAGES = ("numpy", "torch", "mujoco", "mujoco-warp", "warp-lang", "jax", "ray", "tensordict", "gymnasium",
             "stable-baselines3")


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages now (what else shares the cores)."""
    return [round(x, 2) for x in os.getloadavg()]


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of ``root``'s checkout; ``None`` where it is no git
    checkout (an installed wheel) or git is missing. ``dirty``: a tracked file differs from the commit."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                                 check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit.strip() if commit else None, "dirty": bool(status.strip()) if status is not None else None}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _gpu() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return "; ".join(line.strip() for line in out.stdout.splitlines() if line.strip()) or None


@functools.cache
def machine() -> dict[str, Any]:
    """The machine (fixed for a process): cores usable, CPU model, GPUs (``nvidia-smi``; ``None``: none),
    Python and the versions of the packages figures depend on."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": cores, "cpu_model": _cpu_model(), "gpu": _gpu(),
            "python": platform.python_version(), "packages": versions}


def provenance(config: Mapping[str, Any], load_at_start: Sequence[float]) -> dict[str, Any]:
    """The fields a result JSON starts with: ``{"git": {commit, dirty}, "machine": {cores, cpu_model, gpu,
    python, packages, load_average_at_start, load_average_at_end}, "config": config}``.

    Args:
        config: The full resolved configuration of what ran (plain JSON types).
        load_at_start: :func:`load_average` taken when the run started (the end's is taken now).
    """
    return {"git": git_state(),
            "machine": {**machine(), "load_average_at_start": list(load_at_start),
                        "load_average_at_end": load_average()},
            "config": dict(config)}

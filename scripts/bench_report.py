"""The benchmark JSON contract shared by every ``scripts/bench_*.py`` (see docs/ARCHITECTURE.md).

One object ``{"git": ..., "machine": ..., "config": ..., "results": ...}`` (the first three from
:func:`infra.common.provenance.provenance`) whose result keys name the figure and its unit. A script
writes it again after each part (:class:`BenchReport`), so a part that fails keeps the ones before
it. Scripts import it as a sibling module (``from bench_report import write_report``):
``python scripts/bench_x.py`` puts ``scripts/`` first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.common.files import unwritable, write_atomic
from infra.common.provenance import load_average, provenance

LOAD_AT_START = load_average()
"""The load when the script started (it imports this module first thing)."""


def device_sync(device: Any) -> None:
    """Wait for the work queued on ``device`` when it is a CUDA device (timings of GPU work end there); else nothing."""
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)


def output_path(text: str) -> Path:
    """``argparse`` type of an output file or folder: refused when the arguments are parsed, before any
    work, if it cannot be written there (missing parent folders are fine: the writer creates them)."""
    why = unwritable(text)
    if why:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written: {why}; give a writable path")
    return Path(text)


def plain(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (e.g. ``vars(args)``) with paths as strings: JSON types."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in config.items()}


def write_report(path: str | Path, config: Mapping[str, Any], results: Any,
                 load_at_start: Sequence[float] = LOAD_AT_START, **extra: Any) -> dict[str, Any]:
    """Write ``{git, machine, config, results, **extra}`` to ``path`` atomically (temp file + rename) and
    return it. ``load_at_start``: the load when the run began (default: when this module was imported)."""
    report = {**provenance(plain(config), load_at_start), "results": results, **extra}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(report, indent=2, default=str).encode())
    return report


def shown(value: Any) -> str:
    """Any measured value as printed: numbers with thousands separators and two decimals, text as it is,
    the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}" if (math.isfinite(value) and abs(value) >= 0.01) or value == 0 else f"{value:.3g}"
    return json.dumps(value, default=str)


def _print(name: str, value: Any, indent: str = "") -> None:
    """``name: value``; a dict as an indented block, one line per key."""
    if isinstance(value, dict) and value:
        print(f"{indent}{name}:", flush=True)
        for key, item in value.items():
            _print(str(key), item, indent + "  ")
    else:
        print(f"{indent}{name}: {shown(value)}", flush=True)


class BenchReport:
    """A benchmark's results, written to ``path`` (when given) after every part and printed as they arrive.

    A part that raises is recorded under ``results["errors"][name]`` with its traceback printed, and the
    next part runs: :attr:`failed` says whether any did (the script then exits non-zero).
    """

    def __init__(self, path: str | Path | None, config: Mapping[str, Any]):
        self.path, self.config = path, dict(config)
        self.results: dict[str, Any] = {}

    def add(self, name: str, value: Any) -> None:
        """Record and print one figure (any JSON value), then rewrite the file."""
        self.results[name] = value
        _print(name, value)
        self.write()

    def part(self, name: str, measure: Callable[[], Mapping[str, Any]]) -> bool:
        """Run ``measure`` and record each of its figures; on an exception, record it and return ``False``."""
        try:
            figures = measure()
        except Exception as exc:  # one failed part must not lose the others
            traceback.print_exc()
            self.results.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
            self.write()
            return False
        for key, value in figures.items():
            self.add(key, value)
        return True

    @property
    def failed(self) -> bool:
        """Whether a part raised."""
        return bool(self.results.get("errors"))

    def write(self) -> None:
        """Write the report as it stands (nothing without a path)."""
        if self.path is not None:
            write_report(self.path, self.config, self.results)

"""Bounds checked before anything is allocated: values shortened in messages, threads, parameter bytes.

A size read from a config, a checkpoint or a caller is checked here against what the machine has
before a tensor, a thread or a message is made from it, so bad input fails in one line instead of
after gigabytes.
"""

from __future__ import annotations

import os
from typing import Any

from infra.common.errors import ConfigError

SHORT_CHARS = 80
"""Longest rendering of a value quoted in an error message."""


def short(value: Any, limit: int = SHORT_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (with the length it had), for error messages.

    A string or bytes value is cut before ``repr`` runs, so a 10 MB value costs no 10 MB message.
    """
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} long)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def memory_bytes() -> int:
    """Physical memory of this machine in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_threads(threads: int, key: str = "threads") -> None:
    """``ConfigError`` unless ``1 <= threads <= cores()`` (more threads than cores only slow a job down)."""
    have = cores()
    if not 1 <= threads <= have:
        raise ConfigError(f"{key}={short(threads)} must be between 1 and the {have} cores this process may use: "
                         f"set {key}={have} or fewer")


def check_param_bytes(count: int, what: str, bytes_per: int = 4, share: float = 0.8) -> None:
    """``ConfigError`` when ``count`` parameters of ``bytes_per`` bytes each would take over ``share`` of this
    machine's memory: checked from the sizes a config names, before any tensor is made."""
    need, have = count * bytes_per, memory_bytes()
    if need > share * have:
        raise ConfigError(f"{what}: {count:,} parameters need {need / 2**30:.1f} GiB, over {share:.0%} of this "
                          f"machine's {have / 2**30:.1f} GiB: name smaller sizes")

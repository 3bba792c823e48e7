"""Validity checks of device arrays read once per block instead of once per step.

A vector env on a device (``warp``, ``mjx``) checks every action batch for NaN or inf and the Warp
backend checks every world for contact or constraint overflow; each check is a read of a device
value by the host, which on a GPU waits for everything queued before it. Inside
:func:`deferred_checks` (the training loop's collection of one rollout) the flags of each step are
or-ed on the device and read once when the block ends, in one transfer; the first failure found
is raised then, naming its environments. A host (numpy) env keeps checking every step: its
checks read no device. Outside the block every check runs at once, before any environment moves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from sims.backends import to_numpy

#: Kinds of deferred failure, in the order they are reported, and each one's message and exception.
MESSAGES = {
    "action": (ValueError, "action held NaN or inf for environments {ids} at a step of this block (checks were "
                           "deferred to its end, so those environments stepped on it) — check the policy's outputs"),
    "overflow": (RuntimeError, "mujoco_warp overflow in worlds {ids} at a step of this block: raise "
                               "sims.warp_backend.NCONMAX / NJMAX"),
}


class DeferredChecks:
    """Per-environment failure flags [N] of each kind of :data:`MESSAGES`, or-ed on the device."""

    def __init__(self) -> None:
        self._flags: dict[str, Any] = {}

    def add(self, kind: str, bad: Any) -> None:
        """Or ``bad`` (bool [N], on the device) into the flags of ``kind``; reads nothing."""
        self._flags[kind] = bad if kind not in self._flags else self._flags[kind] | bad

    def raise_any(self) -> None:
        """Read every flag in one transfer and raise the first failure (see :data:`MESSAGES`).

        Raises:
            ValueError: an action held NaN or inf; RuntimeError: a world overflowed.
        """
        kinds = [k for k in MESSAGES if k in self._flags]
        if not kinds:
            return
        flags = [self._flags.pop(k) for k in kinds]
        if hasattr(flags[0], "detach"):  # torch on the device: one transfer for every kind
            import torch

            stacked = to_numpy(torch.stack(flags))
        else:  # JAX (mjx) or numpy
            stacked = np.stack([to_numpy(f) for f in flags])
        for kind, row in zip(kinds, stacked):
            if row.any():
                error, message = MESSAGES[kind]
                raise error(message.format(ids=np.flatnonzero(row)[:10].tolist()))


@contextlib.contextmanager
def deferred_checks(*owners: Any) -> Iterator[DeferredChecks]:
    """Defer the checks of ``owners`` (a vector env, its backend: objects with a ``deferred`` attribute)
    to the block's end; nested blocks defer to the outermost one.

    Raises:
        at the block's end, what :meth:`DeferredChecks.raise_any` raises (not when the block
        itself raised: its exception wins).
    """
    owners = tuple(o for o in owners if o is not None and hasattr(o, "deferred") and o.deferred is None)
    checks = DeferredChecks()
    for owner in owners:
        owner.deferred = checks
    try:
        yield checks
    finally:
        for owner in owners:
            owner.deferred = None
    checks.raise_any()

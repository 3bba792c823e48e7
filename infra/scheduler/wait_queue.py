"""The queue of waiting gangs: served by priority then arrival, retried only when that can help.

Serving the queue after a release must not cost one placement attempt per waiting gang. Gangs of
the same shape (``GangRequest.shape_key``: bundles, constraints, tenant) fit or fail together, and
a shape that failed cannot fit until some node got resources back. So the queue remembers, per
shape, the state's ``clock`` when it last failed; a retry first looks only at the nodes that grew
since then (``ClusterState.grown``) and skips the shape when none of its bundles fits any of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from sortedcontainers import SortedList

from infra.scheduler.requests import Bundle
from infra.scheduler.resources import ClusterState


class WaitQueue:
    """Names of waiting gangs in service order, and the failure stamps of their shapes."""

    def __init__(self) -> None:
        self._order: SortedList = SortedList()
        self._entry: dict[str, tuple[int, int, str]] = {}
        self._key: dict[str, int] = {}
        self._ids: dict[tuple, int] = {}
        self._failed: dict[int, int] = {}

    def shape_id(self, key: tuple) -> int:
        """A small integer standing for shape ``key`` (hashing the key itself is slow)."""
        return self._ids.setdefault(key, len(self._ids))

    def push(self, name: str, priority: int, arrival: int, shape: int) -> None:
        """Add a waiting gang of shape id ``shape`` (higher priority first, then earlier arrival)."""
        entry = (-priority, arrival, name)
        self._entry[name] = entry
        self._key[name] = shape
        self._order.add(entry)

    def remove(self, name: str) -> None:
        """Drop a gang that is placed, released or failed (no-op if absent)."""
        entry = self._entry.pop(name, None)
        if entry is not None:
            self._order.remove(entry)
            del self._key[name]

    def names(self) -> list[str]:
        """Waiting gangs in the order they are served."""
        return [e[2] for e in self._order]

    def iter_names(self) -> Iterator[str]:
        """Waiting gangs in the order they are served, lazily (a search that stops early lists no more)."""
        return (e[2] for e in self._order)

    def with_keys(self) -> list[tuple[str, int]]:
        """``(name, shape id)`` of waiting gangs in the order they are served."""
        return [(e[2], self._key[e[2]]) for e in self._order]

    def sorts_before(self, a: str, b: str) -> bool:
        """Whether waiting gang ``a`` is served before waiting gang ``b``."""
        return self._entry[a] < self._entry[b]

    def mark_failed(self, key: int, clock: int) -> None:
        """Shape id ``key`` did not fit at state clock ``clock``."""
        self._failed[key] = clock

    def worth_trying(self, key: int, bundles: tuple[Bundle, ...], state: ClusterState) -> bool:
        """False when shape id ``key`` failed before and no node that grew since could take any of its bundles."""
        since = self._failed.get(key)
        if since is None:
            return True
        grown = np.flatnonzero(state.grown > since)
        if grown.size == 0:
            return False
        if any(fits_somewhere(b, state, grown) for b in set(bundles)):
            return True
        self._failed[key] = state.clock  # nothing changed for it: skip until more nodes grow
        return False


def fits_somewhere(b: Bundle, state: ClusterState, nodes: np.ndarray) -> bool:
    """Whether bundle ``b`` fits now on one of ``nodes`` (CPU, memory, and enough GPUs with room, per GPU)."""
    ok = state.alive[nodes] & (state.cpu_free[nodes] >= b.cpu_milli) & (state.mem_free[nodes] >= b.memory_mib)
    if not b.num_gpu or not ok.any():
        return bool(ok.any())
    gpu_ok = state.model_mask(b.gpu_models)[nodes] & (state.gpu_free[nodes] >= b.gpu_milli)
    if b.gpu_memory_mib:
        gpu_ok &= state.memory_free_mask(b.gpu_memory_mib)[nodes]
    return bool((ok & (gpu_ok.sum(axis=1) >= b.num_gpu)).any())

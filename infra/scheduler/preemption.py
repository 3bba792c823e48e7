"""Choosing what to preempt: a victim set that lets the gang run and is minimal for its placement.

Candidates (running gangs the preemptor may evict) come in groups, one per node, the nodes where
the least has to go first. The search frees the groups of a prefix of that order and places the
preemptor on what is free then: first with every group freed (when even that fails, nothing is
evicted: one placement attempt answers a hopeless search), then the shortest prefix that works,
found by doubling and bisection (a handful of attempts where freeing node by node took one per
node), each also checked against the preemptor's quota. Then every freed candidate whose resources
the placement did not need is given back, the most valuable first (highest priority, then oldest),
so no victim in the final set could have kept running without moving the preemptor.

The state's growth stamps (``ClusterState.clock``/``grown``, which tell the queue which shapes are
worth retrying) are restored after the search: only nodes that victims really leave count as grown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from infra.scheduler.resources import Alloc, ClusterState


@dataclass(frozen=True)
class Candidate:
    """A running gang the preemptor may evict.

    Attributes:
        name: the gang.
        keep_rank: higher is kept first when victims are given back (priority, then age).
        allocs: what it holds.
        tenant: its tenant (quota usage it returns when evicted).
        gpu_milli: its GPU usage.
    """

    name: str
    keep_rank: tuple
    allocs: tuple[Alloc, ...]
    tenant: str
    gpu_milli: int


def _allocate_all(state: ClusterState, allocs: tuple[Alloc, ...]) -> bool:
    """Take every allocation of ``allocs`` or none; returns whether they were taken."""
    done = []
    for a in allocs:
        if not state.fits(a):
            for b in done:
                state.free(b)
            return False
        state.allocate(a)
        done.append(a)
    return True


class _FreedPrefix:
    """Keeps the candidates of the first ``k`` groups freed on the state (each candidate in its first group).

    Moving frees or gives back whole groups with array additions: the search moves back and forth
    over thousands of allocations, and what it gives back is exactly what it freed.
    """

    def __init__(self, state: ClusterState, by_node: list[list[Candidate]]) -> None:
        self.state = state
        seen: set[str] = set()
        self.groups: list[list[Candidate]] = []
        for group in by_node:
            new = [c for c in group if c.name not in seen]
            seen.update(c.name for c in new)
            if new:
                self.groups.append(new)
        self.k = 0
        self.returned: Counter = Counter()

    def move(self, k: int) -> None:
        """Free or give back groups until exactly the first ``k`` are freed."""
        lo, hi, sign = (self.k, k, 1) if k > self.k else (k, self.k, -1)
        if lo == hi:
            return
        cands = [c for group in self.groups[lo:hi] for c in group]
        _add_allocs(self.state, [a for c in cands for a in c.allocs], sign)
        for c in cands:
            self.returned[c.tenant] += sign * c.gpu_milli
        self.k = k

    def freed(self) -> list[Candidate]:
        return [c for group in self.groups[: self.k] for c in group]


def _add_allocs(state: ClusterState, allocs: list[Alloc], sign: int) -> None:
    """Return (``sign`` 1) or take again (-1) the resources of ``allocs`` on the state, all at once."""
    held = AllocSums(state, allocs)
    state.cpu_free += sign * held.cpu
    state.mem_free += sign * held.mem
    state.gpu_free += sign * held.gpu
    state.gpu_mem_free += sign * held.gpu_mem
    state.version[held.nodes] += 1


class AllocSums:
    """What ``allocs`` hold on ``state``'s nodes: CPU and memory per node ``[N]``, milli-GPU and GPU memory
    per GPU ``[N, G]`` (GPU memory only where the GPU's memory is known, as the state counts it)."""

    def __init__(self, state: ClusterState, allocs: list[Alloc]) -> None:
        count = len(allocs)
        node = np.fromiter((a.node for a in allocs), dtype=np.int64, count=count)
        self.nodes = np.unique(node)
        self.cpu = np.bincount(node, np.fromiter((a.cpu for a in allocs), dtype=np.int64, count=count),
                               minlength=state.num_nodes).astype(np.int64)
        self.mem = np.bincount(node, np.fromiter((a.mem for a in allocs), dtype=np.int64, count=count),
                               minlength=state.num_nodes).astype(np.int64)
        self.gpu = np.zeros_like(state.gpu_free)
        self.gpu_mem = np.zeros_like(state.gpu_mem_free)
        per_gpu = [(a.node, g, a.gpu_milli, a.gpu_mem) for a in allocs for g in a.gpus]
        if per_gpu:
            n, g, milli, mem = (np.array(x, dtype=np.int64) for x in zip(*per_gpu))
            np.add.at(self.gpu, (n, g), milli)
            np.add.at(self.gpu_mem, (n, g), np.where(state.gpu_mem[n, g] > 0, mem, 0))


def choose_victims(
    state: ClusterState,
    by_node: list[list[Candidate]],
    place: Callable[[Counter], list[tuple[int, Alloc]] | None],
    quota_ok: Callable[[Counter, list[tuple[int, Alloc]]], bool],
) -> tuple[list, list[Candidate]] | None:
    """Free the shortest prefix of candidate groups that lets ``place()`` succeed, then give back all it can spare.

    Args:
        state: the cluster state (changed in place: the preemptor placed, the victims freed).
        by_node: candidate groups, one per node, in the order to try (a candidate may repeat).
        place: places the preemptor on the current state, in a size its quota admits once the given
            freed usage per tenant is returned (taking what it returns), or returns None.
        quota_ok: whether placement ``got`` stays admissible once the given usage is returned.
    Returns:
        ``([(bundle, alloc)], victims)``, or None with the state as it was.
    """
    clock, grown = state.clock, state.grown.copy()
    prefix = _FreedPrefix(state, by_node)
    k, got = _shortest_prefix(prefix, place)
    prefix.move(k)
    if got is None:
        state.clock, state.grown[:] = clock, grown
        return None
    for _, a in got:
        state.allocate(a)
    victims = []
    for c in sorted(prefix.freed(), key=lambda c: c.keep_rank, reverse=True):
        prefix.returned[c.tenant] -= c.gpu_milli
        if quota_ok(prefix.returned, got) and _allocate_all(state, c.allocs):
            continue
        prefix.returned[c.tenant] += c.gpu_milli
        victims.append(c)
    state.clock, state.grown[:] = clock, grown
    for n in sorted({a.node for c in victims for a in c.allocs}):
        state.clock += 1
        state.grown[n] = state.clock
    return got, victims


def _shortest_prefix(prefix: _FreedPrefix, place) -> tuple[int, list | None]:
    """``(k, placement)`` for the shortest prefix of groups found to work (``(0, None)``: none does);
    the placement is taken back off the state after each attempt."""

    def attempt(k: int) -> list | None:
        prefix.move(k)
        got = place(prefix.returned)
        for _, a in got or ():
            prefix.state.free(a)
        return got

    n = len(prefix.groups)
    best = attempt(n) if n else None
    if best is None:
        return 0, None
    lo, hi, k = 0, n, 1  # attempts at lo fail, at hi succeed
    while k < hi:  # doubling: the first power of two that works
        got = attempt(k)
        if got is not None:
            hi, best = k, got
            break
        lo, k = k, 2 * k
    while hi - lo > 1:  # bisection between the last failure and the first success
        mid = (lo + hi) // 2
        got = attempt(mid)
        if got is not None:
            hi, best = mid, got
        else:
            lo = mid
    return hi, best

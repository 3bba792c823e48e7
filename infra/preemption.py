"""Choosing what to preempt: a victim set that lets the gang run and is minimal for its placement.

Candidates (running gangs the preemptor may evict) are freed node by node, starting with the
nodes where the least has to go, and the preemptor is placed after each node; the first
placement that succeeds (and keeps the preemptor's quota) wins. Then every freed candidate whose
resources the placement did not need is given back, the most valuable first (highest priority,
then oldest), so no victim in the final set could have kept running without moving the preemptor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from infra.resources import Alloc, ClusterState


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


def choose_victims(
    state: ClusterState,
    by_node: list[list[Candidate]],
    place: Callable[[], list | None],
    quota_ok: Callable[[Counter], bool],
) -> tuple[list, list[Candidate]] | None:
    """Free candidates node by node until ``place()`` succeeds, then give back all it can spare.

    Args:
        state: the cluster state (changed in place: the preemptor placed, the victims freed).
        by_node: candidate groups, one per node, in the order to try (a candidate may repeat).
        place: places the preemptor on the current state; its allocations or None.
        quota_ok: whether the preemptor is admissible once the freed usage per tenant is returned.
    Returns:
        ``(placement, victims)``, or None with the state as it was.
    """
    freed: dict[str, Candidate] = {}
    returned: Counter = Counter()
    got = None
    for group in by_node:
        new = [c for c in group if c.name not in freed]
        if not new:
            continue
        for c in new:
            for a in c.allocs:
                state.free(a)
            freed[c.name] = c
            returned[c.tenant] += c.gpu_milli
        if quota_ok(returned):
            got = place()
            if got is not None:
                break
    if got is None:
        for c in freed.values():
            if not _allocate_all(state, c.allocs):
                raise RuntimeError(f"preemption search could not give back the resources of {c.name!r}")
        return None
    victims = []
    for c in sorted(freed.values(), key=lambda c: c.keep_rank, reverse=True):
        returned[c.tenant] -= c.gpu_milli
        if quota_ok(returned) and _allocate_all(state, c.allocs):
            continue
        returned[c.tenant] += c.gpu_milli
        victims.append(c)
    return got, victims

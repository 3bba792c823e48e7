"""Reservation with backfill: the first blocked gang of the queue collects resources as they free up.

Without it a large gang starves behind a stream of small ones: every release frees a little, and
a small gang that fits takes it. The scheduler gives the first waiting gang that fits nowhere a
reservation: *targets* (a placement chosen on the empty cluster, on the nodes that are emptiest
now, so that it waits for the fewest departures) and *holds*, the parts of the targets that are
free, taken at once. Whatever is returned later on a target goes to the holds first; when they
cover the targets the gang is placed there. Other gangs backfill everything that is not held.

The bound, for any mix of priorities. The reservation goes to the first waiting gang G (queue
order: priority, then arrival) whose services are placed, whose quota admits it and which fits the
empty cluster. While G holds it (priority p, target nodes T):

* nothing it holds goes to a gang served after G (lower priority, or equal priority and later
  arrival); such gangs backfill only what is not held, never preempt a gang on T, and are not
  placed when that would leave G's quota unable to admit it;
* G starts no later than the operation after which no *blocker* occupies T: the gangs that ran or
  drained on T when the reservation was made, and any gang of priority above p later placed on
  T with what the reservation held (such a gang may take it; the reservation keeps its targets
  and takes back what is left);
* G loses the reservation only when it is placed or leaves, a node of T is lost, or a gang served
  before it (higher priority, or equal priority and earlier arrival, e.g. one that waited for
  quota) takes the reservation over or is placed with the quota G needs; G is then reserved for
  again as soon as it is the first such gang.

So only gangs served before G pass it; with no such gang arriving, G waits at most for its
blockers. ``tests/infra/test_properties.py`` checks each clause after every operation of random
streams, at hundreds of nodes and thousands of gangs with priorities 0-3, grace periods and quotas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infra.scheduler.gang_placer import GangPlacer
from infra.scheduler.node_scoring import Policy, free_fraction
from infra.scheduler.requests import GangRequest
from infra.scheduler.resources import Alloc, ClusterState


class ReservePolicy(Policy):
    """Scores nodes of an empty copy of the cluster by how empty they are *now* in ``real``."""

    name = "reserve"

    def __init__(self, real: ClusterState) -> None:
        self.real = real

    def node_scores(self, state, d, cand):
        return free_fraction(self.real, cand.nodes)

    def pick_gpus(self, state, d, cand, k, rng):
        if d.num_gpu == 0:
            return ()
        node = cand.nodes[k]
        free = np.where(cand.gpu_ok[k], self.real.gpu_free[node], -1)
        return tuple(int(g) for g in np.argsort(-free, kind="stable")[: d.num_gpu])


@dataclass
class _Held:
    cpu: int = 0
    mem: int = 0
    gpu: dict[int, int] = field(default_factory=dict)
    gpu_mem: dict[int, int] = field(default_factory=dict)


@dataclass
class Reservation:
    """Resources collected for one waiting gang.

    Attributes:
        gang: the gang's name.
        priority: its priority.
        targets: ``[(bundle, alloc)]`` where it will run.
        blockers: gangs that used the targets when the reservation was made.
        holds: allocations taken on the state so far (pieces of the targets).
    """

    gang: str
    priority: int
    targets: list[tuple[int, Alloc]]
    blockers: set[str]
    holds: list[Alloc] = field(default_factory=list)
    _held: list[_Held] = field(default_factory=list)

    @property
    def nodes(self) -> set[int]:
        """Node indices of the targets."""
        return {a.node for _, a in self.targets}

    def top_up(self, state: ClusterState) -> bool:
        """Take what is free of the targets; returns whether the holds now cover them."""
        if not self._held:
            self._held = [_Held() for _ in self.targets]
        complete = True
        for (_, t), held in zip(self.targets, self._held):
            n = t.node
            cpu = min(int(state.cpu_free[n]), t.cpu - held.cpu)
            mem = min(int(state.mem_free[n]), t.mem - held.mem)
            if cpu > 0 or mem > 0:
                self._take(state, Alloc(n, (), 0, max(cpu, 0), max(mem, 0)))
                held.cpu += max(cpu, 0)
                held.mem += max(mem, 0)
            for g in t.gpus:
                milli = min(int(state.gpu_free[n, g]), t.gpu_milli - held.gpu.get(g, 0))
                known = state.gpu_mem[n, g] > 0
                gmem = min(int(state.gpu_mem_free[n, g]), t.gpu_mem - held.gpu_mem.get(g, 0)) if known else 0
                if milli > 0 or gmem > 0:
                    self._take(state, Alloc(n, (g,), max(milli, 0), 0, 0, max(gmem, 0)))
                    held.gpu[g] = held.gpu.get(g, 0) + max(milli, 0)
                    held.gpu_mem[g] = held.gpu_mem.get(g, 0) + max(gmem, 0)
                complete &= held.gpu.get(g, 0) >= t.gpu_milli and (not known or held.gpu_mem.get(g, 0) >= t.gpu_mem)
            complete &= held.cpu >= t.cpu and held.mem >= t.mem
        return complete

    def _take(self, state: ClusterState, a: Alloc) -> None:
        state.allocate(a)
        self.holds.append(a)

    def drop(self, state: ClusterState) -> None:
        """Return every hold (the state gets back exactly what was taken)."""
        for a in self.holds:
            state.free(a)
        self.holds.clear()
        self._held.clear()


def reservation_targets(
    state: ClusterState, placer: GangPlacer, req: GangRequest, services: dict
) -> list[tuple[int, Alloc]] | None:
    """Where ``req`` would run on the empty cluster, on the nodes emptiest now (None: never fits)."""
    shadow = state.empty_copy()
    planner = GangPlacer(shadow, ReservePolicy(state), placer.rng)
    return planner.place(req, list(range(req.min_size)), services)

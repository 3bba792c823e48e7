"""Who holds what: the gangs a scheduler knows and the indexes over what the placed ones hold.

``GangBook`` is the record every part of the scheduler (``infra.scheduler.core``) reads and
writes: the cluster state, the quota ledger, the wait queue, the deadlines to come and the event
log. Its methods move a gang between states and keep the indexes (placed services, gangs per node
and per priority, quota usage) equal to what placed gangs hold; they decide nothing.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from infra.scheduler.events import EventKind, EventLog
from infra.scheduler.gang_placer import Assignment, Placement
from infra.scheduler.preemption import Candidate
from infra.scheduler.quota import QuotaLedger
from infra.scheduler.requests import Bundle, DifferentNodes, GangRequest, SameGPU, SameNode
from infra.scheduler.reservation import Reservation
from infra.scheduler.resources import Alloc, ClusterState
from infra.scheduler.wait_queue import WaitQueue

PreemptCallback = Callable[[str, str], None]
"""``on_preempt(gang_name, reason)``: called when a gang is told to stop, so it can checkpoint."""


class GangState(StrEnum):
    """Where a known gang stands."""

    WAITING = "waiting"
    PLACED = "placed"
    DRAINING = "draining"


@dataclass
class Gang:
    """A known gang: its request, where it stands, what it holds and whom it waits for or blocks."""

    req: GangRequest
    on_preempt: PreemptCallback | None
    arrival: int
    state: GangState = GangState.WAITING
    allocs: dict[int, Alloc] = field(default_factory=dict)
    since: float = 0.0
    epoch: int = 0
    deadline: float | None = None
    blocked_by: set[str] = field(default_factory=set)
    blocking: set[str] = field(default_factory=set)
    old_nodes: set[int] = field(default_factory=set)
    borrowing: bool = False
    preemptions: int = 0
    notice: str = ""
    key: int = -1
    drain_hold: Reservation | None = None
    """While draining: what the preemptor did not take of its resources, held until it stops."""
    cached_candidate: Candidate | None = None
    """This gang as a preemption candidate, built once per change of its allocations."""

    @property
    def gpu_milli(self) -> int:
        return sum(self.req.bundles[b].total_gpu_milli for b in self.allocs)

    @cached_property
    def min_milli(self) -> int:
        """Milli-GPU of its smallest admissible size (what its quota must admit)."""
        return self.req.gpu_milli(self.req.min_size)

    def candidate(self) -> Candidate:
        """This placed gang as a preemption candidate (kept most valuable: higher priority, then older)."""
        if self.cached_candidate is None:
            self.cached_candidate = Candidate(self.req.name, (self.req.priority, -self.arrival),
                                              tuple(self.allocs.values()), self.req.tenant, self.gpu_milli)
        return self.cached_candidate


class GangBook:
    """The gangs by name and what they hold; see the module docstring.

    Args:
        state: the cluster's free resources (replaced when a node joins: read it here, never keep it).
        ledger: quota usage per tenant.
        log: where every step is recorded.
    """

    def __init__(self, state: ClusterState, ledger: QuotaLedger, log: EventLog) -> None:
        self.state = state
        self.ledger = ledger
        self.log = log
        self.gangs: dict[str, Gang] = {}
        self.arrivals = itertools.count()
        self.queue = WaitQueue()
        self.services: dict[str, tuple[int, tuple[int, ...]]] = {}
        """Placed services ``"<gang>/<bundle>"`` -> (node index, GPU indices)."""
        self.on_node: list[set[str]] = [set() for _ in range(state.num_nodes)]
        self.by_priority: dict[int, set[str]] = {}
        self.deadlines: list[tuple[float, int, str]] = []
        """Heap of (time, epoch, gang) of forced stops and timeouts; stale entries are skipped when due."""
        self.valid: set[Bundle] = set()
        """Bundles already validated against the nodes (cleared when nodes change)."""

    def gang(self, name: str) -> Gang:
        if name not in self.gangs:
            raise KeyError(f"unknown gang {name!r}; known gangs: {sorted(self.gangs)[:10]}")
        return self.gangs[name]

    def node(self, node_name: str) -> int:
        if node_name not in self.state.node_index:
            raise KeyError(f"unknown node {node_name!r}; nodes are {list(self.state.node_index)[:5]}...")
        return self.state.node_index[node_name]

    def push_deadline(self, g: Gang) -> None:
        heapq.heappush(self.deadlines, (g.deadline, g.epoch, g.req.name))

    def enqueue(self, g: Gang, now: float) -> None:
        g.state, g.since = GangState.WAITING, now
        g.deadline = None if g.req.timeout_s is None else now + g.req.timeout_s
        if g.deadline is not None:
            self.push_deadline(g)
        self.queue.push(g.req.name, g.req.priority, g.arrival, g.key)
        self.log.add(EventKind.QUEUED, g.req.name, now, priority=g.req.priority)

    def start(self, g: Gang, got: list[tuple[int, Alloc]], now: float) -> None:
        """``g`` leaves the queue and runs on ``got`` (already taken on the state)."""
        self.queue.remove(g.req.name)
        g.state, g.since, g.deadline = GangState.PLACED, now, None
        g.epoch += 1
        g.borrowing = not self.ledger.within_nominal(g.req.tenant, sum(g.req.bundles[b].total_gpu_milli for b, _ in got))
        self.put_in(g, got)
        self.by_priority.setdefault(g.req.priority, set()).add(g.req.name)
        self.log.add(EventKind.PLACED, g.req.name, now, nodes=self.node_names(got), size=len(got),
                     epoch=g.epoch, borrowing=g.borrowing, waiting_for=sorted(g.blocked_by))

    def put_in(self, g: Gang, got: list[tuple[int, Alloc]]) -> None:
        """Record allocations already taken on the state as ``g``'s (ledger and indexes follow)."""
        name = g.req.name
        g.cached_candidate = None
        for b, a in got:
            g.allocs[b] = a
            self.services[f"{name}/{b}"] = (a.node, a.gpus)
            self.on_node[a.node].add(name)
            self.ledger.add(g.req.tenant, g.req.bundles[b].total_gpu_milli)

    def take_out(self, g: Gang, bundles: list[int], free: bool) -> None:
        """Drop ``bundles`` from ``g`` (their resources returned to the state when ``free``)."""
        name = g.req.name
        g.cached_candidate = None
        nodes = set()
        for b in bundles:
            a = g.allocs.pop(b)
            nodes.add(a.node)
            if free:
                self.state.free(a)
            del self.services[f"{name}/{b}"]
            self.ledger.add(g.req.tenant, -g.req.bundles[b].total_gpu_milli)
        for n in nodes - {a.node for a in g.allocs.values()}:
            self.on_node[n].discard(name)

    def free(self, g: Gang, free: bool = True) -> None:
        """Return everything ``g`` holds (to the state too when ``free``); it leaves the placed set."""
        g.old_nodes = {a.node for a in g.allocs.values()}
        self.take_out(g, sorted(g.allocs), free)
        self.by_priority.get(g.req.priority, set()).discard(g.req.name)

    def occupants(self, nodes: set[int]) -> set[str]:
        """Gangs placed on ``nodes``, or draining there during their grace."""
        draining = {g.req.name for g in self.gangs.values()
                    if g.drain_hold is not None and any(a.node in nodes for a in g.drain_hold.holds)}
        return draining.union(*(self.on_node[n] for n in nodes))

    def missing_services(self, g: Gang) -> list[str]:
        """Services named by ``g``'s constraints that are not placed (it must wait for them)."""
        names = []
        for c in g.req.constraints:
            if isinstance(c, SameGPU | SameNode) and c.service:
                names.append(c.service)
            elif isinstance(c, DifferentNodes):
                names += list(c.services)
        return [s for s in names if s not in self.services]

    def placement(self, g: Gang) -> Placement:
        nodes = self.state.cluster.nodes
        return Placement(
            g.req.name,
            tuple(Assignment(b, nodes[a.node].name, a.gpus, a.gpu_milli) for b, a in sorted(g.allocs.items())),
            g.epoch,
        )

    def node_names(self, got) -> list[str]:
        return sorted({self.state.cluster.nodes[a.node].name for _, a in got})

"""The scheduler: a priority queue of gangs over a cluster.

``submit`` validates a gang and places it at once (all or nothing) with the configured policy
when it fits and its tenant's GPU quota admits it. Otherwise it preempts: running gangs of
strictly lower priority of its tenant, and gangs of tenants that borrow quota when it reclaims
its own, are candidates; the victims are a minimal set for the placement found
(``infra.scheduler.preemption``). Else it waits in the queue, served by priority then arrival whenever
resources come back (a release, a stopped victim, a lost node restored or a new one), and
queued gangs preempt too. The first blocked gang holds a reservation that collects resources as
they free up, while later gangs backfill the rest (``infra.scheduler.reservation``).

Preemption is a contract: the victim is told (``on_preempt`` and a ``PREEMPT_NOTICE`` event), has
its request's ``grace_s`` to checkpoint and report ``stopped``, after which ``tick`` stops it by
force (``FORCED_STOP``); it then waits in the queue and runs again when capacity returns. Its
resources go to the preemptor in the plan at once (what it does not need stays held for the victim
until it stops); the preemptor is *ready* (``READY``) when every victim has stopped. A gang waiting longer than its ``timeout_s`` fails with the reason
(``TIMED_OUT``). Every step is an ``Event`` in ``events``. Time is ``now`` (seconds) passed to each
verb, or the scheduler's clock, so that a journal of verbs replays the same decisions.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import numpy as np

from infra.scheduler import node_scoring
from infra.scheduler.frag import TypicalPods
from infra.scheduler.gang_placer import Assignment, GangPlacer, Placement
from infra.scheduler.preemption import AllocSums, Candidate, choose_victims
from infra.scheduler.quota import Quota, QuotaLedger
from infra.scheduler.requests import (
    Bundle,
    DifferentNodes,
    GangRequest,
    RequestError,
    SameGPU,
    SameNode,
    validate,
)
from infra.scheduler.reservation import Reservation, reservation_targets
from infra.scheduler.resources import Alloc, Cluster, ClusterState, Node
from infra.scheduler.wait_queue import WaitQueue, fits_somewhere

_MAX_PASSES = 50
"""Bound on queue passes per drain (a pass repeats only when victims were requeued meanwhile)."""

PreemptCallback = Callable[[str, str], None]
"""``on_preempt(gang_name, reason)``: called when a gang is told to stop, so it can checkpoint."""


class EventKind(StrEnum):
    """What an ``Event`` records."""

    SUBMITTED = "submitted"
    PLACED = "placed"
    READY = "ready"
    QUEUED = "queued"
    RESERVED = "reserved"
    UNRESERVED = "unreserved"
    PREEMPT_NOTICE = "preempt_notice"
    PREEMPTED = "preempted"
    FORCED_STOP = "forced_stop"
    RELEASED = "released"
    RESIZED = "resized"
    TIMED_OUT = "timed_out"
    NODE_JOINED = "node_joined"
    NODE_LOST = "node_lost"
    NODE_RESTORED = "node_restored"
    EVICTED_BY_NODE_LOSS = "evicted_by_node_loss"
    SERVICE_PROBLEM = "service_problem"
    """Not the plan's: the service's journal damage, replay and background errors (``seq`` -1)."""


class GangState(StrEnum):
    """Where a known gang stands."""

    WAITING = "waiting"
    PLACED = "placed"
    DRAINING = "draining"


@dataclass(frozen=True)
class Event:
    """One entry of the event log.

    Attributes:
        seq: position in the log.
        kind: what happened.
        gang: the gang concerned ("" for node events).
        time: the scheduler's time of the event (seconds).
        detail: kind-specific facts (nodes, priorities, reasons, sizes, deadlines).
    """

    seq: int
    kind: EventKind
    gang: str
    time: float = 0.0
    detail: dict = field(default_factory=dict)


@dataclass
class _Gang:
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


class Scheduler:
    """Places gangs on a cluster; see the module docstring.

    Args:
        cluster: the nodes.
        policy: a placement policy name (``infra.scheduler.node_scoring.names()``).
        typical: typical pods for fragmentation-aware policies (estimated online when None).
        seed: None breaks score ties by cluster node order; an int draws a random node order from
            it (as the trace replay does). It also seeds the random policy (0 when None).
        quotas: GPU quota per tenant (None: no quotas; see ``infra.scheduler.quota``).
        reserve: give the first blocked gang a reservation (backfill the rest).
        clock: the time source when a verb is given no ``now``.
        max_events: events kept in ``events`` (the oldest are dropped; None keeps all).
    """

    def __init__(
        self,
        cluster: Cluster,
        policy: str = "fgd-strand",
        typical: TypicalPods | None = None,
        seed: int | None = None,
        quotas: dict[str, Quota] | None = None,
        reserve: bool = True,
        clock: Callable[[], float] = time.monotonic,
        max_events: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.state = ClusterState(cluster)
        rng = np.random.default_rng(0 if seed is None else seed)  # the random policy is seeded either way
        if seed is not None:
            self.state.tie_rank = rng.permutation(self.state.num_nodes)
        self.policy = node_scoring.load(policy, typical=typical)
        self._placer = GangPlacer(self.state, self.policy, rng)
        self.ledger = QuotaLedger(quotas)
        self.reserve = reserve
        self.clock = clock
        self.events: list[Event] = []
        self.max_events = max_events
        self._event_seq = itertools.count()
        self._gangs: dict[str, _Gang] = {}
        self._arrivals = itertools.count()
        self._queue = WaitQueue()
        self._services: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._on_node: list[set[str]] = [set() for _ in cluster.nodes]
        self._by_priority: dict[int, set[str]] = {}
        self._deadlines: list[tuple[float, int, str]] = []
        self._valid: set[Bundle] = set()
        self._reservation: Reservation | None = None
        self._unreservable: set[str] = set()
        """Waiting gangs that fit not even the empty cluster (no reservation until nodes change)."""
        self._draining = False
        self._requeued = False

    # ---------------------------------------------------------------- queries
    @property
    def queue(self) -> list[str]:
        """Names of waiting gangs in the order they are served."""
        return self._queue.names()

    @property
    def placements(self) -> dict[str, Placement]:
        """Gangs that hold resources in the plan (ready or waiting for victims), by name."""
        return {n: self._placement(g) for n, g in self._gangs.items() if g.state is GangState.PLACED}

    @property
    def reservation(self) -> Reservation | None:
        """The current reservation, if any."""
        return self._reservation

    def gangs(self) -> list[str]:
        """Every known gang (waiting, placed or draining)."""
        return list(self._gangs)

    def holds(self) -> list[Alloc]:
        """Resources held without a placement: the reservation's, and what draining gangs still run on."""
        out = list(self._reservation.holds) if self._reservation is not None else []
        for g in self._gangs.values():
            if g.drain_hold is not None:
                out += g.drain_hold.holds
        return out

    def placement(self, name: str) -> Placement | None:
        """Placement of gang ``name``, or None unless it is placed (KeyError if unknown)."""
        g = self._gang(name)
        return self._placement(g) if g.state is GangState.PLACED else None

    def gang_state(self, name: str) -> GangState:
        """Where gang ``name`` stands (KeyError if unknown)."""
        return self._gang(name).state

    def ready(self, name: str) -> bool:
        """Whether ``name`` is placed and no victim of it is still draining (its actors may start)."""
        g = self._gang(name)
        return g.state is GangState.PLACED and not g.blocked_by

    def blocked_by(self, name: str) -> set[str]:
        """Draining victims a placed gang waits for."""
        return set(self._gang(name).blocked_by)

    def deadline(self, name: str) -> float | None:
        """Forced-stop time of a draining gang, timeout of a waiting one (None: none)."""
        return self._gang(name).deadline

    def borrowing(self, name: str) -> bool:
        """Whether the placed gang was admitted on borrowed quota."""
        return self._gang(name).borrowing

    def gangs_on(self, node_name: str) -> list[str]:
        """Placed gangs with a bundle on ``node_name``."""
        return sorted(self._on_node[self._node(node_name)])

    def occupants(self, node_name: str) -> set[str]:
        """Gangs that use resources of ``node_name``: placed there, or draining there during their grace."""
        return self._occupants({self._node(node_name)})

    def _occupants(self, nodes: set[int]) -> set[str]:
        draining = {g.req.name for g in self._gangs.values()
                    if g.drain_hold is not None and any(a.node in nodes for a in g.drain_hold.holds)}
        return draining.union(*(self._on_node[n] for n in nodes))

    def preemptions(self, name: str) -> int:
        """How many times the gang was told to stop."""
        return self._gang(name).preemptions

    def notice(self, name: str) -> str:
        """Why the gang was last told to stop ("" if never)."""
        return self._gang(name).notice

    def next_deadline(self) -> float | None:
        """The earliest forced stop or timeout to come (``tick`` has work from then on)."""
        return self._deadlines[0][0] if self._deadlines else None

    def events_since(self, seq: int) -> list[Event]:
        """Events with a sequence number above ``seq`` (those still kept)."""
        lo, hi = 0, len(self.events)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.events[mid].seq <= seq:
                lo = mid + 1
            else:
                hi = mid
        return self.events[lo:]

    def request(self, name: str) -> GangRequest:
        """The request of gang ``name`` (KeyError if unknown)."""
        return self._gang(name).req

    def services(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        """Placed services ``"<gang>/<bundle>"`` -> (node index, GPU indices)."""
        return dict(self._services)

    def why_waiting(self, name: str) -> str:
        """Why a waiting gang is not placed now (quota, missing services, resources, reservation)."""
        g = self._gang(name)
        if g.state is not GangState.WAITING:
            return f"gang {name!r} is {g.state.value}"
        missing = self._missing_services(g)
        if missing:
            return f"waits for services {missing} to be placed"
        milli = g.min_milli
        if not self.ledger.admissible(g.req.tenant, milli):
            return self.ledger.why_not(g.req.tenant, milli)
        if not self._spares_reserved_quota(g, milli):
            return f"its GPUs would take quota that gang {self._reservation.gang!r}, which holds the reservation, needs"
        alive = np.flatnonzero(self.state.alive)
        for i, b in enumerate(g.req.bundles):
            if not fits_somewhere(b, self.state, alive):
                return f"bundle {i} ({_describe(b)}) fits no live node now; {self._most_free(b)}"
        res = self._reservation
        held = f"; gang {res.gang!r} holds a reservation" if res is not None and res.gang != name else ""
        return f"each bundle fits some node, but not the whole gang with its constraints{held}"

    # ---------------------------------------------------------------- verbs
    def submit(
        self, req: GangRequest, on_preempt: PreemptCallback | None = None, now: float | None = None
    ) -> Placement | None:
        """Place ``req`` now (preempting if needed) or queue it.

        Returns:
            The placement (check ``ready`` when it preempted gangs with a grace period), or None
            when the gang waits in the queue.
        Raises:
            RequestError: invalid request, unknown tenant, or a name already in use (nothing placed).
        """
        now = self._now(now)
        if req.name in self._gangs:
            raise RequestError(f"gang name {req.name!r} is already in use; release it first or pick another name.")
        self.ledger.check_tenant(req.tenant, req.name)
        validate(req, self.state, self._services, self._valid)
        g = _Gang(req, on_preempt, next(self._arrivals), since=now, key=self._queue.shape_id(req.shape_key))
        self._gangs[req.name] = g
        self._log(EventKind.SUBMITTED, req.name, now, priority=req.priority, tenant=req.tenant,
                  bundles=len(req.bundles))
        if not self._missing_services(g) and self._admit(g, now):
            self._yield_reservation_without_quota(now)
            return self._placement(g)
        self._queue.mark_failed(g.key, self.state.clock)
        self._enqueue(g, now)
        if self._reservation is None or self._queue.sorts_before(req.name, self._reservation.gang):
            self._update_reservation(now)
        return self._placement(g) if g.state is GangState.PLACED else None

    def release(self, name: str, now: float | None = None, reason: str = "released") -> None:
        """Stop gang ``name`` (in any state), return what it holds, serve the queue."""
        now = self._now(now)
        g = self._gang(name)
        if g.state is GangState.DRAINING:
            self._unblock(g, now)
        elif g.state is GangState.PLACED:
            self._free(g)
            self._clear_blocked(g)
        if self._reservation is not None and self._reservation.gang == name:
            self._drop_reservation(now)
        self._queue.remove(name)
        self._unreservable.discard(name)
        del self._gangs[name]
        self._log(EventKind.RELEASED, name, now, reason=reason)
        self._drain(now)

    def stopped(self, name: str, now: float | None = None) -> None:
        """A draining gang reports that it has stopped (checkpointed); it waits in the queue again."""
        now = self._now(now)
        g = self._gang(name)
        if g.state is not GangState.DRAINING:
            raise RequestError(f"gang {name!r} is {g.state.value}, not draining: only a preempted gang reports stopped.")
        self._log(EventKind.PREEMPTED, name, now, stop="acknowledged")
        self._unblock(g, now)
        self._enqueue(g, now)
        self._drain(now)

    def tick(self, now: float | None = None) -> list[str]:
        """Stop draining gangs whose grace is over, fail waiting gangs past their timeout; their names."""
        now = self._now(now)
        done = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, epoch, name = heapq.heappop(self._deadlines)
            g = self._gangs.get(name)
            if g is None or g.deadline is None or g.epoch != epoch or g.deadline > now:
                continue
            if g.state is GangState.DRAINING:
                self._log(EventKind.FORCED_STOP, name, now, grace_s=g.req.grace_s)
                self._unblock(g, now)
                self._enqueue(g, now)
            else:
                reason = self.why_waiting(name)
                self._log(EventKind.TIMED_OUT, name, now, waited_s=now - g.since, reason=reason)
                self.release(name, now, reason=f"timed out after {g.req.timeout_s} s: {reason}")
            done.append(name)
        if done:
            self._drain(now)
        return done

    def resize(self, name: str, num_bundles: int, now: float | None = None) -> Placement:
        """Grow or shrink a placed elastic gang to ``num_bundles`` (all added bundles or none).

        Raises:
            RequestError: not elastic, not placed, or size outside ``[min_bundles, len(bundles)]``.
            RuntimeError: growing does not fit now, or its quota does not admit it (it keeps its size).
        """
        now = self._now(now)
        g = self._gang(name)
        req = g.req
        if req.min_bundles is None:
            raise RequestError(f"gang {name!r} is not elastic; submit it with min_bundles to resize it.")
        if g.state is not GangState.PLACED:
            raise RequestError(f"gang {name!r} is {g.state.value}; resize it once it is placed.")
        if not req.min_size <= num_bundles <= len(req.bundles):
            raise RequestError(f"gang {name!r}: size {num_bundles} outside [{req.min_size}, {len(req.bundles)}].")
        have = sorted(g.allocs)
        if num_bundles < len(have):
            drop = have[num_bundles:]
            self._take_out(g, drop, free=True)
            self._log(EventKind.RESIZED, name, now, size=num_bundles, removed=drop)
            self._drain(now)
        elif num_bundles > len(have):
            add = [b for b in range(len(req.bundles)) if b not in g.allocs][: num_bundles - len(have)]
            extra = sum(req.bundles[b].total_gpu_milli for b in add)
            got = None
            if self._quota_admits(g, extra):
                got = self._placer.place(req, add, self._services, {b: a.node for b, a in g.allocs.items()})
            if got is None:
                raise RuntimeError(f"gang {name!r}: {len(add)} more bundles do not fit now; it keeps {len(have)}.")
            self._put_in(g, got)
            self._log(EventKind.RESIZED, name, now, size=num_bundles, added=add, nodes=self._node_names(got))
            self._yield_reservation_without_quota(now)
        return self._placement(g)

    def remove_node(self, node_name: str, now: float | None = None) -> list[str]:
        """A node is lost: its gangs are evicted and requeued (served at once). Returns their names."""
        now = self._now(now)
        n = self._node(node_name)
        if not self.state.alive[n]:
            return []
        hit = sorted(self._on_node[n], key=lambda x: self._gangs[x].arrival)
        self._log(EventKind.NODE_LOST, "", now, node=node_name, gangs=hit)
        if self._reservation is not None and n in self._reservation.nodes:
            self._drop_reservation(now)
        for name in hit:
            g = self._gangs[name]
            if g.on_preempt is not None:
                g.on_preempt(name, f"node {node_name} lost")
            self._free(g)
            self._clear_blocked(g)
            self._log(EventKind.EVICTED_BY_NODE_LOSS, name, now, node=node_name)
            self._enqueue(g, now)
        for g in [g for g in self._gangs.values() if g.state is GangState.DRAINING and n in g.old_nodes]:
            self._log(EventKind.PREEMPTED, g.req.name, now, stop=f"node {node_name} lost")
            self._unblock(g, now)
            self._enqueue(g, now)
        self.state.alive[n] = False
        self.state.version[n] += 1
        self._nodes_changed()
        self._drain(now)
        return hit

    def restore_node(self, node_name: str, now: float | None = None) -> None:
        """A lost node is back (empty); the queue is served."""
        now = self._now(now)
        n = self._node(node_name)
        if self.state.alive[n]:
            return
        st = self.state
        st.alive[n] = True
        st.cpu_free[n], st.mem_free[n] = st.cpu_cap[n], st.mem_cap[n]
        st.gpu_free[n] = np.where(st.gpu_exists[n], 1000, 0)
        st.gpu_mem_free[n] = st.gpu_mem[n]
        st.version[n] += 1
        st.clock += 1
        st.grown[n] = st.clock
        self._log(EventKind.NODE_RESTORED, "", now, node=node_name)
        self._nodes_changed()
        self._drain(now)

    def add_node(self, node: Node, now: float | None = None) -> None:
        """A node joins the cluster (a known lost node is restored); the queue is served."""
        now = self._now(now)
        if node.name in self.state.node_index:
            self.restore_node(node.name, now)
            return
        self.state = self.state.with_node(node)
        self.cluster = self.state.cluster
        self._placer.state = self.state
        self._on_node.append(set())
        self._log(EventKind.NODE_JOINED, "", now, node=node.name, cpu_milli=node.cpu_milli, gpus=len(node.gpus),
                  models=sorted({x.model for x in node.gpus}))
        self._nodes_changed()
        self._drain(now)

    # ---------------------------------------------------------------- placing
    def _admit(self, g: _Gang, now: float) -> bool:
        """Place ``g`` now, or preempt for it; whether it is placed."""
        got = self._place(g)
        res = self._reservation
        if got is None and res is not None and res.priority < g.req.priority:
            return self._admit_over(g, res, now)
        if got is not None:
            self._start(g, got, now)
            return True
        return self._preempt(g, now)

    def _admit_over(self, g: _Gang, res: Reservation, now: float) -> bool:
        """``g`` outranks the reservation's gang and fits nowhere else: try it (placing, then preempting)
        with what the reservation holds given back. The reservation keeps its targets and takes back what
        ``g`` left of them; ``g`` joins its blockers when it runs on the target nodes."""
        res.drop(self.state)
        got = self._place(g)
        if got is not None:
            self._start(g, got, now)
        placed = got is not None or self._preempt(g, now)
        if placed and {a.node for a in g.allocs.values()} & res.nodes:
            res.blockers.add(g.req.name)
        if self._reservation is res:  # a drain during the preemption may have moved it on already
            self._top_up(now)
        return placed

    def _place(self, g: _Gang, returned: Counter | None = None) -> list[tuple[int, Alloc]] | None:
        """Allocations for the largest size of ``g`` that fits and its quota admits (once ``returned``
        usage per tenant is given back, during a preemption search), or None."""
        req = g.req
        want = list(range(len(req.bundles)))
        for size in range(len(want), req.min_size - 1, -1):
            if not self._quota_admits(g, req.gpu_milli(size), returned):
                continue
            got = self._placer.place(req, want[:size], self._services)
            if got is not None:
                return got
        return None

    def _start(self, g: _Gang, got: list[tuple[int, Alloc]], now: float) -> None:
        self._queue.remove(g.req.name)
        g.state, g.since, g.deadline = GangState.PLACED, now, None
        g.epoch += 1
        g.borrowing = not self.ledger.within_nominal(g.req.tenant, sum(g.req.bundles[b].total_gpu_milli for b, _ in got))
        self._put_in(g, got)
        self._by_priority.setdefault(g.req.priority, set()).add(g.req.name)
        self._log(EventKind.PLACED, g.req.name, now, nodes=self._node_names(got), size=len(got),
                  epoch=g.epoch, borrowing=g.borrowing, waiting_for=sorted(g.blocked_by))

    def _put_in(self, g: _Gang, got: list[tuple[int, Alloc]]) -> None:
        """Record allocations already taken on the state as ``g``'s (ledger and indexes follow)."""
        name = g.req.name
        g.cached_candidate = None
        for b, a in got:
            g.allocs[b] = a
            self._services[f"{name}/{b}"] = (a.node, a.gpus)
            self._on_node[a.node].add(name)
            self.ledger.add(g.req.tenant, g.req.bundles[b].total_gpu_milli)

    def _take_out(self, g: _Gang, bundles: list[int], free: bool) -> None:
        """Drop ``bundles`` from ``g`` (their resources returned to the state when ``free``)."""
        name = g.req.name
        g.cached_candidate = None
        nodes = set()
        for b in bundles:
            a = g.allocs.pop(b)
            nodes.add(a.node)
            if free:
                self.state.free(a)
            del self._services[f"{name}/{b}"]
            self.ledger.add(g.req.tenant, -g.req.bundles[b].total_gpu_milli)
        for n in nodes - {a.node for a in g.allocs.values()}:
            self._on_node[n].discard(name)

    def _free(self, g: _Gang, free: bool = True) -> None:
        """Return everything ``g`` holds (to the state too when ``free``); it leaves the placed set."""
        g.old_nodes = {a.node for a in g.allocs.values()}
        self._take_out(g, sorted(g.allocs), free)
        self._by_priority.get(g.req.priority, set()).discard(g.req.name)

    def _enqueue(self, g: _Gang, now: float) -> None:
        g.state, g.since = GangState.WAITING, now
        g.deadline = None if g.req.timeout_s is None else now + g.req.timeout_s
        if g.deadline is not None:
            heapq.heappush(self._deadlines, (g.deadline, g.epoch, g.req.name))
        self._queue.push(g.req.name, g.req.priority, g.arrival, g.key)
        self._log(EventKind.QUEUED, g.req.name, now, priority=g.req.priority)

    # ---------------------------------------------------------------- preemption
    def _preempt(self, g: _Gang, now: float) -> bool:
        """Evict a minimal set of candidates if that lets ``g`` run; whether it is placed."""
        groups = self._candidate_groups(g)
        if not groups:
            return False
        chosen = choose_victims(
            self.state, groups, lambda returned: self._place(g, returned),
            lambda returned, got: self._quota_admits(g, sum(g.req.bundles[b].total_gpu_milli for b, _ in got), returned),
        )
        if chosen is None:
            return False
        got, victims = chosen
        reclaim = any(self._gangs[v.name].req.tenant != g.req.tenant for v in victims)
        for v in victims:
            self._notice(self._gangs[v.name], g, now, reclaim)
        self._start(g, got, now)
        for v in victims:  # a victim still runs during its grace: nobody else may use what g left of it
            hold = self._gangs[v.name].drain_hold
            if hold is not None:
                hold.top_up(self.state)
        if any(self._gangs[v.name].state is GangState.WAITING for v in victims):
            self._drain(now)  # victims stopped at once may fit elsewhere
        return True

    def _candidate_groups(self, g: _Gang) -> list[list[Candidate]]:
        """Candidates per node, nodes where the least has to go first (only nodes that could host a bundle)."""
        req = g.req
        names = set().union(*(s for p, s in self._by_priority.items() if p < req.priority))
        if self.ledger.enabled:
            names = {n for n in names if self._gangs[n].req.tenant == req.tenant}
            if self.ledger.within_nominal(req.tenant, g.min_milli):
                borrowers = {t for t in self.ledger.quotas if t != req.tenant and self.ledger.borrowing(t)}
                names |= {n for s in self._by_priority.values() for n in s if self._gangs[n].req.tenant in borrowers}
        res = self._reservation
        if res is not None and res.priority >= req.priority:
            names = {n for n in names if not {a.node for a in self._gangs[n].allocs.values()} & res.nodes}
        per_node: dict[int, list[Candidate]] = {}
        for name in names:
            c = self._gangs[name].candidate()
            for n in {a.node for a in c.allocs}:
                per_node.setdefault(n, []).append(c)
        useful = self._could_host(req, per_node)
        useful.sort(key=lambda n: (len(per_node[n]), sum(c.gpu_milli for c in per_node[n]), self.state.tie_rank[n]))
        return [per_node[n] for n in useful]

    def _could_host(self, req: GangRequest, per_node: dict[int, list[Candidate]]) -> list[int]:
        """Nodes of ``per_node`` where some bundle of ``req`` could fit once their candidates left (per GPU)."""
        if not per_node:
            return []
        st = self.state
        cands = {c.name: c for cs in per_node.values() for c in cs}.values()
        held = AllocSums(st, [a for c in cands for a in c.allocs])  # every one lies on a node of per_node
        nodes = np.fromiter(per_node, dtype=np.int64, count=len(per_node))
        cpu, mem = (st.cpu_free + held.cpu)[nodes], (st.mem_free + held.mem)[nodes]
        gpu = (st.gpu_free + held.gpu)[nodes]
        ok = np.zeros(len(nodes), dtype=bool)
        for b in set(req.bundles):
            fit = (cpu >= b.cpu_milli) & (mem >= b.memory_mib)
            if b.num_gpu:
                fit &= (st.model_mask(b.gpu_models)[nodes] & (gpu >= b.gpu_milli)).sum(axis=1) >= b.num_gpu
            ok |= fit
        return [int(n) for n in nodes[ok]]

    def _notice(self, v: _Gang, by: _Gang, now: float, reclaim: bool) -> None:
        """Tell victim ``v`` (whose resources are already free in the state) to stop for ``by``."""
        why = f"preempted by {by.req.name!r} (priority {by.req.priority}{', reclaiming quota' if reclaim else ''})"
        started = not v.blocked_by
        held = sorted(v.allocs.items())
        self._free(v, free=False)
        for w in self._clear_blocked(v):  # what v waited for, its preemptor now waits for
            by.blocked_by.add(w)
            self._gangs[w].blocking.add(by.req.name)
        v.preemptions += 1
        v.notice = why
        if v.on_preempt is not None:
            v.on_preempt(v.req.name, why)
        grace = v.req.grace_s if started else 0.0
        self._log(EventKind.PREEMPT_NOTICE, v.req.name, now, by=by.req.name, priority=v.req.priority,
                  by_priority=by.req.priority, reason=why, grace_s=grace, deadline=now + grace)
        if grace > 0:
            v.state, v.since, v.deadline = GangState.DRAINING, now, now + grace
            heapq.heappush(self._deadlines, (v.deadline, v.epoch, v.req.name))
            v.blocking.add(by.req.name)
            by.blocked_by.add(v.req.name)
            v.drain_hold = Reservation(v.req.name, v.req.priority, held, set())  # filled once ``by`` is placed
        else:
            self._log(EventKind.PREEMPTED, v.req.name, now, stop="immediate")
            self._enqueue(v, now)

    def _clear_blocked(self, g: _Gang) -> set[str]:
        """Forget the victims ``g`` waited for (returns them)."""
        for v in g.blocked_by:
            self._gangs[v].blocking.discard(g.req.name)
        out, g.blocked_by = g.blocked_by, set()
        return out

    def _unblock(self, v: _Gang, now: float) -> None:
        """Draining ``v`` has stopped: what it held goes back, the preemptors waiting for it may become ready."""
        v.deadline = None
        if v.drain_hold is not None:
            v.drain_hold.drop(self.state)
            v.drain_hold = None
        for name in sorted(v.blocking):
            p = self._gangs.get(name)
            if p is None:
                continue
            p.blocked_by.discard(v.req.name)
            if not p.blocked_by and p.state is GangState.PLACED:
                self._log(EventKind.READY, name, now)
        v.blocking.clear()

    # ---------------------------------------------------------------- queue and reservation
    def _drain(self, now: float) -> None:
        """Serve the queue in order (each shape retried only when nodes it could use grew)."""
        if self._draining:
            self._requeued = True  # a victim queued during the pass: one more pass
            return
        self._draining = True
        try:
            for _ in range(_MAX_PASSES):
                self._requeued = False
                self._top_up(now)
                self._serve_queue(now)
                if not self._update_reservation(now) and not self._requeued:
                    break
        finally:
            self._draining = False

    def _serve_queue(self, now: float) -> None:
        """One pass over the queue in order; a shape that cannot fit is skipped for the rest of it."""
        skip: set[int] = set()
        for name, key in self._queue.with_keys():
            if key in skip:
                continue
            g = self._gangs.get(name)
            if g is None or g.state is not GangState.WAITING or self._missing_services(g):
                continue
            if not self._queue.worth_trying(key, g.req.bundles, self.state):
                skip.add(key)
            elif self._holder(name):
                self._place_holder_elsewhere(g, now)
            elif not self._admit(g, now):
                self._queue.mark_failed(key, self.state.clock)
                skip.add(key)

    def _holder(self, name: str) -> bool:
        return self._reservation is not None and self._reservation.gang == name

    def _place_holder_elsewhere(self, g: _Gang, now: float) -> None:
        """The reserved gang fits somewhere now, holds aside: it runs there and the holds go back."""
        got = self._place(g)
        if got is not None:
            self._drop_reservation(now)
            self._start(g, got, now)

    def _top_up(self, now: float) -> None:
        """Give returned resources to the reservation first; place its gang once they cover it."""
        res = self._reservation
        if res is None or not res.top_up(self.state):
            return
        g = self._gangs[res.gang]
        res.drop(self.state)
        self._reservation = None
        for _, a in res.targets:
            self.state.allocate(a)
        self._start(g, list(res.targets), now)

    def _update_reservation(self, now: float) -> bool:
        """Give the reservation to the first blocked gang that fits the empty cluster; whether resources
        were returned."""
        if not self.reserve:
            return False
        while True:  # each turn returns or marks one more gang unreservable
            head = self._reservation_head()
            res = self._reservation
            if res is not None and res.gang == head:
                return False
            targets = None if head is None else reservation_targets(self.state, self._placer, self._gangs[head].req,
                                                                     self._services)
            if head is not None and targets is None:
                self._unreservable.add(head)  # fits not even the empty cluster: skipped until nodes change
                continue
            if res is not None:
                self._drop_reservation(now)
            if head is not None:
                self._reserve(head, targets, now)
            return res is not None

    def _yield_reservation_without_quota(self, now: float) -> None:
        """A gang served before the reserved one took the quota it needs: the reservation moves on."""
        res = self._reservation
        if res is not None and not self.ledger.admissible(self._gangs[res.gang].req.tenant, self._gangs[res.gang].min_milli):
            self._drain(now)

    def _served_before_holder(self, g: _Gang) -> bool:
        """Whether ``g`` is served before the reservation's gang (higher priority, or equal and earlier)."""
        h = self._gangs[self._reservation.gang]
        return (-g.req.priority, g.arrival) < (-h.req.priority, h.arrival)

    def _quota_admits(self, g: _Gang, milli: int, returned: Counter | None = None) -> bool:
        """Whether ``g``'s quota admits ``milli`` more (once ``returned`` went back), sparing the reserved gang's."""
        return self.ledger.admissible(g.req.tenant, milli, returned) and self._spares_reserved_quota(g, milli, returned)

    def _spares_reserved_quota(self, g: _Gang, milli: int, returned: Counter | None = None) -> bool:
        """Whether ``g`` taking ``milli`` milli-GPU (once ``returned`` usage per tenant went back) leaves the
        reservation's gang admitted by its quota; gangs served before it are not held back. Without
        this, gangs served after a reserved gang could starve it of quota instead of resources."""
        res = self._reservation
        if res is None or not self.ledger.enabled or res.gang == g.req.name or self._served_before_holder(g):
            return True
        h = self._gangs[res.gang]
        freed = Counter(returned or {})
        freed[g.req.tenant] -= milli
        return self.ledger.admissible(h.req.tenant, h.min_milli, freed)

    def _reservation_head(self) -> str | None:
        """The first waiting gang that could use a reservation: its services are placed, its quota admits
        it, and it fits the empty cluster (as far as known)."""
        admissible: dict[tuple[str, int], bool] = {}  # the quota verdict depends on (tenant, milli) alone
        for name in self._queue.iter_names():
            g = self._gangs[name]
            if name in self._unreservable or self._missing_services(g):
                continue
            key = (g.req.tenant, g.min_milli)
            if key not in admissible:
                admissible[key] = self.ledger.admissible(*key)
            if admissible[key]:
                return name
        return None

    def _reserve(self, head: str, targets: list[tuple[int, Alloc]], now: float) -> None:
        """Reserve ``targets`` for waiting gang ``head``; its blockers are the gangs that run or drain there."""
        nodes = {a.node for _, a in targets}
        blockers = self._occupants(nodes)
        self._reservation = Reservation(head, self._gangs[head].req.priority, targets, blockers)
        self._log(EventKind.RESERVED, head, now, nodes=sorted(self.cluster.nodes[n].name for n in nodes),
                  blockers=sorted(blockers))
        self._top_up(now)

    def _drop_reservation(self, now: float) -> None:
        res = self._reservation
        res.drop(self.state)
        self._reservation = None
        self._log(EventKind.UNRESERVED, res.gang, now)

    # ---------------------------------------------------------------- helpers
    def _now(self, now: float | None) -> float:
        return self.clock() if now is None else float(now)

    def _gang(self, name: str) -> _Gang:
        if name not in self._gangs:
            raise KeyError(f"unknown gang {name!r}; known gangs: {sorted(self._gangs)[:10]}")
        return self._gangs[name]

    def _node(self, node_name: str) -> int:
        if node_name not in self.state.node_index:
            raise KeyError(f"unknown node {node_name!r}; nodes are {list(self.state.node_index)[:5]}...")
        return self.state.node_index[node_name]

    def _nodes_changed(self) -> None:
        self._valid.clear()
        self._unreservable.clear()

    def _missing_services(self, g: _Gang) -> list[str]:
        """Services named by ``g``'s constraints that are not placed (it must wait for them)."""
        names = []
        for c in g.req.constraints:
            if isinstance(c, SameGPU | SameNode) and c.service:
                names.append(c.service)
            elif isinstance(c, DifferentNodes):
                names += list(c.services)
        return [s for s in names if s not in self._services]

    def _placement(self, g: _Gang) -> Placement:
        nodes = self.cluster.nodes
        return Placement(
            g.req.name,
            tuple(Assignment(b, nodes[a.node].name, a.gpus, a.gpu_milli) for b, a in sorted(g.allocs.items())),
            g.epoch,
        )

    def _node_names(self, got) -> list[str]:
        return sorted({self.cluster.nodes[a.node].name for _, a in got})

    def _most_free(self, b: Bundle) -> str:
        st = self.state
        live = st.alive
        usable = (st.model_mask(b.gpu_models) & (st.gpu_free >= max(b.gpu_milli, 1))).sum(axis=1)
        return (
            f"most free on a live node: cpu_milli={int(st.cpu_free[live].max(initial=0))}, "
            f"memory_mib={int(st.mem_free[live].max(initial=0))}, "
            f"GPUs with {b.gpu_milli} milli free={int(usable[live].max(initial=0))}"
        )

    def _log(self, kind: EventKind, gang: str, now: float, **detail) -> None:
        self.events.append(Event(next(self._event_seq), kind, gang, now, detail))
        if self.max_events is not None and len(self.events) > 2 * self.max_events:
            del self.events[: len(self.events) - self.max_events]


def _describe(b: Bundle) -> str:
    gpu = f", {b.gpus} GPU(s)" if b.gpus else (f", {b.gpu_fraction} milli-GPU" if b.gpu_fraction else "")
    models = f" of {sorted(b.gpu_models)}" if b.gpu_models else ""
    mem = f", {b.gpu_memory_mib} MiB GPU memory" if b.gpu_memory_mib else ""
    return f"cpu_milli={b.cpu_milli}, memory_mib={b.memory_mib}{gpu}{models}{mem}"

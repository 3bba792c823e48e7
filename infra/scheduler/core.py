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

import time
from collections.abc import Callable

import numpy as np

from infra.scheduler import node_scoring
from infra.scheduler.admission import Admission
from infra.scheduler.events import Event, EventLog
from infra.scheduler.frag import TypicalPods
from infra.scheduler.gang_book import GangBook, GangState, PreemptCallback
from infra.scheduler.gang_placer import GangPlacer, Placement
from infra.scheduler.node_events import NodeEvents
from infra.scheduler.placing import Placing
from infra.scheduler.preemptor import Preemptor
from infra.scheduler.quota import Quota, QuotaLedger
from infra.scheduler.requests import GangRequest
from infra.scheduler.reservation import Reservation
from infra.scheduler.reservation_keeper import ReservationKeeper
from infra.scheduler.resources import Alloc, Cluster, ClusterState, Node


class Scheduler:
    """Places gangs on a cluster; see the module docstring.

    The work is shared by collaborators over one ``GangBook`` (who holds what): ``Admission``
    (the queue, the gang verbs), ``Placing`` (sizes that fit and quota admits, resizes),
    ``Preemptor`` (victims, notices, who waits for whom), ``ReservationKeeper`` (the reservation)
    and ``NodeEvents`` (nodes lost, restored, added).

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
        state = ClusterState(cluster)
        rng = np.random.default_rng(0 if seed is None else seed)  # the random policy is seeded either way
        if seed is not None:
            state.tie_rank = rng.permutation(state.num_nodes)
        self.policy = node_scoring.load(policy, typical=typical)
        self.ledger = QuotaLedger(quotas)
        self.clock = clock
        self._log = EventLog(max_events)
        self._book = GangBook(state, self.ledger, self._log)
        placer = GangPlacer(state, self.policy, rng)
        self._keeper = ReservationKeeper(self._book, placer, reserve)
        self._placing = Placing(self._book, placer, self._keeper)
        self._preemptor = Preemptor(self._book, self._placing, self._keeper)
        self._admission = Admission(self._book, self._placing, self._keeper, self._preemptor)
        self._nodes = NodeEvents(self._book, placer, self._admission)

    # ---------------------------------------------------------------- queries
    @property
    def state(self) -> ClusterState:
        """The cluster's free resources in the plan (replaced when a node joins)."""
        return self._book.state

    @property
    def cluster(self) -> Cluster:
        """The nodes (grown by ``add_node``)."""
        return self._book.state.cluster

    @property
    def events(self) -> list[Event]:
        """The event log, oldest first (``max_events`` of them kept)."""
        return self._log.events

    @property
    def reserve(self) -> bool:
        """Whether the first blocked gang gets a reservation."""
        return self._keeper.enabled

    @property
    def queue(self) -> list[str]:
        """Names of waiting gangs in the order they are served."""
        return self._book.queue.names()

    @property
    def placements(self) -> dict[str, Placement]:
        """Gangs that hold resources in the plan (ready or waiting for victims), by name."""
        return {n: self._book.placement(g) for n, g in self._book.gangs.items() if g.state is GangState.PLACED}

    @property
    def reservation(self) -> Reservation | None:
        """The current reservation, if any."""
        return self._keeper.reservation

    def gangs(self) -> list[str]:
        """Every known gang (waiting, placed or draining)."""
        return list(self._book.gangs)

    def holds(self) -> list[Alloc]:
        """Resources held without a placement: the reservation's, and what draining gangs still run on."""
        res = self._keeper.reservation
        out = list(res.holds) if res is not None else []
        for g in self._book.gangs.values():
            if g.drain_hold is not None:
                out += g.drain_hold.holds
        return out

    def placement(self, name: str) -> Placement | None:
        """Placement of gang ``name``, or None unless it is placed (KeyError if unknown)."""
        g = self._book.gang(name)
        return self._book.placement(g) if g.state is GangState.PLACED else None

    def gang_state(self, name: str) -> GangState:
        """Where gang ``name`` stands (KeyError if unknown)."""
        return self._book.gang(name).state

    def ready(self, name: str) -> bool:
        """Whether ``name`` is placed and no victim of it is still draining (its actors may start)."""
        g = self._book.gang(name)
        return g.state is GangState.PLACED and not g.blocked_by

    def blocked_by(self, name: str) -> set[str]:
        """Draining victims a placed gang waits for."""
        return set(self._book.gang(name).blocked_by)

    def deadline(self, name: str) -> float | None:
        """Forced-stop time of a draining gang, timeout of a waiting one (None: none)."""
        return self._book.gang(name).deadline

    def borrowing(self, name: str) -> bool:
        """Whether the placed gang was admitted on borrowed quota."""
        return self._book.gang(name).borrowing

    def gangs_on(self, node_name: str) -> list[str]:
        """Placed gangs with a bundle on ``node_name``."""
        return sorted(self._book.on_node[self._book.node(node_name)])

    def occupants(self, node_name: str) -> set[str]:
        """Gangs that use resources of ``node_name``: placed there, or draining there during their grace."""
        return self._book.occupants({self._book.node(node_name)})

    def preemptions(self, name: str) -> int:
        """How many times the gang was told to stop."""
        return self._book.gang(name).preemptions

    def notice(self, name: str) -> str:
        """Why the gang was last told to stop ("" if never)."""
        return self._book.gang(name).notice

    def next_deadline(self) -> float | None:
        """The earliest forced stop or timeout to come (``tick`` has work from then on)."""
        return self._book.deadlines[0][0] if self._book.deadlines else None

    def events_since(self, seq: int) -> list[Event]:
        """Events with a sequence number above ``seq`` (those still kept)."""
        return self._log.since(seq)

    def request(self, name: str) -> GangRequest:
        """The request of gang ``name`` (KeyError if unknown)."""
        return self._book.gang(name).req

    def services(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        """Placed services ``"<gang>/<bundle>"`` -> (node index, GPU indices)."""
        return dict(self._book.services)

    def why_waiting(self, name: str) -> str:
        """Why a waiting gang is not placed now (quota, missing services, resources, reservation)."""
        return self._admission.why_waiting(name)

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
        return self._admission.submit(req, on_preempt, self._now(now))

    def release(self, name: str, now: float | None = None, reason: str = "released") -> None:
        """Stop gang ``name`` (in any state), return what it holds, serve the queue."""
        self._admission.release(name, self._now(now), reason)

    def stopped(self, name: str, now: float | None = None) -> None:
        """A draining gang reports that it has stopped (checkpointed); it waits in the queue again."""
        self._admission.stopped(name, self._now(now))

    def tick(self, now: float | None = None) -> list[str]:
        """Stop draining gangs whose grace is over, fail waiting gangs past their timeout; their names."""
        return self._admission.tick(self._now(now))

    def resize(self, name: str, num_bundles: int, now: float | None = None) -> Placement:
        """Grow or shrink a placed elastic gang to ``num_bundles`` (all added bundles or none).

        Raises:
            RequestError: not elastic, not placed, or size outside ``[min_bundles, len(bundles)]``.
            RuntimeError: growing does not fit now, or its quota does not admit it (it keeps its size).
        """
        now = self._now(now)
        g = self._book.gang(name)
        change = self._placing.resize(g, num_bundles, now)
        if change < 0:
            self._admission.drain(now)
        elif change > 0:
            self._admission.yield_reservation_without_quota(now)
        return self._book.placement(g)

    def remove_node(self, node_name: str, now: float | None = None) -> list[str]:
        """A node is lost: its gangs are evicted and requeued (served at once). Returns their names."""
        return self._nodes.remove_node(node_name, self._now(now))

    def restore_node(self, node_name: str, now: float | None = None) -> None:
        """A lost node is back (empty); the queue is served."""
        self._nodes.restore_node(node_name, self._now(now))

    def add_node(self, node: Node, now: float | None = None) -> None:
        """A node joins the cluster (a known lost node is restored); the queue is served."""
        self._nodes.add_node(node, self._now(now))

    def _now(self, now: float | None) -> float:
        return self.clock() if now is None else float(now)

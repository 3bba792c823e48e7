"""Who holds the reservation, and what it spares: the first blocked gang of the queue collects resources.

``ReservationKeeper`` gives the reservation (``infra.scheduler.reservation``) to the first waiting
gang that could use it, tops it up with what comes back, starts its gang once the holds cover it,
and answers whether a gang served after the holder would take quota the holder needs.
"""

from __future__ import annotations

from collections import Counter

from infra.scheduler.events import EventKind
from infra.scheduler.gang_book import Gang, GangBook
from infra.scheduler.gang_placer import GangPlacer
from infra.scheduler.reservation import Reservation, reservation_targets
from infra.scheduler.resources import Alloc


class ReservationKeeper:
    """The reservation of a scheduler.

    Args:
        book: the gangs and the cluster state.
        placer: finds the reservation's targets.
        enabled: whether the first blocked gang gets a reservation at all.
    """

    def __init__(self, book: GangBook, placer: GangPlacer, enabled: bool = True) -> None:
        self.book = book
        self.placer = placer
        self.enabled = enabled
        self.reservation: Reservation | None = None
        self.unreservable: set[str] = set()
        """Waiting gangs that fit not even the empty cluster (no reservation until nodes change)."""

    def holder(self, name: str) -> bool:
        """Whether gang ``name`` holds the reservation."""
        return self.reservation is not None and self.reservation.gang == name

    def top_up(self, now: float) -> None:
        """Give returned resources to the reservation first; place its gang once they cover it."""
        res = self.reservation
        if res is None or not res.top_up(self.book.state):
            return
        g = self.book.gangs[res.gang]
        res.drop(self.book.state)
        self.reservation = None
        for _, a in res.targets:
            self.book.state.allocate(a)
        self.book.start(g, list(res.targets), now)

    def update(self, now: float) -> bool:
        """Give the reservation to the first blocked gang that fits the empty cluster; whether resources
        were returned."""
        if not self.enabled:
            return False
        while True:  # each turn returns or marks one more gang unreservable
            head = self._head()
            res = self.reservation
            if res is not None and res.gang == head:
                return False
            targets = None if head is None else reservation_targets(self.book.state, self.placer,
                                                                     self.book.gangs[head].req, self.book.services)
            if head is not None and targets is None:
                self.unreservable.add(head)  # fits not even the empty cluster: skipped until nodes change
                continue
            if res is not None:
                self.drop(now)
            if head is not None:
                self._reserve(head, targets, now)
            return res is not None

    def served_before_holder(self, g: Gang) -> bool:
        """Whether ``g`` is served before the reservation's gang (higher priority, or equal and earlier)."""
        h = self.book.gangs[self.reservation.gang]
        return (-g.req.priority, g.arrival) < (-h.req.priority, h.arrival)

    def spares_quota(self, g: Gang, milli: int, returned: Counter | None = None) -> bool:
        """Whether ``g`` taking ``milli`` milli-GPU (once ``returned`` usage per tenant went back) leaves the
        reservation's gang admitted by its quota; gangs served before it are not held back. Without
        this, gangs served after a reserved gang could starve it of quota instead of resources."""
        res, ledger = self.reservation, self.book.ledger
        if res is None or not ledger.enabled or res.gang == g.req.name or self.served_before_holder(g):
            return True
        h = self.book.gangs[res.gang]
        freed = Counter(returned or {})
        freed[g.req.tenant] -= milli
        return ledger.admissible(h.req.tenant, h.min_milli, freed)

    def holder_lacks_quota(self) -> bool:
        """Whether a gang served before the reserved one took the quota the reserved one needs."""
        res = self.reservation
        if res is None:
            return False
        h = self.book.gangs[res.gang]
        return not self.book.ledger.admissible(h.req.tenant, h.min_milli)

    def _head(self) -> str | None:
        """The first waiting gang that could use a reservation: its services are placed, its quota admits
        it, and it fits the empty cluster (as far as known)."""
        admissible: dict[tuple[str, int], bool] = {}  # the quota verdict depends on (tenant, milli) alone
        for name in self.book.queue.iter_names():
            g = self.book.gangs[name]
            if name in self.unreservable or self.book.missing_services(g):
                continue
            key = (g.req.tenant, g.min_milli)
            if key not in admissible:
                admissible[key] = self.book.ledger.admissible(*key)
            if admissible[key]:
                return name
        return None

    def _reserve(self, head: str, targets: list[tuple[int, Alloc]], now: float) -> None:
        """Reserve ``targets`` for waiting gang ``head``; its blockers are the gangs that run or drain there."""
        nodes = {a.node for _, a in targets}
        blockers = self.book.occupants(nodes)
        self.reservation = Reservation(head, self.book.gangs[head].req.priority, targets, blockers)
        self.book.log.add(EventKind.RESERVED, head, now, nodes=sorted(self.book.state.cluster.nodes[n].name for n in nodes),
                          blockers=sorted(blockers))
        self.top_up(now)

    def drop(self, now: float) -> None:
        """Give back what the reservation holds; it is gone."""
        res = self.reservation
        res.drop(self.book.state)
        self.reservation = None
        self.book.log.add(EventKind.UNRESERVED, res.gang, now)

"""The queue and admission: a gang is placed, preempts, or waits, and the queue is served as resources return.

``Admission`` carries the gang verbs of ``infra.scheduler.core`` (submit, release, stopped, tick):
a new or waiting gang is placed at once when it fits and quota admits it, else it preempts
(``infra.scheduler.preemptor``), else it waits. Whenever resources come back the reservation is
topped up first, then the queue is served in order (each shape retried only when nodes it could
use grew, ``infra.scheduler.wait_queue``), then the reservation moves to the first blocked gang.
"""

from __future__ import annotations

import heapq

import numpy as np

from infra.scheduler.events import EventKind
from infra.scheduler.gang_book import Gang, GangBook, GangState, PreemptCallback
from infra.scheduler.gang_placer import Placement
from infra.scheduler.placing import Placing
from infra.scheduler.preemptor import Preemptor
from infra.scheduler.requests import Bundle, GangRequest, RequestError, validate
from infra.scheduler.reservation import Reservation
from infra.scheduler.reservation_keeper import ReservationKeeper
from infra.scheduler.wait_queue import fits_somewhere

_MAX_PASSES = 50
"""Bound on queue passes per drain (a pass repeats only when victims were requeued meanwhile)."""


class Admission:
    """Admits gangs and serves the queue; see the module docstring.

    Args:
        book: the gangs, the cluster state, the quota ledger and the wait queue.
        placing: finds allocations for a gang.
        keeper: the reservation.
        preemptor: evicts lower-priority gangs for a gang that does not fit.
    """

    def __init__(self, book: GangBook, placing: Placing, keeper: ReservationKeeper, preemptor: Preemptor) -> None:
        self.book = book
        self.placing = placing
        self.keeper = keeper
        self.preemptor = preemptor
        self._draining = False
        self._requeued = False

    # ---------------------------------------------------------------- verbs
    def submit(self, req: GangRequest, on_preempt: PreemptCallback | None, now: float) -> Placement | None:
        """``Scheduler.submit``: place ``req`` now (preempting if needed) or queue it."""
        book = self.book
        if req.name in book.gangs:
            raise RequestError(f"gang name {req.name!r} is already in use; release it first or pick another name.")
        book.ledger.check_tenant(req.tenant, req.name)
        validate(req, book.state, book.services, book.valid)
        g = Gang(req, on_preempt, next(book.arrivals), since=now, key=book.queue.shape_id(req.shape_key))
        book.gangs[req.name] = g
        book.log.add(EventKind.SUBMITTED, req.name, now, priority=req.priority, tenant=req.tenant,
                     bundles=len(req.bundles))
        if not book.missing_services(g) and self._admit(g, now):
            self.yield_reservation_without_quota(now)
            return book.placement(g)
        book.queue.mark_failed(g.key, book.state.clock)
        book.enqueue(g, now)
        res = self.keeper.reservation
        if res is None or book.queue.sorts_before(req.name, res.gang):
            self.keeper.update(now)
        return book.placement(g) if g.state is GangState.PLACED else None

    def release(self, name: str, now: float, reason: str = "released") -> None:
        """``Scheduler.release``: stop gang ``name`` (in any state), return what it holds, serve the queue."""
        book = self.book
        g = book.gang(name)
        if g.state is GangState.DRAINING:
            self.preemptor.unblock(g, now)
        elif g.state is GangState.PLACED:
            book.free(g)
            self.preemptor.clear_blocked(g)
        if self.keeper.holder(name):
            self.keeper.drop(now)
        book.queue.remove(name)
        self.keeper.unreservable.discard(name)
        del book.gangs[name]
        book.log.add(EventKind.RELEASED, name, now, reason=reason)
        self.drain(now)

    def stopped(self, name: str, now: float) -> None:
        """``Scheduler.stopped``: a draining gang has stopped (checkpointed); it waits in the queue again."""
        g = self.book.gang(name)
        if g.state is not GangState.DRAINING:
            raise RequestError(f"gang {name!r} is {g.state.value}, not draining: only a preempted gang reports stopped.")
        self.book.log.add(EventKind.PREEMPTED, name, now, stop="acknowledged")
        self.preemptor.unblock(g, now)
        self.book.enqueue(g, now)
        self.drain(now)

    def tick(self, now: float) -> list[str]:
        """``Scheduler.tick``: stop draining gangs whose grace is over, fail waiting gangs past their timeout."""
        book = self.book
        done = []
        while book.deadlines and book.deadlines[0][0] <= now:
            _, epoch, name = heapq.heappop(book.deadlines)
            g = book.gangs.get(name)
            if g is None or g.deadline is None or g.epoch != epoch or g.deadline > now:
                continue
            if g.state is GangState.DRAINING:
                book.log.add(EventKind.FORCED_STOP, name, now, grace_s=g.req.grace_s)
                self.preemptor.unblock(g, now)
                book.enqueue(g, now)
            else:
                reason = self.why_waiting(name)
                book.log.add(EventKind.TIMED_OUT, name, now, waited_s=now - g.since, reason=reason)
                self.release(name, now, reason=f"timed out after {g.req.timeout_s} s: {reason}")
            done.append(name)
        if done:
            self.drain(now)
        return done

    def why_waiting(self, name: str) -> str:
        """Why a waiting gang is not placed now (quota, missing services, resources, reservation)."""
        book = self.book
        g = book.gang(name)
        if g.state is not GangState.WAITING:
            return f"gang {name!r} is {g.state.value}"
        missing = book.missing_services(g)
        if missing:
            return f"waits for services {missing} to be placed"
        milli = g.min_milli
        if not book.ledger.admissible(g.req.tenant, milli):
            return book.ledger.why_not(g.req.tenant, milli)
        res = self.keeper.reservation
        if not self.keeper.spares_quota(g, milli):
            return f"its GPUs would take quota that gang {res.gang!r}, which holds the reservation, needs"
        alive = np.flatnonzero(book.state.alive)
        for i, b in enumerate(g.req.bundles):
            if not fits_somewhere(b, book.state, alive):
                return f"bundle {i} ({_describe(b)}) fits no live node now; {self._most_free(b)}"
        held = f"; gang {res.gang!r} holds a reservation" if res is not None and res.gang != name else ""
        return f"each bundle fits some node, but not the whole gang with its constraints{held}"

    # ---------------------------------------------------------------- admitting
    def _admit(self, g: Gang, now: float) -> bool:
        """Place ``g`` now, or preempt for it; whether it is placed."""
        got = self.placing.place(g)
        res = self.keeper.reservation
        if got is None and res is not None and res.priority < g.req.priority:
            return self._admit_over(g, res, now)
        if got is not None:
            self.book.start(g, got, now)
            return True
        return self._preempt(g, now)

    def _admit_over(self, g: Gang, res: Reservation, now: float) -> bool:
        """``g`` outranks the reservation's gang and fits nowhere else: try it (placing, then preempting)
        with what the reservation holds given back. The reservation keeps its targets and takes back what
        ``g`` left of them; ``g`` joins its blockers when it runs on the target nodes."""
        res.drop(self.book.state)
        got = self.placing.place(g)
        if got is not None:
            self.book.start(g, got, now)
        placed = got is not None or self._preempt(g, now)
        if placed and {a.node for a in g.allocs.values()} & res.nodes:
            res.blockers.add(g.req.name)
        if self.keeper.reservation is res:  # a drain during the preemption may have moved it on already
            self.keeper.top_up(now)
        return placed

    def _preempt(self, g: Gang, now: float) -> bool:
        placed, requeued = self.preemptor.preempt(g, now)
        if requeued:
            self.drain(now)  # victims stopped at once may fit elsewhere
        return placed

    # ---------------------------------------------------------------- serving the queue
    def drain(self, now: float) -> None:
        """Serve the queue in order (each shape retried only when nodes it could use grew)."""
        if self._draining:
            self._requeued = True  # a victim queued during the pass: one more pass
            return
        self._draining = True
        try:
            for _ in range(_MAX_PASSES):
                self._requeued = False
                self.keeper.top_up(now)
                self._serve_queue(now)
                if not self.keeper.update(now) and not self._requeued:
                    break
        finally:
            self._draining = False

    def _serve_queue(self, now: float) -> None:
        """One pass over the queue in order; a shape that cannot fit is skipped for the rest of it."""
        book = self.book
        skip: set[int] = set()
        for name, key in book.queue.with_keys():
            if key in skip:
                continue
            g = book.gangs.get(name)
            if g is None or g.state is not GangState.WAITING or book.missing_services(g):
                continue
            if not book.queue.worth_trying(key, g.req.bundles, book.state):
                skip.add(key)
            elif self.keeper.holder(name):
                self._place_holder_elsewhere(g, now)
            elif not self._admit(g, now):
                book.queue.mark_failed(key, book.state.clock)
                skip.add(key)

    def _place_holder_elsewhere(self, g: Gang, now: float) -> None:
        """The reserved gang fits somewhere now, holds aside: it runs there and the holds go back."""
        got = self.placing.place(g)
        if got is not None:
            self.keeper.drop(now)
            self.book.start(g, got, now)

    def yield_reservation_without_quota(self, now: float) -> None:
        """A gang served before the reserved one took the quota it needs: the reservation moves on."""
        if self.keeper.holder_lacks_quota():
            self.drain(now)

    def _most_free(self, b: Bundle) -> str:
        st = self.book.state
        live = st.alive
        usable = (st.model_mask(b.gpu_models) & (st.gpu_free >= max(b.gpu_milli, 1))).sum(axis=1)
        return (
            f"most free on a live node: cpu_milli={int(st.cpu_free[live].max(initial=0))}, "
            f"memory_mib={int(st.mem_free[live].max(initial=0))}, "
            f"GPUs with {b.gpu_milli} milli free={int(usable[live].max(initial=0))}"
        )


def _describe(b: Bundle) -> str:
    gpu = f", {b.gpus} GPU(s)" if b.gpus else (f", {b.gpu_fraction} milli-GPU" if b.gpu_fraction else "")
    models = f" of {sorted(b.gpu_models)}" if b.gpu_models else ""
    mem = f", {b.gpu_memory_mib} MiB GPU memory" if b.gpu_memory_mib else ""
    return f"cpu_milli={b.cpu_milli}, memory_mib={b.memory_mib}{gpu}{models}{mem}"

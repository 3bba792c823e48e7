"""Preemption as a contract: who may be evicted for a gang, the notice, the grace, and who waits for whom.

``Preemptor`` picks the candidates (``infra.scheduler.preemption`` chooses a minimal victim set
among them), tells each victim to stop, and keeps the blocking relation: a preemptor is ready once
no victim of it is still draining. A draining victim's resources already belong to the plan's
preemptor; what the preemptor did not take stays held for the victim until it stops.
"""

from __future__ import annotations

import numpy as np

from infra.scheduler.events import EventKind
from infra.scheduler.gang_book import Gang, GangBook, GangState
from infra.scheduler.placing import Placing
from infra.scheduler.preemption import AllocSums, Candidate, choose_victims
from infra.scheduler.requests import GangRequest
from infra.scheduler.reservation import Reservation
from infra.scheduler.reservation_keeper import ReservationKeeper


class Preemptor:
    """Evicts gangs for higher-priority ones; see the module docstring.

    Args:
        book: the gangs, the cluster state and the quota ledger.
        placing: places the preemptor with the candidates' resources given back.
        keeper: the reservation, whose target nodes later gangs may not preempt on.
    """

    def __init__(self, book: GangBook, placing: Placing, keeper: ReservationKeeper) -> None:
        self.book = book
        self.placing = placing
        self.keeper = keeper

    def preempt(self, g: Gang, now: float) -> tuple[bool, bool]:
        """Evict a minimal set of candidates if that lets ``g`` run: (whether it is placed, whether a
        victim stopped at once and waits again)."""
        groups = self._candidate_groups(g)
        if not groups:
            return False, False
        chosen = choose_victims(
            self.book.state, groups, lambda returned: self.placing.place(g, returned),
            lambda returned, got: self.placing.quota_admits(g, sum(g.req.bundles[b].total_gpu_milli for b, _ in got),
                                                            returned),
        )
        if chosen is None:
            return False, False
        got, victims = chosen
        gangs = self.book.gangs
        reclaim = any(gangs[v.name].req.tenant != g.req.tenant for v in victims)
        for v in victims:
            self._notice(gangs[v.name], g, now, reclaim)
        self.book.start(g, got, now)
        for v in victims:  # a victim still runs during its grace: nobody else may use what g left of it
            hold = gangs[v.name].drain_hold
            if hold is not None:
                hold.top_up(self.book.state)
        return True, any(gangs[v.name].state is GangState.WAITING for v in victims)

    def _candidate_groups(self, g: Gang) -> list[list[Candidate]]:
        """Candidates per node, nodes where the least has to go first (only nodes that could host a bundle)."""
        req, gangs, ledger = g.req, self.book.gangs, self.book.ledger
        by_priority = self.book.by_priority
        names = set().union(*(s for p, s in by_priority.items() if p < req.priority))
        if ledger.enabled:
            names = {n for n in names if gangs[n].req.tenant == req.tenant}
            if ledger.within_nominal(req.tenant, g.min_milli):
                borrowers = {t for t in ledger.quotas if t != req.tenant and ledger.borrowing(t)}
                names |= {n for s in by_priority.values() for n in s if gangs[n].req.tenant in borrowers}
        res = self.keeper.reservation
        if res is not None and res.priority >= req.priority:
            names = {n for n in names if not {a.node for a in gangs[n].allocs.values()} & res.nodes}
        per_node: dict[int, list[Candidate]] = {}
        for name in names:
            c = gangs[name].candidate()
            for n in {a.node for a in c.allocs}:
                per_node.setdefault(n, []).append(c)
        useful = self._could_host(req, per_node)
        tie_rank = self.book.state.tie_rank
        useful.sort(key=lambda n: (len(per_node[n]), sum(c.gpu_milli for c in per_node[n]), tie_rank[n]))
        return [per_node[n] for n in useful]

    def _could_host(self, req: GangRequest, per_node: dict[int, list[Candidate]]) -> list[int]:
        """Nodes of ``per_node`` where some bundle of ``req`` could fit once their candidates left (per GPU)."""
        if not per_node:
            return []
        st = self.book.state
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

    def _notice(self, v: Gang, by: Gang, now: float, reclaim: bool) -> None:
        """Tell victim ``v`` (whose resources are already free in the state) to stop for ``by``."""
        why = f"preempted by {by.req.name!r} (priority {by.req.priority}{', reclaiming quota' if reclaim else ''})"
        started = not v.blocked_by
        held = sorted(v.allocs.items())
        self.book.free(v, free=False)
        for w in self.clear_blocked(v):  # what v waited for, its preemptor now waits for
            by.blocked_by.add(w)
            self.book.gangs[w].blocking.add(by.req.name)
        v.preemptions += 1
        v.notice = why
        if v.on_preempt is not None:
            v.on_preempt(v.req.name, why)
        grace = v.req.grace_s if started else 0.0
        self.book.log.add(EventKind.PREEMPT_NOTICE, v.req.name, now, by=by.req.name, priority=v.req.priority,
                          by_priority=by.req.priority, reason=why, grace_s=grace, deadline=now + grace)
        if grace > 0:
            v.state, v.since, v.deadline = GangState.DRAINING, now, now + grace
            self.book.push_deadline(v)
            v.blocking.add(by.req.name)
            by.blocked_by.add(v.req.name)
            v.drain_hold = Reservation(v.req.name, v.req.priority, held, set())  # filled once ``by`` is placed
        else:
            self.book.log.add(EventKind.PREEMPTED, v.req.name, now, stop="immediate")
            self.book.enqueue(v, now)

    def clear_blocked(self, g: Gang) -> set[str]:
        """Forget the victims ``g`` waited for (returns them)."""
        for v in g.blocked_by:
            self.book.gangs[v].blocking.discard(g.req.name)
        out, g.blocked_by = g.blocked_by, set()
        return out

    def unblock(self, v: Gang, now: float) -> None:
        """Draining ``v`` has stopped: what it held goes back, the preemptors waiting for it may become ready."""
        v.deadline = None
        if v.drain_hold is not None:
            v.drain_hold.drop(self.book.state)
            v.drain_hold = None
        for name in sorted(v.blocking):
            p = self.book.gangs.get(name)
            if p is None:
                continue
            p.blocked_by.discard(v.req.name)
            if not p.blocked_by and p.state is GangState.PLACED:
                self.book.log.add(EventKind.READY, name, now)
        v.blocking.clear()

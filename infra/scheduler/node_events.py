"""Nodes come and go: a lost node's gangs are evicted and requeued, a restored or new node serves the queue.

``NodeEvents`` carries the node verbs of ``infra.scheduler.core`` (remove_node, restore_node,
add_node). A change of nodes forgets what was learnt about the old ones: validated bundles and
gangs that fit not even the empty cluster.
"""

from __future__ import annotations

import numpy as np

from infra.scheduler.admission import Admission
from infra.scheduler.events import EventKind
from infra.scheduler.gang_book import GangBook, GangState
from infra.scheduler.gang_placer import GangPlacer
from infra.scheduler.resources import Node


class NodeEvents:
    """Applies node losses, restores and joins; see the module docstring.

    Args:
        book: the gangs and the cluster state.
        placer: the gang placer, which reads the state a joining node replaces.
        admission: requeues evicted gangs and serves the queue.
    """

    def __init__(self, book: GangBook, placer: GangPlacer, admission: Admission) -> None:
        self.book = book
        self.placer = placer
        self.admission = admission

    def remove_node(self, node_name: str, now: float) -> list[str]:
        """``Scheduler.remove_node``: evict and requeue the gangs of a lost node; their names."""
        book, keeper, preemptor = self.book, self.admission.keeper, self.admission.preemptor
        n = book.node(node_name)
        if not book.state.alive[n]:
            return []
        hit = sorted(book.on_node[n], key=lambda x: book.gangs[x].arrival)
        book.log.add(EventKind.NODE_LOST, "", now, node=node_name, gangs=hit)
        if keeper.reservation is not None and n in keeper.reservation.nodes:
            keeper.drop(now)
        for name in hit:
            g = book.gangs[name]
            if g.on_preempt is not None:
                g.on_preempt(name, f"node {node_name} lost")
            book.free(g)
            preemptor.clear_blocked(g)
            book.log.add(EventKind.EVICTED_BY_NODE_LOSS, name, now, node=node_name)
            book.enqueue(g, now)
        for g in [g for g in book.gangs.values() if g.state is GangState.DRAINING and n in g.old_nodes]:
            book.log.add(EventKind.PREEMPTED, g.req.name, now, stop=f"node {node_name} lost")
            preemptor.unblock(g, now)
            book.enqueue(g, now)
        book.state.alive[n] = False
        book.state.version[n] += 1
        self._nodes_changed()
        self.admission.drain(now)
        return hit

    def restore_node(self, node_name: str, now: float) -> None:
        """``Scheduler.restore_node``: a lost node is back (empty); the queue is served."""
        n = self.book.node(node_name)
        st = self.book.state
        if st.alive[n]:
            return
        st.alive[n] = True
        st.cpu_free[n], st.mem_free[n] = st.cpu_cap[n], st.mem_cap[n]
        st.gpu_free[n] = np.where(st.gpu_exists[n], 1000, 0)
        st.gpu_mem_free[n] = st.gpu_mem[n]
        st.version[n] += 1
        st.clock += 1
        st.grown[n] = st.clock
        self.book.log.add(EventKind.NODE_RESTORED, "", now, node=node_name)
        self._nodes_changed()
        self.admission.drain(now)

    def add_node(self, node: Node, now: float) -> None:
        """``Scheduler.add_node``: a node joins (a known lost node is restored); the queue is served."""
        book = self.book
        if node.name in book.state.node_index:
            self.restore_node(node.name, now)
            return
        book.state = book.state.with_node(node)
        self.placer.state = book.state
        book.on_node.append(set())
        book.log.add(EventKind.NODE_JOINED, "", now, node=node.name, cpu_milli=node.cpu_milli, gpus=len(node.gpus),
                     models=sorted({x.model for x in node.gpus}))
        self._nodes_changed()
        self.admission.drain(now)

    def _nodes_changed(self) -> None:
        self.book.valid.clear()
        self.admission.keeper.unreservable.clear()

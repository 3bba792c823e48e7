"""The scheduler: a priority queue of gangs over a cluster, with preemption, release, elastic resize,
node loss and a full event log. It is also the public surface of ``infra`` (see ARCHITECTURE.md).

``submit`` validates a gang, places it (all or nothing) with the configured policy, and if it does
not fit, evicts strictly lower-priority gangs (lowest priority, then newest first) when that makes
room; evicted gangs are told through their ``on_preempt`` callback before their resources go, and
wait in the queue. What cannot run now waits in the queue, served by priority then arrival when
resources free up. Everything that happens is appended to ``events``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from infra import node_scoring
from infra.frag import TypicalPods
from infra.gang_placer import Assignment, GangPlacer, Placement, Taken
from infra.requests import (
    Bundle,
    DifferentNodes,
    GangRequest,
    PinGPUs,
    RequestError,
    SameGPU,
    SameNode,
    validate,
)
from infra.resources import GPU, Cluster, ClusterState, Node

PreemptCallback = Callable[[str, str], None]
"""``on_preempt(gang_name, reason)``: called before a gang is evicted, so it can checkpoint."""


@dataclass(frozen=True)
class Event:
    """One entry of the event log.

    Attributes:
        seq: position in the log.
        kind: ``submitted``, ``placed``, ``queued``, ``preempted``, ``released``, ``resized``,
            ``node_lost``, ``node_restored``, ``evicted_by_node_loss``.
        gang: the gang concerned ("" for node events).
        detail: kind-specific facts (nodes, priorities, reasons, sizes).
    """

    seq: int
    kind: str
    gang: str
    detail: dict = field(default_factory=dict)


@dataclass
class _Gang:
    req: GangRequest
    on_preempt: PreemptCallback | None
    arrival: int
    taken: dict[int, Taken] = field(default_factory=dict)  # bundle -> allocation, while running


class Scheduler:
    """Places gangs on a cluster; see the module docstring.

    Args:
        cluster: the nodes.
        policy: a placement policy name (``infra.node_scoring.names()``).
        typical: typical pods for fragmentation-aware policies (estimated online when None).
        seed: seeds tie-breaking and random policies.
    """

    def __init__(
        self, cluster: Cluster, policy: str = "fgd-strand", typical: TypicalPods | None = None, seed: int = 0
    ) -> None:
        self.cluster = cluster
        self.state = ClusterState(cluster)
        self.policy = node_scoring.load(policy, typical=typical)
        self._placer = GangPlacer(self.state, self.policy, np.random.default_rng(seed))
        self._gangs: dict[str, _Gang] = {}
        self._arrivals = itertools.count()
        self.events: list[Event] = []

    # ---------------------------------------------------------------- queries
    @property
    def queue(self) -> list[str]:
        """Names of waiting gangs in the order they will be tried."""
        return [g.req.name for g in sorted(self._waiting(), key=lambda g: (-g.req.priority, g.arrival))]

    @property
    def placements(self) -> dict[str, Placement]:
        """Running gangs by name."""
        return {name: self._placement(g) for name, g in self._gangs.items() if g.taken}

    def placement(self, name: str) -> Placement | None:
        """Placement of gang ``name``, or None if it waits (KeyError if unknown)."""
        g = self._gang(name)
        return self._placement(g) if g.taken else None

    def request(self, name: str) -> GangRequest:
        """The request of gang ``name`` (KeyError if unknown)."""
        return self._gang(name).req

    def services(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        """Placed services ``"<gang>/<bundle>"`` -> (node index, GPU indices)."""
        return {f"{n}/{b}": (t[0], t[1]) for n, g in self._gangs.items() for b, t in g.taken.items()}

    # ---------------------------------------------------------------- verbs
    def submit(self, req: GangRequest, on_preempt: PreemptCallback | None = None) -> Placement | None:
        """Place ``req`` now (preempting lower priority if needed) or queue it.

        Returns:
            The placement, or None when the gang waits in the queue.
        Raises:
            RequestError: invalid request or a name already in use (nothing placed).
        """
        if req.name in self._gangs:
            raise RequestError(
                f"gang name {req.name!r} is already in use; release it first or pick another name."
            )
        validate(req, self.state, self.services())
        g = _Gang(req, on_preempt, next(self._arrivals))
        self._gangs[req.name] = g
        self._log("submitted", req.name, priority=req.priority, bundles=len(req.bundles))
        if self._try_place(g) or self._try_preempt(g):
            return self._placement(g)
        self._log("queued", req.name, priority=req.priority)
        return None

    def release(self, name: str) -> None:
        """Stop gang ``name`` (running or waiting), return its resources, serve the queue."""
        g = self._gang(name)
        self._free(g)
        del self._gangs[name]
        self._log("released", name)
        self._drain()

    def resize(self, name: str, num_bundles: int) -> Placement:
        """Grow or shrink a running elastic gang to ``num_bundles`` (all added bundles or none).

        Raises:
            RequestError: not elastic, not running, or size outside ``[min_bundles, len(bundles)]``.
            RuntimeError: growing does not fit now (the gang keeps its size).
        """
        g = self._gang(name)
        req = g.req
        if req.min_bundles is None:
            raise RequestError(f"gang {name!r} is not elastic; submit it with min_bundles to resize it.")
        if not g.taken:
            raise RequestError(f"gang {name!r} waits in the queue; resize it once it runs.")
        if not req.min_size <= num_bundles <= len(req.bundles):
            raise RequestError(
                f"gang {name!r}: size {num_bundles} outside [{req.min_size}, {len(req.bundles)}]."
            )
        have = sorted(g.taken)
        if num_bundles < len(have):
            drop = have[num_bundles:]
            self._placer.undo(g.taken.pop(b) for b in drop)
            self._log("resized", name, size=num_bundles, removed=drop)
            self._drain()
        elif num_bundles > len(have):
            add = [b for b in range(len(req.bundles)) if b not in g.taken][: num_bundles - len(have)]
            got = self._placer.place(req, add, self.services(), {b: t[0] for b, t in g.taken.items()})
            if got is None:
                raise RuntimeError(
                    f"gang {name!r}: {len(add)} more bundles do not fit now; it keeps {len(have)}."
                )
            g.taken.update(got)
            self._log("resized", name, size=num_bundles, added=add, nodes=self._node_names(got))
        return self._placement(g)

    def remove_node(self, node_name: str) -> list[str]:
        """A node is lost: its gangs are evicted and rescheduled (or queued). Returns their names."""
        if node_name not in self.state.node_index:
            raise KeyError(f"unknown node {node_name!r}; nodes are {list(self.state.node_index)[:5]}...")
        n = self.state.node_index[node_name]
        if not self.state.alive[n]:
            return []
        hit = [g for g in self._gangs.values() if any(t[0] == n for t in g.taken.values())]
        self._log("node_lost", "", node=node_name, gangs=[g.req.name for g in hit])
        for g in hit:
            if g.on_preempt is not None:
                g.on_preempt(g.req.name, f"node {node_name} lost")
            self._free(g)
            self._log("evicted_by_node_loss", g.req.name, node=node_name)
        self.state.alive[n] = False
        self.state.version[n] += 1
        self._drain()
        return [g.req.name for g in hit]

    def restore_node(self, node_name: str) -> None:
        """A lost node is back (empty); the queue is served."""
        n = self.state.node_index[node_name]
        self.state.alive[n] = True
        self.state.version[n] += 1
        self._log("node_restored", "", node=node_name)
        self._drain()

    # ---------------------------------------------------------------- internals
    def _gang(self, name: str) -> _Gang:
        if name not in self._gangs:
            raise KeyError(f"unknown gang {name!r}; known gangs: {sorted(self._gangs)[:10]}")
        return self._gangs[name]

    def _waiting(self) -> list[_Gang]:
        return [g for g in self._gangs.values() if not g.taken]

    def _placement(self, g: _Gang) -> Placement:
        names = self.cluster.nodes
        return Placement(
            g.req.name,
            tuple(Assignment(b, names[t[0]].name, t[1], t[2]) for b, t in sorted(g.taken.items())),
        )

    def _node_names(self, got) -> list[str]:
        return sorted({self.cluster.nodes[t[0]].name for _, t in got})

    def _try_place(self, g: _Gang) -> bool:
        req = g.req
        want = list(range(len(req.bundles)))
        got = self._placer.place(req, want, self.services())
        if got is None and req.min_bundles is not None:
            # Elastic: the largest size that fits, down to the minimum.
            for size in range(len(want) - 1, req.min_size - 1, -1):
                got = self._placer.place(req, want[:size], self.services())
                if got is not None:
                    break
        if got is None:
            return False
        g.taken = dict(got)
        self._log("placed", req.name, nodes=self._node_names(got), size=len(got))
        return True

    def _try_preempt(self, g: _Gang) -> bool:
        """Evict strictly lower-priority gangs (lowest priority, newest first) if that lets ``g`` run."""
        victims = sorted(
            (v for v in self._gangs.values() if v.taken and v.req.priority < g.req.priority),
            key=lambda v: (v.req.priority, -v.arrival),
        )
        evicted: list[tuple[_Gang, dict[int, Taken]]] = []
        for v in victims:
            evicted.append((v, v.taken))
            self._placer.undo(v.taken.values())
            v.taken = {}
            if self._try_place(g):
                break
        else:
            for v, taken in evicted:  # not enough room even so: put everything back
                for node, gpus, milli, cpu, mem in taken.values():
                    self.state.allocate(node, cpu, mem, gpus, milli)
                v.taken = taken
            return False
        # The victims were freed only tentatively so far; now they are told and queued.
        for v, _ in evicted:
            if v.on_preempt is not None:
                v.on_preempt(v.req.name, f"preempted by {g.req.name!r} (priority {g.req.priority})")
            self._log(
                "preempted", v.req.name, by=g.req.name, priority=v.req.priority, by_priority=g.req.priority
            )
        self._drain()  # a victim may still fit elsewhere
        return True

    def _free(self, g: _Gang) -> None:
        self._placer.undo(g.taken.values())
        g.taken = {}

    def _drain(self) -> None:
        """Place waiting gangs, by priority then arrival, while they fit."""
        for g in sorted(self._waiting(), key=lambda g: (-g.req.priority, g.arrival)):
            if any(
                isinstance(c, SameGPU | SameNode | DifferentNodes) and _names_missing(c, self)
                for c in g.req.constraints
            ):
                continue
            self._try_place(g)

    def _log(self, kind: str, gang: str, **detail) -> None:
        self.events.append(Event(len(self.events), kind, gang, detail))


def _names_missing(c, sched: Scheduler) -> bool:
    """True when a constraint names a service that no longer runs (the gang must wait)."""
    names = [c.service] if isinstance(c, SameGPU | SameNode) and c.service else []
    names += list(c.services) if isinstance(c, DifferentNodes) else []
    have = sched.services()
    return any(s not in have for s in names)


__all__ = [
    "GPU",
    "Assignment",
    "Bundle",
    "Cluster",
    "DifferentNodes",
    "Event",
    "GangRequest",
    "Node",
    "PinGPUs",
    "Placement",
    "RequestError",
    "SameGPU",
    "SameNode",
    "Scheduler",
]

"""Gang placement: all bundles of a request or none, honouring its constraints.

Bundles tied by ``SameGPU`` become one unit (their CPU, memory and GPU fractions summed, one GPU
shared, their GPU memory added up). Units tied by ``SameNode`` (or ``SameGPU`` across units) form a
node group: only nodes with room for the whole group's CPU, memory and whole GPUs are candidates;
its first unit goes where the policy says, the others are restricted to that node; if a later unit
does not fit there, the group is undone and retried with that node excluded, until a node holds
the group or no candidate is left (every candidate node can be tried).
``DifferentNodes``, ``PinGPUs`` and constraints naming placed services narrow the masks of each
``Demand``. Everything taken is applied to the ``ClusterState`` as it goes and undone on failure,
so a failed gang leaves the state exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infra.scheduler.node_scoring import Demand, Policy
from infra.scheduler.requests import Bundle, DifferentNodes, GangRequest, PinGPUs, SameGPU, SameNode
from infra.scheduler.resources import MILLI, Alloc, ClusterState


@dataclass(frozen=True)
class Assignment:
    """Where one bundle runs: node name, GPU indices on it, milli-GPU taken on each."""

    bundle: int
    node: str
    gpus: tuple[int, ...]
    gpu_milli: int


@dataclass(frozen=True)
class Placement:
    """A placed gang: one assignment per running bundle (bundle index order) and its placement count."""

    gang: str
    assignments: tuple[Assignment, ...]
    epoch: int = 0
    """How many times the gang has been placed (its Ray groups are named after it)."""

    def nodes(self) -> set[str]:
        """Names of the nodes the gang uses."""
        return {a.node for a in self.assignments}


@dataclass(frozen=True)
class _Unit:
    """Bundles placed as one demand (a SameGPU set, or a single bundle)."""

    bundles: tuple[int, ...]
    cpu: int
    mem: int
    num_gpu: int
    gpu_milli: int
    models: frozenset[str]
    gpu_memory_mib: int


def _units(req: GangRequest, indices: list[int]) -> list[_Unit]:
    """Merge SameGPU bundles (within ``indices``) into units."""
    parent = {i: i for i in indices}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for c in req.constraints:
        if isinstance(c, SameGPU):
            members = [i for i in c.bundles if i in parent]
            for i in members[1:]:
                parent[root(i)] = root(members[0])
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(root(i), []).append(i)
    units = []
    for members in groups.values():
        bs: list[Bundle] = [req.bundles[i] for i in members]
        if len(bs) == 1:
            b = bs[0]
            units.append(
                _Unit(
                    tuple(members),
                    b.cpu_milli,
                    b.memory_mib,
                    b.num_gpu,
                    b.gpu_milli,
                    b.gpu_models,
                    b.gpu_memory_mib,
                )
            )
        else:
            units.append(
                _Unit(
                    tuple(members),
                    sum(b.cpu_milli for b in bs),
                    sum(b.memory_mib for b in bs),
                    1,
                    sum(b.gpu_fraction for b in bs),
                    bs[0].gpu_models,
                    sum(b.gpu_memory_mib for b in bs),
                )
            )
    return units


def _node_groups(req: GangRequest, units: list[_Unit]) -> list[list[_Unit]]:
    """Units that must share a node (SameNode/SameGPU), units tied to GPU models first, then the largest."""
    where = {b: k for k, u in enumerate(units) for b in u.bundles}
    parent = list(range(len(units)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for c in req.constraints:
        if isinstance(c, SameNode | SameGPU):
            ks = [where[i] for i in c.bundles if i in where]
            for k in ks[1:]:
                parent[root(k)] = root(ks[0])
    groups: dict[int, list[_Unit]] = {}
    for k, u in enumerate(units):
        groups.setdefault(root(k), []).append(u)

    def size(u: _Unit) -> tuple[bool, int, int]:
        # Units tied to GPU models first (the most constrained first): placed after an unconstrained
        # one, they could find it sitting on the only GPU of their model (there is no backtracking).
        return (bool(u.models), u.num_gpu * u.gpu_milli, u.cpu)

    out = [sorted(g, key=size, reverse=True) for g in groups.values()]
    return sorted(out, key=lambda g: size(g[0]), reverse=True)


class GangPlacer:
    """Places gangs on a ``ClusterState`` with a ``Policy``.

    Args:
        state: the cluster state (modified in place).
        policy: the placement policy.
        rng: random generator handed to the policy.
    """

    def __init__(self, state: ClusterState, policy: Policy, rng: np.random.Generator) -> None:
        self.state = state
        self.policy = policy
        self.rng = rng

    def place(
        self,
        req: GangRequest,
        indices: list[int],
        services: dict[str, tuple[int, tuple[int, ...]]],
        running: dict[int, int] | None = None,
        node_mask: np.ndarray | None = None,
    ) -> list[tuple[int, Alloc]] | None:
        """Place bundles ``indices`` of ``req``, all or none.

        Args:
            req: the gang.
            indices: which bundles to place.
            services: placed services by name -> (node, GPU indices), for constraints naming them.
            running: bundles of this gang already placed -> node (a growing elastic gang).
            node_mask: ``[N]`` bool, the only nodes allowed (None: all).
        Returns:
            ``[(bundle, alloc)]`` for every bundle, or None (the state unchanged).
        """
        units = _units(req, indices)
        gang_nodes = np.zeros(self.state.num_nodes, dtype=bool)
        node_of: dict[int, int] = dict(running or {})
        for n in node_of.values():
            gang_nodes[n] = True
        done: list[tuple[int, Alloc]] = []
        for group in _node_groups(req, units):
            placed = self._place_group(req, group, services, node_of, gang_nodes, node_mask)
            if placed is None:
                self.undo(a for _, a in done)
                return None
            done += placed
        return done

    def _group_nodes(self, group: list[_Unit]) -> np.ndarray:
        """``[N]`` bool: nodes with room now for the whole group's CPU, memory and whole GPUs, and where
        each unit alone finds GPUs of its models with its share and memory free (without this a
        same-node group retried node after node where a GPU unit's model is missing)."""
        st = self.state
        ok = st.alive & (st.cpu_free >= sum(u.cpu for u in group)) & (st.mem_free >= sum(u.mem for u in group))
        whole = sum(u.num_gpu for u in group if u.gpu_milli == MILLI)
        if whole:
            ok &= (st.gpu_free == MILLI).sum(axis=1) >= whole
        for u in group:
            if u.num_gpu:
                usable = st.model_mask(u.models) & (st.gpu_free >= u.gpu_milli)
                if u.gpu_memory_mib:
                    usable &= st.memory_free_mask(u.gpu_memory_mib)
                ok &= usable.sum(axis=1) >= u.num_gpu
        return ok

    def _place_group(self, req, group, services, node_of, gang_nodes, node_mask) -> list[tuple[int, Alloc]] | None:
        candidates = self._group_nodes(group) if len(group) > 1 else np.ones(self.state.num_nodes, dtype=bool)
        if node_mask is not None:
            candidates &= node_mask
        while True:
            taken: list[tuple[int, Alloc]] = []
            node = None
            for u in group:
                mask, gmask = self._masks(req, u, services, node_of)
                mask = mask & candidates if node is None else mask & (np.arange(mask.size) == node)
                d = Demand(
                    u.cpu, u.mem, u.num_gpu, u.gpu_milli, u.models, u.gpu_memory_mib, mask, gmask, gang_nodes
                )
                choice = self.policy.choose(self.state, d, self.rng)
                if choice is None:
                    break
                a = Alloc(choice.node, choice.gpus, u.gpu_milli, u.cpu, u.mem, u.gpu_memory_mib)
                self.state.allocate(a)
                node = choice.node
                taken += _split(req, u, a)
            else:
                for b, a in taken:
                    node_of[b] = a.node
                    gang_nodes[a.node] = True
                return taken
            self.undo(a for _, a in taken)
            if node is None:
                return None
            candidates[node] = False  # the group does not fit there: try the next best node

    def _masks(self, req, u: _Unit, services, node_of) -> tuple[np.ndarray, np.ndarray | None]:
        """Node and GPU masks imposed on unit ``u`` by the gang's constraints."""
        st = self.state
        mask = np.ones(st.num_nodes, dtype=bool)
        gmask = None
        mine = set(u.bundles)
        for c in req.constraints:
            if isinstance(c, DifferentNodes) and mine & set(c.bundles):
                for i in c.bundles:
                    if i not in mine and i in node_of:
                        mask[node_of[i]] = False
                for s in c.services:
                    mask[services[s][0]] = False
            elif isinstance(c, SameNode | SameGPU) and c.service and mine & set(c.bundles):
                node, gpus = services[c.service]
                mask &= np.arange(st.num_nodes) == node
                if isinstance(c, SameGPU):
                    gmask = np.zeros_like(st.gpu_exists)
                    gmask[node, list(gpus)] = True
            elif isinstance(c, PinGPUs) and c.bundle in mine:
                node = st.node_index[c.node]
                mask &= np.arange(st.num_nodes) == node
                pin = np.zeros_like(st.gpu_exists)
                pin[node, list(c.gpus)] = True
                gmask = pin if gmask is None else gmask & pin
        return mask, gmask

    def undo(self, allocs) -> None:
        """Free allocations made by ``place``."""
        for a in allocs:
            self.state.free(a)


def _split(req: GangRequest, u: _Unit, a: Alloc) -> list[tuple[int, Alloc]]:
    """Per-bundle share of a unit's allocation (SameGPU members share the GPU)."""
    if len(u.bundles) == 1:
        return [(u.bundles[0], a)]
    out = []
    for i in u.bundles:
        b = req.bundles[i]
        out.append((i, Alloc(a.node, a.gpus, b.gpu_fraction, b.cpu_milli, b.memory_mib, b.gpu_memory_mib)))
    return out

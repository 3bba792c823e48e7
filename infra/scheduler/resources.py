"""Resource model: nodes with CPU, memory and GPUs, kept as numpy arrays for vectorised placement.

Units: CPU in milli-cores, memory in MiB, GPU in milli-GPUs (1000 = one whole GPU). Feasibility is
checked per GPU: a 600-milli request fits only a GPU with at least 600 free, never the sum of two
halves. Each GPU carries a model name (``"T4"``, ``"A10"`` ...).

``ClusterState`` holds the free amounts of every node and GPU as arrays with shape ``[N]`` and
``[N, G]`` (``G`` = the most GPUs on one node; absent GPUs are masked out), so a policy scores all
nodes at once without a per-node Python loop.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from infra.common.csv_rows import RowError, read_rows
from infra.common.csv_rows import count as csv_count

MILLI = 1000
"""Milli-units in one whole GPU."""


@dataclass(frozen=True)
class GPU:
    """One GPU device of a node.

    Attributes:
        model: model name, e.g. ``"T4"``; requests may restrict themselves to some models.
        memory_mib: device memory in MiB; 0 means unknown (never refused for memory).
    """

    model: str
    memory_mib: int = 0


@dataclass(frozen=True)
class Node:
    """A machine of the cluster.

    Attributes:
        name: unique node name.
        cpu_milli: CPU capacity in milli-cores (> 0).
        memory_mib: memory capacity in MiB (> 0).
        gpus: the node's GPUs, indexed 0..len-1 in this order.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GPU, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Node name is empty: give every node a unique, non-empty name.")
        if self.cpu_milli <= 0 or self.memory_mib <= 0:
            raise ValueError(
                f"Node {self.name!r} has cpu_milli={self.cpu_milli}, memory_mib={self.memory_mib}: "
                "both must be positive."
            )


@dataclass(frozen=True)
class Cluster:
    """A set of nodes (the static description; ``ClusterState`` tracks what is free)."""

    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"Duplicate node names {dup[:5]}: node names must be unique.")

    @property
    def gpu_models(self) -> frozenset[str]:
        """Every GPU model present in the cluster."""
        return frozenset(g.model for n in self.nodes for g in n.gpus)

    @classmethod
    def from_csv(cls, path: str | Path) -> Cluster:
        """Read a node list with columns ``sn,cpu_milli,memory_mib,gpu,model`` (the openb format; a node without
        GPUs leaves ``model`` empty).

        Raises:
            FileNotFoundError: ``path`` is not a file.
            infra.common.csv_rows.RowError: A column is missing, or a row's value is not usable (named by file and line).
        """
        nodes = []
        for place, row in read_rows(path, {"sn", "cpu_milli", "memory_mib", "gpu", "model"}, "Node list", "--nodes"):
            count = csv_count(row, "gpu", place)
            model = row["model"].strip()
            if count and not model:
                raise RowError(f"{place}: gpu={count} but no model; name the GPUs' model (e.g. T4) or set gpu=0.")
            nodes.append(Node(row["sn"], csv_count(row, "cpu_milli", place, low=1),
                              csv_count(row, "memory_mib", place, low=1), (GPU(model),) * count))
        return cls(tuple(nodes))


class Alloc(NamedTuple):
    """What one placed bundle (or one ``SameGPU`` unit) holds on a node.

    Attributes:
        node: node index.
        gpus: GPU indices on the node.
        gpu_milli: milli-GPU taken on each of ``gpus``.
        cpu, mem: milli-CPU and MiB.
        gpu_mem: MiB of device memory reserved on each of ``gpus``.
    """

    node: int
    gpus: tuple[int, ...]
    gpu_milli: int
    cpu: int
    mem: int
    gpu_mem: int = 0


@dataclass
class ClusterState:
    """Free resources of every node and GPU, as arrays (``N`` nodes, ``G`` GPU slots per node).

    Attributes:
        cluster: the static description.
        cpu_free, mem_free: ``[N]`` int64, free CPU (milli) and memory (MiB).
        gpu_free: ``[N, G]`` int64, free milli-GPU per GPU; 0 for absent GPU slots.
        gpu_exists: ``[N, G]`` bool, which slots hold a GPU.
        gpu_model: ``[N, G]`` int32, index into ``model_names`` (-1 for absent slots).
        gpu_mem: ``[N, G]`` int64, device memory in MiB (0: unknown, never refused for memory).
        gpu_mem_free: ``[N, G]`` int64, device memory not reserved by placed bundles.
        alive: ``[N]`` bool; a lost node is not alive and never chosen.
        tie_rank: ``[N]`` int, order in which policies break score ties (lowest rank wins); the
            scheduler and the trace replay draw it at random from their seed, as the FGD
            simulator's node naming does.
        version: ``[N]`` int64, bumped on every change of a node (caches key on it).
        grown: ``[N]`` int64, the value of ``clock`` when resources were last returned to the node
            (the queue retries only what could use a node that grew since it last failed).
    """

    cluster: Cluster
    cpu_cap: np.ndarray = field(init=False)
    mem_cap: np.ndarray = field(init=False)
    cpu_free: np.ndarray = field(init=False)
    mem_free: np.ndarray = field(init=False)
    gpu_free: np.ndarray = field(init=False)
    gpu_exists: np.ndarray = field(init=False)
    gpu_model: np.ndarray = field(init=False)
    gpu_count: np.ndarray = field(init=False)
    gpu_mem_free: np.ndarray = field(init=False)
    alive: np.ndarray = field(init=False)
    version: np.ndarray = field(init=False)
    grown: np.ndarray = field(init=False)
    model_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        nodes = self.cluster.nodes
        n = len(nodes)
        g = max((len(x.gpus) for x in nodes), default=0)
        g = max(g, 1)
        self.model_names = tuple(sorted(self.cluster.gpu_models))
        model_index = {m: i for i, m in enumerate(self.model_names)}
        self.cpu_cap = np.array([x.cpu_milli for x in nodes], dtype=np.int64)
        self.mem_cap = np.array([x.memory_mib for x in nodes], dtype=np.int64)
        self.gpu_count = np.array([len(x.gpus) for x in nodes], dtype=np.int64)
        self.gpu_exists = np.arange(g)[None, :] < self.gpu_count[:, None]
        self.gpu_model = np.full((n, g), -1, dtype=np.int32)
        self.gpu_mem = np.zeros((n, g), dtype=np.int64)
        for i, node in enumerate(nodes):
            for j, gpu in enumerate(node.gpus):
                self.gpu_model[i, j] = model_index[gpu.model]
                self.gpu_mem[i, j] = gpu.memory_mib
        self.node_index = {x.name: i for i, x in enumerate(nodes)}
        self._model_masks: dict[frozenset[str], np.ndarray] = {}
        self.alive = np.ones(n, dtype=bool)
        self.tie_rank = np.arange(n)
        self.version = np.zeros(n, dtype=np.int64)
        self.grown = np.zeros(n, dtype=np.int64)
        self.clock = 0
        self.reset()

    def reset(self) -> None:
        """Free everything (all nodes empty); lost nodes stay lost."""
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.gpu_free = np.where(self.gpu_exists, MILLI, 0).astype(np.int64)
        self.gpu_mem_free = self.gpu_mem.copy()
        self.version += 1
        self.clock += 1
        self.grown[:] = self.clock

    def with_node(self, node: Node) -> ClusterState:
        """A new state with ``node`` appended, the free amounts of the existing nodes kept."""
        bigger = ClusterState(Cluster((*self.cluster.nodes, node)))
        n, g = self.gpu_free.shape
        bigger.cpu_free[:n] = self.cpu_free
        bigger.mem_free[:n] = self.mem_free
        bigger.gpu_free[:n, :g] = self.gpu_free
        bigger.gpu_mem_free[:n, :g] = self.gpu_mem_free
        bigger.alive[:n] = self.alive
        bigger.tie_rank = np.concatenate([self.tie_rank, [n]])
        bigger.version[:n] = self.version + 1
        bigger.clock = self.clock + 1
        bigger.grown[:] = bigger.clock
        return bigger

    def empty_copy(self) -> ClusterState:
        """A copy with every node empty (same live nodes, capacities and tie order)."""
        other = copy.copy(self)
        other.version = self.version.copy()
        other.grown = self.grown.copy()
        other.alive = self.alive.copy()
        other.reset()
        return other

    @property
    def num_nodes(self) -> int:
        """Number of nodes ``N`` (lost ones included)."""
        return len(self.cpu_cap)

    def total_gpu_milli(self) -> int:
        """GPU capacity of the live nodes in milli-GPU."""
        return int(self.gpu_count[self.alive].sum()) * MILLI

    def used_gpu_milli(self) -> int:
        """Allocated GPU milli on live nodes."""
        live = self.alive
        return int((self.gpu_count[live] * MILLI).sum() - self.gpu_free[live].sum())

    def model_mask(self, models: frozenset[str]) -> np.ndarray:
        """``[N, G]`` bool: GPU slots whose model is in ``models`` (all existing slots if empty)."""
        if not models:
            return self.gpu_exists
        mask = self._model_masks.get(models)
        if mask is None:
            ids = [i for i, m in enumerate(self.model_names) if m in models]
            mask = self._model_masks[models] = np.isin(self.gpu_model, ids)
        return mask

    def memory_mask(self, need_mib: int) -> np.ndarray:
        """``[N, G]`` bool: GPU slots with at least ``need_mib`` device memory (or unknown memory)."""
        return self.gpu_exists & ((self.gpu_mem == 0) | (self.gpu_mem >= need_mib))

    def memory_free_mask(self, need_mib: int) -> np.ndarray:
        """``[N, G]`` bool: GPU slots with ``need_mib`` device memory not yet reserved (or unknown memory)."""
        return self.gpu_exists & ((self.gpu_mem == 0) | (self.gpu_mem_free >= need_mib))

    def fits(self, a: Alloc) -> bool:
        """Whether ``a`` could be taken now (on a live node)."""
        idx = list(a.gpus)
        if not self.alive[a.node] or self.cpu_free[a.node] < a.cpu or self.mem_free[a.node] < a.mem:
            return False
        if not idx:
            return True
        if len(set(idx)) != len(idx) or (self.gpu_free[a.node, idx] < a.gpu_milli).any():
            return False
        known = self.gpu_mem[a.node, idx] > 0
        return not (known & (self.gpu_mem_free[a.node, idx] < a.gpu_mem)).any()

    def allocate(self, a: Alloc) -> None:
        """Take ``a``; raises ``RuntimeError`` (and changes nothing) if it is not free."""
        if not self.fits(a):
            n = a.node
            raise RuntimeError(
                f"allocate on node {self.cluster.nodes[n].name}: {a} exceeds free cpu={self.cpu_free[n]} "
                f"mem={self.mem_free[n]} gpu={self.gpu_free[n].tolist()} gpu_mem={self.gpu_mem_free[n].tolist()}"
            )
        self._add(a, -1)

    def free(self, a: Alloc) -> None:
        """Return ``a`` (taken by ``allocate``); raises ``RuntimeError`` on over-release."""
        idx = list(a.gpus)
        n = a.node
        if (
            self.cpu_free[n] + a.cpu > self.cpu_cap[n]
            or self.mem_free[n] + a.mem > self.mem_cap[n]
            or (idx and (self.gpu_free[n, idx] + a.gpu_milli > MILLI).any())
        ):
            raise RuntimeError(f"free on node {self.cluster.nodes[n].name} returns more than its capacity: {a}")
        self._add(a, 1)
        self.clock += 1
        self.grown[n] = self.clock

    def _add(self, a: Alloc, sign: int) -> None:
        n, idx = a.node, list(a.gpus)
        self.cpu_free[n] += sign * a.cpu
        self.mem_free[n] += sign * a.mem
        if idx:
            self.gpu_free[n, idx] += sign * a.gpu_milli
            known = [g for g in idx if self.gpu_mem[n, g] > 0]
            if known and a.gpu_mem:
                self.gpu_mem_free[n, known] += sign * a.gpu_mem
        self.version[n] += 1

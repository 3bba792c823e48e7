"""Resource model: nodes with CPU, memory and GPUs, kept as numpy arrays for vectorised placement.

Units: CPU in milli-cores, memory in MiB, GPU in milli-GPUs (1000 = one whole GPU). Feasibility is
checked per GPU: a 600-milli request fits only a GPU with at least 600 free, never the sum of two
halves. Each GPU carries a model name (``"T4"``, ``"A10"`` ...).

``ClusterState`` holds the free amounts of every node and GPU as arrays with shape ``[N]`` and
``[N, G]`` (``G`` = the most GPUs on one node; absent GPUs are masked out), so a policy scores all
nodes at once without a per-node Python loop.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

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
        """Read a node list with columns ``sn,cpu_milli,memory_mib,gpu,model`` (the openb format)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"Node list {path} not found: pass --nodes with an existing CSV file.")
        nodes = []
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = {"sn", "cpu_milli", "memory_mib", "gpu", "model"} - set(reader.fieldnames or ())
            if missing:
                raise ValueError(
                    f"Node list {path} lacks columns {sorted(missing)}; expected sn,cpu_milli,memory_mib,gpu,model."
                )
            for row in reader:
                count = int(row["gpu"])
                nodes.append(
                    Node(
                        row["sn"], int(row["cpu_milli"]), int(row["memory_mib"]), (GPU(row["model"]),) * count
                    )
                )
        return cls(tuple(nodes))


@dataclass
class ClusterState:
    """Free resources of every node and GPU, as arrays (``N`` nodes, ``G`` GPU slots per node).

    Attributes:
        cluster: the static description.
        cpu_free, mem_free: ``[N]`` int64, free CPU (milli) and memory (MiB).
        gpu_free: ``[N, G]`` int64, free milli-GPU per GPU; 0 for absent GPU slots.
        gpu_exists: ``[N, G]`` bool, which slots hold a GPU.
        gpu_model: ``[N, G]`` int32, index into ``model_names`` (-1 for absent slots).
        gpu_mem: ``[N, G]`` int64, device memory in MiB (0: unknown).
        alive: ``[N]`` bool; a lost node is not alive and never chosen.
        tie_rank: ``[N]`` int, order in which policies break score ties (lowest rank wins); the
            trace replay draws it at random per seed, as the FGD simulator's node naming does.
        version: ``[N]`` int64, bumped on every change of a node (caches key on it).
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
    alive: np.ndarray = field(init=False)
    version: np.ndarray = field(init=False)
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
        self.reset()

    def reset(self) -> None:
        """Free everything (all nodes empty); lost nodes stay lost."""
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.gpu_free = np.where(self.gpu_exists, MILLI, 0).astype(np.int64)
        self.version += 1

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

    def allocate(self, node: int, cpu: int, mem: int, gpus: tuple[int, ...], gpu_milli: int) -> None:
        """Take resources on one node; raises ``RuntimeError`` (and changes nothing) if they are not free."""
        idx = list(gpus)
        if (
            not self.alive[node]
            or self.cpu_free[node] < cpu
            or self.mem_free[node] < mem
            or (idx and (self.gpu_free[node, idx] < gpu_milli).any())
            or len(set(idx)) != len(idx)
        ):
            raise RuntimeError(
                f"allocate on node {self.cluster.nodes[node].name}: cpu={cpu} mem={mem} gpus={gpus}x{gpu_milli} "
                f"exceeds free cpu={self.cpu_free[node]} mem={self.mem_free[node]} gpu={self.gpu_free[node].tolist()}"
            )
        self.cpu_free[node] -= cpu
        self.mem_free[node] -= mem
        if idx:
            self.gpu_free[node, idx] -= gpu_milli
        self.version[node] += 1

    def free(self, node: int, cpu: int, mem: int, gpus: tuple[int, ...], gpu_milli: int) -> None:
        """Return resources taken by ``allocate``; raises ``RuntimeError`` on over-release."""
        idx = list(gpus)
        if (
            self.cpu_free[node] + cpu > self.cpu_cap[node]
            or self.mem_free[node] + mem > self.mem_cap[node]
            or (idx and (self.gpu_free[node, idx] + gpu_milli > MILLI).any())
        ):
            raise RuntimeError(f"free on node {self.cluster.nodes[node].name} returns more than its capacity")
        self.cpu_free[node] += cpu
        self.mem_free[node] += mem
        if idx:
            self.gpu_free[node, idx] += gpu_milli
        self.version[node] += 1

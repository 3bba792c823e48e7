"""Placement policies behind one interface, with a registry: ``load(name)``, ``names()``.

A policy answers one question: on which node, and which GPUs of it, does one bundle go? It sees
the whole cluster as arrays (``ClusterState``) and scores every feasible node at once; the best
score wins and ties go to the node ranked first in ``state.tie_rank``, a node order the scheduler
draws from its seed (as the FGD simulator's random node naming does), so a seed fixes every choice.
Gangs and constraints are handled above it (``infra.scheduler.gang_placer``) by narrowing the masks of a
``Demand``.

Policies: ``random``, ``pack`` (Ray PACK-like: the gang's nodes first, else the emptiest feasible
node), ``spread``, ``bestfit`` (the FGD simulator's BestFit), ``most-allocated`` and
``least-allocated`` (kube-scheduler's NodeResources scores, GPU included), ``fgd``
(fragmentation gradient descent, Weng et al. ATC'23, with the simulator's integer scores) and
``fgd-strand``, this project's policy (see ``StrandingFGDPolicy``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from infra.scheduler.frag import FragModel, PodShape, TypicalPods
from infra.scheduler.resources import MILLI, ClusterState


@dataclass(frozen=True)
class Demand:
    """One bundle to place, with the masks that gang constraints impose.

    Attributes:
        cpu, mem: milli-CPU and MiB.
        num_gpu: GPUs touched (0 for none).
        gpu_milli: milli-GPU on each touched GPU (1000 for whole GPUs).
        models: allowed GPU models (empty: any).
        gpu_memory_mib: device memory needed per GPU (0: none).
        node_mask: ``[N]`` bool, allowed nodes (None: all).
        gpu_mask: ``[N, G]`` bool, allowed GPU slots (None: all).
        gang_nodes: ``[N]`` bool, nodes already holding bundles of the same gang (PACK/SPREAD use it).
    """

    cpu: int
    mem: int
    num_gpu: int = 0
    gpu_milli: int = 0
    models: frozenset[str] = frozenset()
    gpu_memory_mib: int = 0
    node_mask: np.ndarray | None = None
    gpu_mask: np.ndarray | None = None
    gang_nodes: np.ndarray | None = None

    @property
    def shape(self) -> PodShape:
        """The request shape used for typical-pod statistics."""
        return (self.cpu, self.gpu_milli, self.num_gpu, self.models)

    @property
    def shared(self) -> bool:
        """True for a fraction of one GPU."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI


@dataclass(frozen=True)
class Choice:
    """A placement decision: node index and the GPU indices used on it."""

    node: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Candidates:
    """Feasible nodes of a demand: ``nodes`` ``[K]`` and their usable GPU slots ``gpu_ok`` ``[K, G]``."""

    nodes: np.ndarray
    gpu_ok: np.ndarray | None


def feasible(state: ClusterState, d: Demand) -> Candidates:
    """Nodes (and their GPU slots) that can host ``d`` now, checked per GPU."""
    ok = state.alive & (state.cpu_free >= d.cpu) & (state.mem_free >= d.mem)
    if d.node_mask is not None:
        ok &= d.node_mask
    if d.num_gpu == 0:
        return Candidates(np.flatnonzero(ok), None)
    ok &= state.gpu_count >= d.num_gpu
    nodes = np.flatnonzero(ok)
    allowed = state.model_mask(d.models)[nodes]
    if d.gpu_memory_mib:
        allowed = allowed & state.memory_free_mask(d.gpu_memory_mib)[nodes]
    if d.gpu_mask is not None:
        allowed = allowed & d.gpu_mask[nodes]
    gpu_ok = allowed & (state.gpu_free[nodes] >= d.gpu_milli)
    keep = gpu_ok.sum(axis=1) >= d.num_gpu
    return Candidates(nodes[keep], gpu_ok[keep])


def first_gpus(gpu_ok_row: np.ndarray, k: int) -> tuple[int, ...]:
    """The first ``k`` usable GPU indices (how the FGD simulator assigns whole GPUs)."""
    return tuple(int(i) for i in np.flatnonzero(gpu_ok_row)[:k])


class Policy:
    """Base class: score feasible nodes (higher is better), take the best, break ties by ``state.tie_rank``.

    Subclasses implement ``node_scores``; they may override ``pick_gpus`` (default: whole GPUs by
    index, a fraction on the tightest GPU that fits) or ``choose`` itself.
    """

    name = ""

    def choose(self, state: ClusterState, d: Demand, rng: np.random.Generator) -> Choice | None:
        """Decide where ``d`` goes; None when no node can host it."""
        cand = feasible(state, d)
        if cand.nodes.size == 0:
            return None
        scores = self.node_scores(state, d, cand)
        k = _argmax(scores, cand.nodes, state)
        return Choice(int(cand.nodes[k]), self.pick_gpus(state, d, cand, k, rng))

    def node_scores(self, state: ClusterState, d: Demand, cand: Candidates) -> np.ndarray:
        """``[K]`` scores of the candidate nodes."""
        raise NotImplementedError

    def pick_gpus(
        self, state: ClusterState, d: Demand, cand: Candidates, k: int, rng: np.random.Generator
    ) -> tuple[int, ...]:
        """GPU indices on candidate ``k``: whole GPUs by index; a fraction on the tightest GPU that fits."""
        if d.num_gpu == 0:
            return ()
        row = cand.gpu_ok[k]
        if not d.shared:
            return first_gpus(row, d.num_gpu)
        free = np.where(row, state.gpu_free[cand.nodes[k]], np.iinfo(np.int64).max)
        return (int(np.argmin(free)),)


def _argmax(scores: np.ndarray, nodes: np.ndarray, state: ClusterState) -> int:
    """Index of the maximum; among ties the node ranked first in ``state.tie_rank``."""
    best = np.flatnonzero(scores == scores.max())
    return int(best[0] if best.size == 1 else best[np.argmin(state.tie_rank[nodes[best]])])


class RandomPolicy(Policy):
    """Any feasible node, uniformly; a fraction on a uniformly random GPU that fits."""

    name = "random"

    def choose(self, state, d, rng):
        cand = feasible(state, d)
        if cand.nodes.size == 0:
            return None
        k = int(rng.integers(cand.nodes.size))
        if d.shared:
            ok = np.flatnonzero(cand.gpu_ok[k])
            return Choice(int(cand.nodes[k]), (int(ok[rng.integers(ok.size)]),))
        return Choice(int(cand.nodes[k]), self.pick_gpus(state, d, cand, k, rng))


def free_fraction(state: ClusterState, nodes: np.ndarray) -> np.ndarray:
    """Mean free fraction of CPU, memory and (where present) GPU of each node."""
    cpu = state.cpu_free[nodes] / state.cpu_cap[nodes]
    mem = state.mem_free[nodes] / state.mem_cap[nodes]
    cap = state.gpu_count[nodes] * MILLI
    has = cap > 0
    gpu = np.where(has, state.gpu_free[nodes].sum(axis=1) / np.maximum(cap, 1), 0.0)
    return (cpu + mem + gpu) / (2 + has)


class PackPolicy(Policy):
    """Ray PACK-like: fill the nodes the gang already uses; otherwise the emptiest feasible node."""

    name = "pack"

    def node_scores(self, state, d, cand):
        score = free_fraction(state, cand.nodes)
        if d.gang_nodes is not None:
            score = score + 2.0 * d.gang_nodes[cand.nodes]
        return score


class SpreadPolicy(Policy):
    """Ray SPREAD-like: nodes the gang does not use yet first, then the emptiest."""

    name = "spread"

    def node_scores(self, state, d, cand):
        score = free_fraction(state, cand.nodes)
        if d.gang_nodes is not None:
            score = score - 2.0 * d.gang_nodes[cand.nodes]
        return score


class BestFitPolicy(Policy):
    """The FGD simulator's BestFit: least CPU and GPU left after placement, as an integer score 0..100.

    ``score = int(100 * (1 - 0.5 * (cpu_left - cpu) / max_cpu - 0.5 * (gpu_left - gpu) / max_gpu))``
    with ``max_*`` the largest node of the cluster (128 cores and 8 GPUs on the Alibaba trace).
    """

    name = "bestfit"

    def node_scores(self, state, d, cand):
        n = cand.nodes
        max_cpu = float(state.cpu_cap.max())
        max_gpu = float(max(state.gpu_count.max(), 1) * MILLI)
        left = 0.5 * (state.cpu_free[n] - d.cpu) / max_cpu
        left += 0.5 * (state.gpu_free[n].sum(axis=1) - d.num_gpu * d.gpu_milli) / max_gpu
        return np.trunc((1.0 - left) * 100.0)


class _K8sAllocated(Policy):
    """kube-scheduler NodeResources{Most,Least}Allocated over CPU, memory and GPU (integer scores)."""

    most = True

    def node_scores(self, state, d, cand):
        n = cand.nodes
        caps = (state.cpu_cap[n], state.mem_cap[n], state.gpu_count[n] * MILLI)
        used = (
            state.cpu_cap[n] - state.cpu_free[n] + d.cpu,
            state.mem_cap[n] - state.mem_free[n] + d.mem,
            state.gpu_count[n] * MILLI - state.gpu_free[n].sum(axis=1) + d.num_gpu * d.gpu_milli,
        )
        total = np.zeros(n.size, dtype=np.int64)
        for cap, req in zip(caps, used):
            part = req if self.most else cap - req
            total += np.where(cap > 0, part * 100 // np.maximum(cap, 1), 0)
        return total // 3


class MostAllocatedPolicy(_K8sAllocated):
    """Prefer the fullest node (bin packing)."""

    name = "most-allocated"
    most = True


class LeastAllocatedPolicy(_K8sAllocated):
    """Prefer the emptiest node (kube-scheduler's default spreading)."""

    name = "least-allocated"
    most = False


class FGDPolicy(Policy):
    """Fragmentation gradient descent: place where the expected GPU fragmentation grows least.

    Scores follow the FGD simulator exactly: ``int(100 * sigmoid((F_before - F_after) / 1000))``;
    a fraction goes on the first GPU with the best score, whole GPUs by index; ties between nodes
    go by ``state.tie_rank``.

    Args:
        typical: the workload's typical pods; None estimates them online from the requests seen.
    """

    name = "fgd"

    def __init__(self, typical: TypicalPods | None = None) -> None:
        self._fixed = typical
        self._seen: Counter[PodShape] = Counter()
        self._seen_at_build = 0
        self._model: FragModel | None = None

    def model(self, state: ClusterState, d: Demand | None = None) -> FragModel:
        """The fragmentation model for ``state`` (built on first use; rebuilt as online statistics grow)."""
        if self._fixed is None and d is not None:
            self._seen[d.shape] += 1
            total = sum(self._seen.values())
            if self._model is None or total >= 2 * self._seen_at_build or self._model.state is not state:
                shapes = [s for s, c in self._seen.items() for _ in range(c)]
                self._model = FragModel(state, TypicalPods.from_shapes(shapes))
                self._seen_at_build = total
        elif self._model is None or self._model.state is not state:
            if self._fixed is None:
                raise ValueError(
                    f"policy {self.name!r} has no typical pods yet: pass typical= or place a request first."
                )
            self._model = FragModel(state, self._fixed)
        return self._model

    def frag_delta(
        self, state: ClusterState, d: Demand, cand: Candidates
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fragmentation increase of every candidate placement.

        Returns:
            ``(rows, gpus, delta)``: candidate row into ``cand.nodes`` ``[C]``, GPU indices ``[C, k]``,
            ``F_after - F_before`` ``[C]``. A fraction has one candidate per usable GPU slot (rows
            ascending, GPUs ascending within a row; of a node's fully free GPUs only the first);
            other requests one per node.
        """
        fm = self.model(state, d)
        fm.refresh()
        if d.shared:
            # Fully free GPUs of a node are interchangeable: keep the first one only.
            full = cand.gpu_ok & (state.gpu_free[cand.nodes] == MILLI)
            keep = cand.gpu_ok & ~(full & (np.cumsum(full, axis=1) > 1))
            rows, g = np.nonzero(keep)
            gpus = g[:, None]
        elif d.num_gpu:
            rows = np.arange(cand.nodes.size)
            order = np.argsort(~cand.gpu_ok, axis=1, kind="stable")
            gpus = order[:, : d.num_gpu]
        else:
            rows = np.arange(cand.nodes.size)
            gpus = np.zeros((rows.size, 0), dtype=np.int64)
        nodes = cand.nodes[rows]
        after = fm.after(nodes, gpus, d.gpu_milli, d.cpu)
        return rows, gpus, after - fm.frag[nodes]

    def score(self, delta: np.ndarray) -> np.ndarray:
        """The simulator's integer score from the fragmentation increase (higher is better)."""
        return np.trunc(100.0 / (1.0 + np.exp(delta / 1000.0)))

    def rank(self, state: ClusterState, d: Demand, nodes: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """``[C]`` ranking of the candidate placements on ``nodes`` (higher is better): FGD's integer score."""
        return self.score(delta)

    def choose(self, state, d, rng):
        cand = feasible(state, d)
        if cand.nodes.size == 0:
            return None
        rows, gpus, delta = self.frag_delta(state, d, cand)
        score = self.rank(state, d, cand.nodes[rows], delta)
        # Per node: its best candidate (first GPU on ties); across nodes: the best, first in tie_rank.
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        best_node = np.maximum.reduceat(score, starts)
        k = _argmax(best_node, cand.nodes[rows[starts]], state)
        first = starts[k] + int(np.argmax(score[starts[k] :] == best_node[k]))
        return Choice(int(cand.nodes[rows[first]]), tuple(int(x) for x in gpus[first]))


_TIE_SCALE = 1e6
"""Puts FGD's integer score above any stranding increase (bounded by a node's GPU milli, < 500 GPUs)."""

SCARCITY_POINTS = 50
"""The most FGD score points a GPU model's scarcity takes off a model-flexible pod's placement
(20, 50 and 100 tried on the development seeds 100-102 of gpuspec33 with the openb mix: 20 was 0.1-0.2
points better there but cannot outweigh a 23-point FGD preference for a scarce node; see docs/scheduler.md)."""


class StrandingFGDPolicy(FGDPolicy):
    """This project's policy: FGD, with GPU-model scarcity for model-flexible pods, and among the
    equally scored best placements the one that strands the least GPU capacity for lack of CPU.

    **Model scarcity.** Pods restricted to some GPU models can only use those; when a pod that
    could run elsewhere takes a scarce model's last free GPUs, a constrained pod fails later. FGD
    does not see it: a constrained shape is rare, so it is outside the typical pods. The policy
    estimates each model's *expected future constrained demand* from the requests seen so far, as
    FGD estimates the workload from its typical pods: of all milli-GPU requested, a share ``s_m``
    was restricted to model ``m`` (a request allowed several models counts evenly for each), so
    of the ``F`` milli-GPU still free in the cluster, ``s_m * F`` is expected to come restricted
    to ``m``. Its scarcity is ``rho_m = s_m * F / free_m``: at 1 or above, constrained pods alone
    are expected to use up what ``m`` has left. A pod that may use more than one model (any model,
    or several) loses ``floor(SCARCITY_POINTS * min(1, rho_m))`` points of FGD's 0-100 integer
    score on a node of model ``m``; pods restricted to one model and CPU-only pods are scored as by
    FGD. With no constrained pods seen it changes nothing.

    **Stranding.** FGD counts free GPU as fragment when a typical pod cannot use it, looking at
    CPU only through each typical pod's exact request, one placement at a time. Nodes with many
    GPUs and few cores (8 GPUs, 96 cores) are drained of CPU gradually, by CPU-only pods and
    CPU-heavy GPU pods, until their remaining GPUs cannot be used at all; FGD sees that only when
    it happens. The *stranded* GPU milli of a node is

        stranded(n) = max(0, r * gpu_free(n) - cpu_free(n)) / r

    where ``r`` is the workload's CPU per milli-GPU (from the typical pods): the GPU capacity that
    the node's free CPU cannot feed at the workload's usual ratio. FGD's integer score (one point
    is about 40 milli-GPU of expected fragment) ties on many nodes; this policy breaks those ties
    by the smallest increase of ``stranded`` (then, like FGD, by the seed's node order), and never
    overrides a difference in the (scarcity-adjusted) score. That order matters: adding the
    stranding increase to FGD's fragmentation instead gains more when GPU pods are small, but
    sends CPU-heavy pods to the CPU-rich nodes that the workload's large multi-GPU pods need (with
    30% multi-GPU pods it lost about 1 point to FGD at 100% arrived), because FGD's expected
    fragment of those large shapes is weighted by their small frequency.

    Args:
        typical: as for ``fgd``.
    """

    name = "fgd-strand"

    def __init__(self, typical: TypicalPods | None = None) -> None:
        super().__init__(typical)
        self._constrained: dict[int, float] = {}
        self._requested = 0.0

    def choose(self, state, d, rng):
        milli = d.num_gpu * d.gpu_milli
        self._requested += milli
        if d.models and milli:
            ids = [i for i, m in enumerate(state.model_names) if m in d.models]
            for i in ids:
                self._constrained[i] = self._constrained.get(i, 0.0) + milli / len(ids)
        return super().choose(state, d, rng)

    def scarcity_points(self, state: ClusterState, d: Demand, nodes: np.ndarray) -> np.ndarray:
        """``[C]`` score points the candidates' GPU models lose (0 for single-model or CPU-only pods)."""
        if len(d.models) == 1 or not d.num_gpu or not self._constrained:
            return np.zeros(nodes.size)
        nm = len(state.model_names)
        live = state.gpu_exists & state.alive[:, None]
        free = np.bincount(state.gpu_model[live], weights=state.gpu_free[live], minlength=nm)
        share = np.zeros(nm)
        for i, milli in self._constrained.items():
            share[i] = milli / self._requested
        rho = share * free.sum() / np.maximum(free, 1.0)
        return np.floor(SCARCITY_POINTS * np.minimum(rho, 1.0)[np.maximum(state.gpu_model[nodes, 0], 0)])

    def rank(self, state, d, nodes, delta):
        score = self.score(delta) - self.scarcity_points(state, d, nodes)
        r = self.model(state).cpu_per_gpu_milli
        if r <= 0:
            return score
        gpu_free = state.gpu_free[nodes].sum(axis=1).astype(float)
        cpu_free = state.cpu_free[nodes].astype(float)
        before = np.maximum(0.0, r * gpu_free - cpu_free)
        after = np.maximum(0.0, r * (gpu_free - d.num_gpu * d.gpu_milli) - (cpu_free - d.cpu))
        stranded = np.round((after - before) / r)  # whole milli-GPU: equal increases still tie
        # Lexicographic: the scarcity-adjusted FGD score first, then the smaller stranding increase.
        return score * _TIE_SCALE - stranded


_REGISTRY: dict[str, type[Policy]] = {
    p.name: p
    for p in (
        RandomPolicy,
        PackPolicy,
        SpreadPolicy,
        BestFitPolicy,
        MostAllocatedPolicy,
        LeastAllocatedPolicy,
        FGDPolicy,
        StrandingFGDPolicy,
    )
}


def names() -> list[str]:
    """Names accepted by ``load``."""
    return sorted(_REGISTRY)


def load(name: str, typical: TypicalPods | None = None) -> Policy:
    """A new policy by name.

    Args:
        name: one of ``names()``.
        typical: the workload's typical pods, used by the fragmentation-aware policies (``fgd``,
            ``fgd-strand``; they estimate them online from the requests seen when None) and ignored
            by the others.
    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {names()}.")
    cls = _REGISTRY[name]
    return cls(typical) if issubclass(cls, FGDPolicy) else cls()

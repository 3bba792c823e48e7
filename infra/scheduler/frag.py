"""GPU fragmentation as defined by FGD (Weng et al., "Beware of Fragmentation", USENIX ATC 2023).

The *typical pods* of a workload are its most frequent request shapes (CPU, milli-GPU per GPU,
GPU count, allowed models), with frequencies ``p_t``. For one node and one typical pod ``t``, the
node's free GPU capacity that ``t`` could not use is fragment:

* ``t`` asks no GPU, cannot reach the node's GPU model, lacks CPU, or lacks GPUs: all free GPU
  milli of the node is fragment;
* otherwise (``t`` fits): the free milli of the GPUs too small for ``t`` (free < t's milli).

The node's fragmentation is the expectation over typical pods: ``F(n) = sum_t p_t * frag_t(n)``;
the cluster's is the sum over nodes. FGD places each pod where ``F`` grows least.

Vectorisation: typical pods are grouped by their GPU shape ``s`` (milli, count, models); within a
group only the CPU differs, so ``A_s(c) = sum of p_t with cpu_t <= c`` is a step function read
with one ``searchsorted``. Per node the model keeps ``cnt[n, s]`` (GPUs able to host s's milli)
and ``small[n, s]`` (free milli on GPUs too small for, or not allowed to, s); the fragmentation
after a tentative placement is computed for all candidates at once from the changed GPUs only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from infra.scheduler.resources import ClusterState

PodShape = tuple[int, int, int, frozenset[str]]
"""(cpu_milli, gpu_milli per GPU, num_gpu, allowed GPU models) of a request."""


@dataclass(frozen=True)
class TypicalPods:
    """The most frequent request shapes of a workload and their renormalised frequencies."""

    shapes: tuple[PodShape, ...]
    freqs: tuple[float, ...]

    @classmethod
    def from_shapes(cls, shapes: list[PodShape], coverage: float = 0.95) -> TypicalPods:
        """Take shapes by decreasing count until they cover ``coverage`` of all pods, then renormalise.

        This is the FGD simulator's default (CPU-only pods included, 95% popularity threshold).
        Ties in count are ordered by larger CPU, then milli-GPU, GPU count, models.
        """
        if not shapes:
            raise ValueError("TypicalPods.from_shapes needs at least one pod shape.")
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage={coverage} must be in (0, 1].")
        counts = Counter(shapes)
        order = sorted(counts, key=lambda s: (counts[s], s[0], s[1], s[2], sorted(s[3])), reverse=True)
        total = len(shapes)
        chosen, cum = [], 0
        for s in order:
            if cum >= coverage * total:
                break
            chosen.append(s)
            cum += counts[s]
        return cls(tuple(chosen), tuple(counts[s] / cum for s in chosen))


class FragModel:
    """Per-node FGD fragmentation of a ``ClusterState``, cached by node version."""

    def __init__(self, state: ClusterState, typical: TypicalPods) -> None:
        self.state = state
        groups: dict[tuple[int, int, frozenset[str]], list[tuple[int, float]]] = {}
        self.p_nogpu = 0.0
        for (cpu, milli, num, models), p in zip(typical.shapes, typical.freqs):
            if milli == 0 or num == 0:
                self.p_nogpu += p
            else:
                groups.setdefault((milli, num, models), []).append((cpu, p))
        keys = list(groups)
        gpu_pods = [
            (cpu, milli * num, p)
            for (cpu, milli, num, _), p in zip(typical.shapes, typical.freqs)
            if milli and num
        ]
        gpu_weight = sum(g * p for _, g, p in gpu_pods)
        # Mean CPU milli per GPU milli of the typical GPU pods (0 without GPU pods).
        self.cpu_per_gpu_milli = sum(c * p for c, _, p in gpu_pods) / gpu_weight if gpu_weight else 0.0
        self.milli = np.array([k[0] for k in keys], dtype=np.int64)  # [S]
        self.num = np.array([k[1] for k in keys], dtype=np.int64)  # [S]
        self.p_group = np.array([sum(p for _, p in groups[k]) for k in keys])  # [S]
        # A_s(c): breakpoints = every typical CPU; table[k, s] = sum of p_t in s with cpu_t <= breaks[k-1].
        self.breaks = np.array(sorted({c for k in keys for c, _ in groups[k]}), dtype=np.int64)
        table = np.zeros((len(self.breaks) + 1, len(keys)))
        for j, k in enumerate(keys):
            for c, p in groups[k]:
                table[np.searchsorted(self.breaks, c) + 1 :, j] += p
        self.a_table = table
        # allowed[m + 1, s]: GPU model m may host shape s (row 0: absent slot, never).
        nm = len(state.model_names)
        allowed = np.zeros((nm + 1, len(keys)), dtype=bool)
        for j, k in enumerate(keys):
            for m, name in enumerate(state.model_names):
                allowed[m + 1, j] = not k[2] or name in k[2]
        self.allowed_by_model = allowed
        n = state.num_nodes
        self.cnt = np.zeros((n, len(keys)), dtype=np.int64)
        self.small = np.zeros((n, len(keys)), dtype=np.int64)
        self.access = np.zeros((n, len(keys)), dtype=bool)
        self.frag = np.zeros(n)
        self._version = np.full(n, -1, dtype=np.int64)

    def refresh(self) -> None:
        """Recompute the rows of nodes changed since the last call."""
        rows = np.flatnonzero(self._version != self.state.version)
        if rows.size == 0:
            return
        st = self.state
        free = st.gpu_free[rows][:, :, None]  # [R, G, 1]
        allowed = self.allowed_by_model[st.gpu_model[rows] + 1]  # [R, G, S]
        fits = allowed & (free >= self.milli)
        self.cnt[rows] = fits.sum(axis=1)
        self.small[rows] = np.where(fits, 0, free).sum(axis=1)
        self.access[rows] = allowed.any(axis=1)
        total = st.gpu_free[rows].sum(axis=1)
        self.frag[rows] = self._node_frag(
            self.cnt[rows], self.small[rows], self.access[rows], total, st.cpu_free[rows]
        )
        self._version[rows] = st.version[rows]

    def _node_frag(self, cnt, small, access, total, cpu) -> np.ndarray:
        """F for nodes with the given per-shape counts, small sums, access, total free milli and free CPU."""
        a = self.a_table[np.searchsorted(self.breaks, cpu, side="right")]  # [K, S]
        total = total.astype(float)[..., None]
        fits = access & (cnt >= self.num)
        per_group = np.where(fits, small * a + total * (self.p_group - a), total * self.p_group)
        return per_group.sum(axis=-1) + total[..., 0] * self.p_nogpu

    def cluster_frag(self) -> float:
        """Fragmented GPU milli of the live cluster."""
        self.refresh()
        return float(self.frag[self.state.alive].sum())

    def after(self, nodes: np.ndarray, gpus: np.ndarray, gpu_milli: int, cpu: int) -> np.ndarray:
        """F of each candidate node after taking ``gpu_milli`` on each of its GPUs ``gpus`` and ``cpu``.

        Args:
            nodes: ``[K]`` node indices.
            gpus: ``[K, k]`` GPU indices taken on each candidate (``k = 0`` for CPU-only requests).
            gpu_milli: milli-GPU taken on each listed GPU.
            cpu: milli-CPU taken.
        Returns:
            ``[K]`` fragmentation after the placement.
        """
        self.refresh()
        st = self.state
        cnt, small = self.cnt[nodes], self.small[nodes]
        total = st.gpu_free[nodes].sum(axis=1)
        if gpus.shape[1]:
            old = st.gpu_free[nodes[:, None], gpus][:, :, None]  # [K, k, 1]
            new = old - gpu_milli
            allowed = self.allowed_by_model[st.gpu_model[nodes[:, None], gpus] + 1]  # [K, k, S]
            fit_old, fit_new = allowed & (old >= self.milli), allowed & (new >= self.milli)
            cnt = cnt + (fit_new.astype(np.int64) - fit_old).sum(axis=1)
            small = small + (np.where(fit_new, 0, new) - np.where(fit_old, 0, old)).sum(axis=1)
            total = total - gpu_milli * gpus.shape[1]
        return self._node_frag(cnt, small, self.access[nodes], total, st.cpu_free[nodes] - cpu)

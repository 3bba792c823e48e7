"""Trace replay with the FGD simulator's protocol (hkust-adsl/kubernetes-scheduler-simulator).

Protocol (``openb`` pod lists: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...``):

1. Typical pods come from the original pod list (95% coverage, CPU-only pods included).
2. Pods sorted by name are shuffled with the seed; random copies of the original pods are then
   appended while the requested GPU capacity stays within ``inflate`` x the cluster's (as in the
   simulator, the stop test adds the copy's per-GPU milli, the total adds all its GPUs); a
   workload already above that loses random pods until it is within.
3. All nodes start empty; pods arrive one at a time and never leave; a pod that fits nowhere fails
   and is skipped.
4. After every pod the allocated GPU milli is recorded against the arrived GPU milli; the curve
   at ``k`` % arrived is the mean allocation of the pods whose arrival rounds to ``k`` %.

The simulator breaks score ties with Go's random source; here a numpy generator seeded with the
same seed does it, so results agree in distribution (mean over seeds), not pod by pod.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infra.common.csv_rows import count, read_rows
from infra.scheduler.frag import FragModel, PodShape, TypicalPods
from infra.scheduler.node_scoring import Demand, Policy
from infra.scheduler.resources import MILLI, Alloc, ClusterState

CURVE_POINTS = 131
"""Arrival percentages 0..130 at which curves are reported."""


@dataclass(frozen=True)
class Pod:
    """One pod of a trace."""

    name: str
    cpu: int
    mem: int
    num_gpu: int
    gpu_milli: int
    models: frozenset[str]

    @property
    def shape(self) -> PodShape:
        """Request shape (typical-pod key)."""
        return (self.cpu, self.gpu_milli, self.num_gpu, self.models)

    @property
    def total_gpu_milli(self) -> int:
        """All milli-GPU the pod takes."""
        return self.num_gpu * self.gpu_milli

    def demand(self) -> Demand:
        """The pod as a placement demand."""
        return Demand(self.cpu, self.mem, self.num_gpu, self.gpu_milli, self.models)


def read_pods(path: str | Path) -> list[Pod]:
    """Read an openb pod list; pods are returned sorted by name.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        infra.common.csv_rows.RowError: A column is missing, or a row's value is not usable (named by file and line).
    """
    pods = []
    for place, row in read_rows(path, {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}, "Pod list", "--pods"):
        num, milli = count(row, "num_gpu", place), count(row, "gpu_milli", place)
        if num == 0:
            milli = 0
        spec = frozenset(x for x in (row.get("gpu_spec") or "").split("|") if x)
        pods.append(Pod(row["name"], count(row, "cpu_milli", place), count(row, "memory_mib", place), num,
                        min(milli, MILLI), spec))
    if not pods:
        raise ValueError(f"Pod list {path} has no pods.")
    return sorted(pods, key=lambda p: p.name)


VARIANTS = ("gpushare", "multigpu", "gpuspec", "cpuheavy")
"""Workload variants: more GPU sharing, more multi-GPU pods, GPU-model constraints (after the FGD
paper's), and more CPU-heavy GPU pods."""


def make_variant(pods: list[Pod], kind: str, fraction: float, models: list[str], seed: int) -> list[Pod]:
    """A workload of the same columns with one property changed, drawn reproducibly from ``pods``.

    Args:
        pods: the original pods.
        kind: ``gpushare``: ``fraction`` of the GPU pods share a GPU (whole-GPU pods are replaced by
            copies of random sharing pods); ``multigpu``: ``fraction`` of the GPU pods ask for 2, 4
            or 8 GPUs (single-GPU pods replaced by copies of random multi-GPU pods); ``gpuspec``:
            ``fraction`` of the GPU pods may only use one GPU model, drawn from ``models`` in
            proportion to how often it appears there (one entry per GPU of the cluster);
            ``cpuheavy``: ``fraction`` of the GPU pods ask for more than twice the workload's mean
            CPU per GPU (other GPU pods replaced by copies of random such pods).
        fraction: the target share of GPU pods, in [0, 1].
        models: GPU models of the cluster, one entry per GPU (``gpuspec`` only).
        seed: seeds the random choices.
    """
    if kind not in VARIANTS:
        raise ValueError(f"unknown workload variant {kind!r}; choose one of {VARIANTS}.")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"variant fraction {fraction} must be in [0, 1].")
    rng = np.random.default_rng(seed)
    out = list(pods)
    gpu_idx = [i for i, p in enumerate(out) if p.num_gpu]
    want = round(fraction * len(gpu_idx))

    def replace_with(pool: list[Pod], victims: list[int]) -> None:
        if not pool:
            raise ValueError(f"variant {kind}: the workload has no pods of the kind to copy.")
        for i in victims:
            src = pool[int(rng.integers(len(pool)))]
            out[i] = Pod(out[i].name, src.cpu, src.mem, src.num_gpu, src.gpu_milli, src.models)

    if kind == "gpuspec":
        if not models:
            raise ValueError("variant gpuspec needs the cluster's GPU models (one entry per GPU).")
        for i in rng.choice(gpu_idx, size=want, replace=False):
            p = out[i]
            out[i] = Pod(
                p.name,
                p.cpu,
                p.mem,
                p.num_gpu,
                p.gpu_milli,
                frozenset({models[int(rng.integers(len(models)))]}),
            )
        return out
    ratio = sum(out[i].cpu for i in gpu_idx) / max(1, sum(out[i].total_gpu_milli for i in gpu_idx))
    is_kind = {
        "gpushare": lambda p: p.gpu_milli < MILLI,
        "multigpu": lambda p: p.num_gpu > 1,
        "cpuheavy": lambda p: p.cpu > 2 * ratio * p.total_gpu_milli,
    }[kind]
    have = [i for i in gpu_idx if is_kind(out[i])]
    others = [i for i in gpu_idx if not is_kind(out[i])]
    if kind == "multigpu":
        others = [i for i in others if out[i].gpu_milli == MILLI]
    pool = [out[i] for i in have]
    need = max(0, want - len(have))
    replace_with(pool, [int(i) for i in rng.choice(others, size=min(need, len(others)), replace=False)])
    return out


def arrival_sequence(pods: list[Pod], capacity_milli: int, inflate: float, seed: int) -> list[Pod]:
    """Shuffle ``pods`` with ``seed``, then append random copies up to (or drop random pods down to)
    ``inflate`` x capacity (step 2)."""
    if not (math.isfinite(inflate) and inflate > 0):
        raise ValueError(f"inflate={inflate} must be a finite number > 0 (1.3 replays 130% of the GPU capacity).")
    if not any(p.gpu_milli for p in pods):
        raise ValueError("the pod list has no GPU pods: there is no GPU demand to inflate; give a list with GPU pods.")
    rng = np.random.default_rng(seed)
    seq = [pods[i] for i in rng.permutation(len(pods))]
    total = sum(p.total_gpu_milli for p in pods)
    target = inflate * capacity_milli
    while total > target:  # a workload above the target loses random pods instead
        total -= seq.pop(int(rng.integers(len(seq)))).total_gpu_milli
    if total < sum(p.total_gpu_milli for p in pods):
        return seq
    while True:
        p = pods[int(rng.integers(len(pods)))]
        if total + p.gpu_milli > target:
            return seq
        seq.append(p)
        total += p.total_gpu_milli


@dataclass
class ReplayResult:
    """Outcome of one replay.

    Attributes:
        alloc_curve, frag_curve: ``[131]`` allocation % and fragmentation % of GPU capacity at
            0..130 % arrived (NaN where no pod arrived near that point).
        failed: pods that fit nowhere.
        latencies_ns: ``[P]`` wall-clock decision time of each pod (the fastest of
            ``timing_repeats`` identical decisions).
        arrived_pct, alloc_pct: ``[P]`` raw series after each pod.
    """

    alloc_curve: np.ndarray
    frag_curve: np.ndarray
    failed: int
    latencies_ns: np.ndarray
    arrived_pct: np.ndarray
    alloc_pct: np.ndarray


def bin_curve(arrived_pct: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Mean of ``values`` per integer arrival % (0..130); a point with no pod uses +-1 %, else NaN."""
    key = np.round(arrived_pct)
    out = np.full(CURVE_POINTS, np.nan)
    for k in range(CURVE_POINTS):
        sel = key == k
        if not sel.any():
            sel = (key >= k - 1) & (key <= k + 1)
        if sel.any():
            out[k] = values[sel].mean()
    return out


def replay(
    state: ClusterState,
    sequence: list[Pod],
    policy: Policy,
    typical: TypicalPods,
    seed: int,
    progress=None,
    timing_repeats: int = 1,
) -> ReplayResult:
    """Place ``sequence`` one pod at a time on an emptied ``state`` with ``policy``.

    Args:
        state: the cluster; it is reset first and holds the final placement afterwards.
        sequence: arriving pods (see ``arrival_sequence``).
        policy: the placement policy.
        typical: typical pods for the fragmentation metric.
        seed: seeds the tie-breaking generator.
        progress: optional callable ``progress(i)`` called every 1000 pods.
        timing_repeats: time each decision this many times (the decision itself is made once) and
            keep the fastest, which on a shared machine removes waits for a core from the figure.
    """
    state.reset()
    rng = np.random.default_rng(seed + 1_000_003)
    state.tie_rank = rng.permutation(state.num_nodes)
    metric = FragModel(state, typical)
    capacity = state.total_gpu_milli()
    n = len(sequence)
    lat = np.zeros(n, dtype=np.int64)
    spare = np.random.default_rng(0)  # repeats must not consume the replay's generator
    arrived = np.zeros(n)
    used = np.zeros(n)
    frag = np.zeros(n)
    failed = 0
    arrived_milli = used_milli = 0
    for i, pod in enumerate(sequence):
        arrived_milli += pod.total_gpu_milli
        d = pod.demand()
        t0 = time.perf_counter_ns()
        choice = policy.choose(state, d, rng)
        lat[i] = time.perf_counter_ns() - t0
        for _ in range(timing_repeats - 1):  # same decision again; keep the fastest (least disturbed)
            t0 = time.perf_counter_ns()
            policy.choose(state, d, spare)
            lat[i] = min(lat[i], time.perf_counter_ns() - t0)
        if choice is None:
            failed += 1
        else:
            state.allocate(Alloc(choice.node, choice.gpus, d.gpu_milli, d.cpu, d.mem))
            used_milli += pod.total_gpu_milli
        arrived[i], used[i] = arrived_milli, used_milli
        frag[i] = metric.cluster_frag()
        if progress is not None and i % 1000 == 0:
            progress(i)
    arrived_pct = 100.0 * arrived / capacity
    alloc_pct = 100.0 * used / capacity
    return ReplayResult(
        alloc_curve=bin_curve(arrived_pct, alloc_pct),
        frag_curve=bin_curve(arrived_pct, 100.0 * frag / capacity),
        failed=failed,
        latencies_ns=lat,
        arrived_pct=arrived_pct,
        alloc_pct=alloc_pct,
    )

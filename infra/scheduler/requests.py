"""Requests: gangs of bundles (all or nothing) with constraints, and their validation at submission.

A ``Bundle`` is what one service (one actor) needs on one node: CPU, memory, and either a number of
whole GPUs or a fraction of one GPU, optionally restricted to some GPU models. A ``GangRequest``
is a list of bundles placed all together or not at all, plus constraints between its bundles and
against services already placed, a priority, and for elastic gangs a minimum size.

Every check happens in ``validate`` before anything is placed; an invalid request raises
``RequestError`` naming the problem and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.common.limits import short
from infra.scheduler.resources import MILLI, ClusterState

MAX_BUNDLES = 4096
"""Most bundles one gang may hold: every verb of the service walks a gang's bundles, so one huge gang
slows every later call (a 200k-bundle gang took 20 s to submit)."""
MAX_NAME = 200
"""Longest gang name."""


class RequestError(ValueError):
    """A request that can never be placed as written (too large, unknown model, bad constraint ...)."""


@dataclass(frozen=True)
class Bundle:
    """Resources of one service on one node.

    Attributes:
        cpu_milli: CPU in milli-cores (> 0).
        memory_mib: memory in MiB (> 0).
        gpus: number of whole GPUs (0 for none); exclusive of ``gpu_fraction``.
        gpu_fraction: a share of one GPU in milli-GPU (1..999), or 0 for none.
        gpu_models: allowed GPU models; empty means any model.
        gpu_memory_mib: device memory needed on each GPU (0: no requirement); GPUs of unknown
            memory are accepted.
        name: a label for logs and events (optional).
    """

    cpu_milli: int
    memory_mib: int
    gpus: int = 0
    gpu_fraction: int = 0
    gpu_models: frozenset[str] = frozenset()
    gpu_memory_mib: int = 0
    name: str = ""

    @property
    def num_gpu(self) -> int:
        """GPUs touched: the whole-GPU count, or 1 for a fraction."""
        return self.gpus if self.gpus else (1 if self.gpu_fraction else 0)

    @property
    def gpu_milli(self) -> int:
        """Milli-GPU taken on each touched GPU (1000 for whole GPUs)."""
        return MILLI if self.gpus else self.gpu_fraction

    @property
    def total_gpu_milli(self) -> int:
        """All milli-GPU taken by the bundle."""
        return self.num_gpu * self.gpu_milli


@dataclass(frozen=True)
class SameGPU:
    """The listed bundles (fractions) share one GPU; with ``service``, the GPU of that placed service."""

    bundles: tuple[int, ...]
    service: str | None = None


@dataclass(frozen=True)
class SameNode:
    """The listed bundles run on one node; with ``service``, the node of that placed service."""

    bundles: tuple[int, ...]
    service: str | None = None


@dataclass(frozen=True)
class DifferentNodes:
    """The listed bundles run on pairwise different nodes, and not on the nodes of ``services``."""

    bundles: tuple[int, ...]
    services: tuple[str, ...] = ()


@dataclass(frozen=True)
class PinGPUs:
    """Bundle ``bundle`` runs on node ``node`` using only GPU indices in ``gpus``."""

    bundle: int
    node: str
    gpus: tuple[int, ...]


Constraint = SameGPU | SameNode | DifferentNodes | PinGPUs


@dataclass(frozen=True)
class GangRequest:
    """A gang: bundles placed all together or not at all.

    Attributes:
        name: unique id of the gang (services are named ``f"{name}/{i}"`` after bundle ``i``).
        bundles: the bundles.
        constraints: relations between bundles and with placed services.
        priority: higher runs first and may preempt lower (default 0).
        min_bundles: for an elastic gang, the fewest bundles it accepts (None: all of them);
            the gang then runs with as many bundles as fit, between ``min_bundles`` and ``len(bundles)``.
        tenant: who pays: GPU quotas (``infra.scheduler.quota``) are per tenant.
        timeout_s: longest wait in the queue (each time it waits) before the gang fails with the
            reason it could not be placed (None: waits for ever).
        grace_s: seconds a preempted gang has between the notice and the forced stop, to
            checkpoint and stop by itself (0: stopped at once).
        labels: free-form annotations (not compared).
    """

    name: str
    bundles: tuple[Bundle, ...]
    constraints: tuple[Constraint, ...] = ()
    priority: int = 0
    min_bundles: int | None = None
    tenant: str = "default"
    timeout_s: float | None = None
    grace_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def min_size(self) -> int:
        """Fewest bundles the gang runs with."""
        return len(self.bundles) if self.min_bundles is None else self.min_bundles

    @property
    def shape_key(self) -> tuple:
        """Everything that decides where the gang fits (all but its name, timing and labels)."""
        return (self.bundles, self.constraints, self.min_bundles, self.tenant)

    def gpu_milli(self, size: int | None = None) -> int:
        """Milli-GPU of the first ``size`` bundles (all of them by default)."""
        return sum(b.total_gpu_milli for b in self.bundles[: len(self.bundles) if size is None else size])


def validate_bundle(b: Bundle, state: ClusterState, where: str) -> None:
    """Raise ``RequestError`` if ``b`` is malformed or larger than every node of ``state``."""
    if b.cpu_milli <= 0 or b.memory_mib <= 0:
        raise RequestError(
            f"{where}: cpu_milli={b.cpu_milli}, memory_mib={b.memory_mib}; both must be positive "
            "(ask for at least 1 milli-core and 1 MiB)."
        )
    if b.gpus < 0 or b.gpu_fraction < 0 or b.gpu_memory_mib < 0:
        raise RequestError(
            f"{where}: negative GPU amount (gpus={b.gpus}, gpu_fraction={b.gpu_fraction}, "
            f"gpu_memory_mib={b.gpu_memory_mib}); use 0 for none."
        )
    if b.gpus and b.gpu_fraction:
        raise RequestError(
            f"{where}: both gpus={b.gpus} and gpu_fraction={b.gpu_fraction} given; "
            "ask for whole GPUs (gpus) or a share of one GPU (gpu_fraction), not both."
        )
    if b.gpu_fraction >= MILLI:
        raise RequestError(
            f"{where}: gpu_fraction={b.gpu_fraction} is a whole GPU or more; use gpus={b.gpu_fraction // MILLI} "
            f"for whole GPUs (gpu_fraction is in milli-GPU, 1..{MILLI - 1})."
        )
    unknown = set(b.gpu_models) - set(state.model_names)
    if unknown:
        raise RequestError(
            f"{where}: unknown GPU model(s) {sorted(unknown)}; the cluster has {list(state.model_names)}."
        )
    if b.gpu_models and not b.num_gpu:
        raise RequestError(
            f"{where}: gpu_models={sorted(b.gpu_models)} given without any GPU; drop gpu_models or ask for a GPU."
        )
    alive = state.alive
    fits_cpu = (state.cpu_cap >= b.cpu_milli) & (state.mem_cap >= b.memory_mib) & alive
    if not fits_cpu.any():
        raise RequestError(
            f"{where}: needs cpu_milli={b.cpu_milli}, memory_mib={b.memory_mib} but the largest live node has "
            f"cpu_milli={int(state.cpu_cap[alive].max(initial=0))}, memory_mib={int(state.mem_cap[alive].max(initial=0))}; "
            "split the work into smaller bundles."
        )
    if b.gpu_memory_mib and not b.num_gpu:
        raise RequestError(
            f"{where}: gpu_memory_mib={b.gpu_memory_mib} given without any GPU; drop it or ask for a GPU."
        )
    if b.gpu_memory_mib and not (state.model_mask(b.gpu_models) & state.memory_mask(b.gpu_memory_mib)).any():
        biggest = int(state.gpu_mem[state.model_mask(b.gpu_models)].max(initial=0))
        raise RequestError(
            f"{where}: needs {b.gpu_memory_mib} MiB of GPU memory per GPU but the largest allowed GPU has {biggest} MiB; "
            "shard the model over more GPUs, shrink the batch, or allow larger GPU models."
        )
    if b.num_gpu:
        gpus_ok = (state.model_mask(b.gpu_models) & state.memory_mask(b.gpu_memory_mib)).sum(axis=1)
        fits = fits_cpu & (gpus_ok >= b.num_gpu)
        if not fits.any():
            models = sorted(b.gpu_models) or "any model"
            raise RequestError(
                f"{where}: needs {b.num_gpu} GPU(s) of {models} with cpu_milli={b.cpu_milli}, memory_mib={b.memory_mib} "
                f"on one node, but no live node has that many (most on one node: {int(gpus_ok[fits_cpu].max(initial=0))}); "
                "ask for fewer GPUs per bundle or allow more models."
            )


def check_bounds(req: GangRequest) -> None:
    """The sizes of ``req`` that cost every later call (name, bundles), checked before it is stored anywhere."""
    if not isinstance(req.name, str) or not req.name:
        raise RequestError("GangRequest.name is empty: give every gang a unique name.")
    if len(req.name) > MAX_NAME or not req.name.isprintable():
        raise RequestError(f"gang name {short(req.name)} is unprintable or over {MAX_NAME} characters: name it shorter.")
    if len(req.bundles) > MAX_BUNDLES:
        raise RequestError(f"gang {req.name!r} has {len(req.bundles)} bundles, over the {MAX_BUNDLES} one gang may "
                           "hold: split it into several gangs.")


def validate(
    req: GangRequest,
    state: ClusterState,
    services: dict[str, tuple[int, tuple[int, ...]]],
    checked: set[Bundle] | None = None,
) -> None:
    """Check a gang before placement; raise ``RequestError`` naming the problem and the fix.

    Args:
        req: the gang.
        state: the cluster (capacities, models, live nodes).
        services: placed services by name -> (node index, GPU indices), for constraints naming them.
        checked: bundles already known valid on this cluster (skipped; the valid ones are added).
    """
    check_bounds(req)
    _check_shape(req)
    for i, b in enumerate(req.bundles):
        if checked is None or b not in checked:
            validate_bundle(b, state, f"gang {req.name!r} bundle {i}")
            if checked is not None:
                checked.add(b)
    if req.min_bundles is not None and req.constraints:
        raise RequestError(
            f"gang {req.name!r}: elastic gangs (min_bundles) take no constraints here; "
            "place constrained services as a fixed-size gang."
        )
    for c in req.constraints:
        _check_constraint(req, c, state, services)
    _check_contradictions(req)


def _check_shape(req: GangRequest) -> None:
    """The gang's timing (``grace_s``, ``timeout_s``), its bundles (at least one) and ``min_bundles``."""
    if req.grace_s < 0 or (req.timeout_s is not None and req.timeout_s <= 0):
        raise RequestError(
            f"gang {req.name!r}: grace_s={req.grace_s} must be >= 0 and timeout_s={req.timeout_s} > 0 (or None)."
        )
    if not req.bundles:
        raise RequestError(f"gang {req.name!r} has no bundles: give at least one Bundle.")
    n = len(req.bundles)
    if not 1 <= req.min_size <= n:
        raise RequestError(
            f"gang {req.name!r}: min_bundles={req.min_bundles} must be between 1 and {n} (the number of bundles)."
        )


def _check_constraint(
    req: GangRequest, c: Constraint, state: ClusterState, services: dict[str, tuple[int, tuple[int, ...]]]
) -> None:
    """One constraint of ``req``: the bundles and placed services it names, then what its kind needs."""
    n = len(req.bundles)
    idx = (c.bundle,) if isinstance(c, PinGPUs) else c.bundles
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        raise RequestError(
            f"gang {req.name!r}: constraint {c} names bundles {bad}; valid indices are 0..{n - 1}."
        )
    named = [c.service] if isinstance(c, SameGPU | SameNode) and c.service else []
    named += list(c.services) if isinstance(c, DifferentNodes) else []
    missing = [s for s in named if s not in services]
    if missing:
        raise RequestError(
            f"gang {req.name!r}: constraint {c} names services {missing} that are not placed; place them first."
        )
    if isinstance(c, SameGPU):
        _check_same_gpu(req, idx, state)
    if isinstance(c, PinGPUs):
        _check_pin(req, c, state)


def _check_same_gpu(req: GangRequest, idx: tuple[int, ...], state: ClusterState) -> None:
    """Bundles ``idx`` that share one GPU: fractions of one model that fit it together, memory included."""
    whole = [i for i in idx if req.bundles[i].gpus or not req.bundles[i].gpu_fraction]
    if whole:
        raise RequestError(
            f"gang {req.name!r}: SameGPU needs GPU fractions, but bundles {whole} are not fractions."
        )
    if sum(req.bundles[i].gpu_fraction for i in idx) > MILLI:
        raise RequestError(
            f"gang {req.name!r}: SameGPU bundles {list(idx)} ask for more than one whole GPU together."
        )
    if len(set(req.bundles[i].gpu_models for i in idx)) > 1:
        raise RequestError(
            f"gang {req.name!r}: SameGPU bundles {list(idx)} allow different GPU models; make them equal."
        )
    need = sum(req.bundles[i].gpu_memory_mib for i in idx)
    allowed = state.model_mask(req.bundles[idx[0]].gpu_models)
    if need and not (allowed & state.memory_mask(need)).any():
        raise RequestError(
            f"gang {req.name!r}: SameGPU bundles {list(idx)} need {need} MiB of GPU memory together but "
            f"the largest allowed GPU has {int(state.gpu_mem[allowed].max(initial=0))} MiB; "
            "spread them over several GPUs or allow larger GPU models."
        )


def _check_pin(req: GangRequest, c: PinGPUs, state: ClusterState) -> None:
    """A pin's node (in the cluster), its GPU indices (on that node) and their number (the bundle's GPUs)."""
    if c.node not in state.node_index:
        raise RequestError(
            f"gang {req.name!r}: PinGPUs names node {c.node!r}, which is not in the cluster."
        )
    count = int(state.gpu_count[state.node_index[c.node]])
    if not c.gpus or any(not 0 <= g < count for g in c.gpus):
        raise RequestError(
            f"gang {req.name!r}: PinGPUs gpus={c.gpus} on node {c.node!r}; valid indices are 0..{count - 1}."
        )
    if len(c.gpus) < req.bundles[c.bundle].num_gpu:
        raise RequestError(
            f"gang {req.name!r}: PinGPUs gives {len(c.gpus)} GPUs to bundle {c.bundle}, which needs "
            f"{req.bundles[c.bundle].num_gpu}; widen the range."
        )


def _check_contradictions(req: GangRequest) -> None:
    """Same-node groups versus different-node pairs and pins to different nodes."""
    parent = list(range(len(req.bundles)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for c in req.constraints:
        if isinstance(c, SameGPU | SameNode):
            for i in c.bundles[1:]:
                parent[root(i)] = root(c.bundles[0])
    for c in req.constraints:
        if isinstance(c, DifferentNodes):
            roots = [root(i) for i in c.bundles]
            if len(set(roots)) != len(roots) or len(set(c.bundles)) != len(c.bundles):
                raise RequestError(
                    f"gang {req.name!r}: bundles {list(c.bundles)} must be on different nodes but are also required "
                    "on the same node (SameNode/SameGPU); drop one of the two constraints."
                )
    pins: dict[int, str] = {}
    for c in req.constraints:
        if isinstance(c, PinGPUs):
            r = root(c.bundle)
            if pins.setdefault(r, c.node) != c.node:
                raise RequestError(
                    f"gang {req.name!r}: bundles pinned to nodes {pins[r]!r} and {c.node!r} must share a node; "
                    "pin them to the same node or drop SameNode/SameGPU."
                )

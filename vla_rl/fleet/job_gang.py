"""The training job as one gang request of infra's scheduler, per placement mode.

Bundle order: shards ``0 .. S-1``, then the inference server (``S``), then the trainer (``S + 1``);
in ``data_parallel`` mode ranks ``0 .. N-1`` (``fleet.num_gpus``), one whole GPU each.

=================  ================================================================================
mode               constraints between bundles
=================  ================================================================================
``colocated``      every GPU-using bundle on one GPU (``SameGPU``), CPU-only ones on its node
``pipelined``      as ``colocated`` (the overlap comes from the shards' stages, not the placement)
``disaggregated``  shards and inference share a GPU; the trainer takes whole GPUs of its own
``data_parallel``  none: every rank takes one whole GPU, on any node (NCCL or gloo joins them)
=================  ================================================================================

A component pinned in the config (``node``, ``gpu_ids``) adds a ``PinGPUs``. What cannot be placed
raises :class:`PlacementError` naming the component and the fix: :func:`check_fits` while the config is
validated (what is known without placing: the request against ``fleet.cluster``'s sizes), :func:`place_job`
when a job on a local cluster starts, before Ray does (whether the gang packs onto the nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.common.typed_config import ConfigError
from infra.scheduler import (
    GPU,
    Bundle,
    Cluster,
    GangRequest,
    Node,
    PinGPUs,
    Placement,
    RequestError,
    SameGPU,
    SameNode,
    Scheduler,
)
from infra.scheduler.requests import validate as validate_request
from infra.scheduler.resources import ClusterState
from vla_rl.fleet.section import ClusterSpec, ComponentPlacement, FleetConfig, resolved_placement


class PlacementError(ConfigError):
    """The job's components cannot be placed as configured; the message names the fix."""


@dataclass(frozen=True)
class JobLayout:
    """The gang of a job and which component each bundle is.

    Attributes:
        gang: the request submitted to the scheduler.
        roles: per bundle, ``("shard", k)``, ``("inference", 0)``, ``("trainer", 0)`` or ``("rank", r)``.
    """

    gang: GangRequest
    roles: tuple[tuple[str, int], ...]

    def bundle(self, role: str, index: int = 0) -> int:
        """Bundle index of component ``role`` (shard ``index``)."""
        return self.roles.index((role, index))


def cluster_of(spec: ClusterSpec) -> Cluster:
    """The infra ``Cluster`` that ``fleet.cluster`` describes."""
    return Cluster(
        tuple(
            Node(name, spec.cpus * 1000, spec.memory_mib, tuple(GPU(spec.gpu_model) for _ in range(spec.gpus)))
            for name in spec.node_names
        )
    )


def _bundle(comp: ComponentPlacement, name: str) -> Bundle:
    share = comp.gpu or 0.0
    whole = int(share) if share >= 1 else 0
    fraction = 0 if whole else round(share * 1000)
    return Bundle(
        cpu_milli=max(1, round(comp.cpus * 1000)),
        memory_mib=comp.memory_mib,
        gpus=whole,
        gpu_fraction=fraction,
        name=name,
    )


def _share_constraints(bundles: tuple[Bundle, ...], idx: list[int]) -> list[SameGPU | SameNode]:
    """Bundles ``idx`` share one GPU where they all take fractions that fit it, else one node."""
    fractional = [i for i in idx if bundles[i].gpu_fraction]
    constraints: list[SameGPU | SameNode] = []
    if len(fractional) > 1 and sum(bundles[i].gpu_fraction for i in fractional) <= 1000:
        constraints.append(SameGPU(tuple(fractional)))
    if len(idx) > 1:
        constraints.append(SameNode(tuple(idx)))
    return constraints


def job_request(fleet: FleetConfig, name: str) -> JobLayout:
    """Translate the ``fleet`` section into one gang request (see the module docstring); its priority,
    tenant, grace period and queue timeout are ``fleet``'s.

    Raises:
        PlacementError: ``fleet.mode`` is ``inprocess`` (nothing to place).
    """
    if fleet.mode == "inprocess":
        raise PlacementError("fleet.mode=inprocess places nothing; pick colocated, disaggregated, pipelined or data_parallel")
    comps = resolved_placement(fleet)
    if fleet.mode == "data_parallel":  # every rank is a whole trainer, placed as fleet.trainer
        roles = [("rank", r) for r in range(fleet.num_gpus)]
        comps["rank"] = comps["trainer"]
    else:
        roles = [("shard", k) for k in range(fleet.shards)] + [("inference", 0), ("trainer", 0)]
    bundles = tuple(_bundle(comps[role], f"{role}{k if role in ('shard', 'rank') else ''}") for role, k in roles)
    everything = list(range(len(bundles)))
    if fleet.mode == "data_parallel":
        constraints: list = []
    elif fleet.mode == "disaggregated":
        constraints = _share_constraints(bundles, everything[:-1])
    else:
        constraints = _share_constraints(bundles, everything)
    for i, (role, _) in enumerate(roles):
        comp = comps[role]
        if comp.node:
            gpus = comp.gpu_ids or tuple(range(fleet.cluster.gpus))
            if not gpus:
                raise PlacementError(
                    f"fleet.{role}.node={comp.node!r}: pinning to a node needs GPU indices, and the nodes have no GPUs; "
                    "drop the pin"
                )
            constraints.append(PinGPUs(i, comp.node, gpus))
    gang = GangRequest(name, bundles, tuple(constraints), priority=fleet.priority, tenant=fleet.tenant,
                       timeout_s=fleet.queue_timeout_s, grace_s=fleet.grace_s)
    return JobLayout(gang, tuple(roles))


def _refused(fleet: FleetConfig, exc: RequestError) -> PlacementError:
    """The one-line error of a gang request that the scheduler refuses for ``fleet.cluster``."""
    return PlacementError(f"fleet placement of {fleet.mode!r} mode: {exc} (see the fleet.* placement fields)")


def _misfit(fleet: FleetConfig, layout: JobLayout, why: str) -> PlacementError:
    """The one-line error of a job that does not fit ``fleet.cluster`` (``why``: what does not fit)."""
    demand = ", ".join(f"{b.name}: gpu_milli={b.total_gpu_milli} cpu_milli={b.cpu_milli}" for b in layout.gang.bundles)
    return PlacementError(
        f"fleet mode {fleet.mode!r} does not fit fleet.cluster ({fleet.cluster.nodes} node(s) x "
        f"{fleet.cluster.gpus} GPU(s), {fleet.cluster.cpus} CPUs) {why}; demand: {demand}. "
        "Lower fleet.<component>.gpu / cpus, use fewer shards, or add GPUs/nodes to fleet.cluster"
    )


def _node_groups(gang: GangRequest) -> list[list[int]]:
    """The bundles that ``SameGPU``/``SameNode`` constraints tie to one node, as lists of bundle indices."""
    label = list(range(len(gang.bundles)))
    for c in gang.constraints:
        if isinstance(c, SameGPU | SameNode):
            tied = {label[i] for i in c.bundles}
            label = [min(tied) if g in tied else g for g in label]
    return [[i for i, g in enumerate(label) if g == root] for root in sorted(set(label))]


def _demand(bundles: list[Bundle]) -> tuple[int, int, int]:
    """``(cpu_milli, memory_mib, GPUs)`` that ``bundles`` need at least: GPU fractions count as the fewest
    whole GPUs that hold them."""
    whole = sum(b.gpus for b in bundles)
    fractions = sum(b.gpu_fraction for b in bundles)
    return sum(b.cpu_milli for b in bundles), sum(b.memory_mib for b in bundles), whole - (-fractions // 1000)


def check_fits(fleet: FleetConfig) -> None:
    """Check the job against ``fleet.cluster``'s declared sizes without placing it: the gang is a valid request
    for that cluster (every bundle fits a node, pins name its GPUs: ``infra.scheduler.requests.validate``), each
    group of bundles tied to one node fits one node, and the whole gang fits the cluster's totals (CPUs, memory,
    GPUs). Whether it packs onto the nodes is :func:`place_job`'s, when the job starts.

    Raises:
        PlacementError: the first misfit, naming the demand and the fix.
    """
    layout = job_request(fleet, "job")
    spec = fleet.cluster
    try:
        validate_request(layout.gang, ClusterState(cluster_of(spec)), {})
    except RequestError as exc:
        raise _refused(fleet, exc) from exc
    node = (spec.cpus * 1000, spec.memory_mib, spec.gpus)
    for group in _node_groups(layout.gang):
        need = _demand([layout.gang.bundles[i] for i in group])
        if any(n > c for n, c in zip(need, node, strict=True)):
            names = ", ".join(layout.gang.bundles[i].name for i in group)
            raise _misfit(fleet, layout, f"with its constraints: {names} share one node and need cpu_milli={need[0]}, "
                                         f"memory_mib={need[1]}, {need[2]} GPU(s) there")
    need = _demand(list(layout.gang.bundles))
    if any(n > c * spec.nodes for n, c in zip(need, node, strict=True)):
        raise _misfit(fleet, layout, f"in total: the job needs cpu_milli={need[0]}, memory_mib={need[1]}, {need[2]} GPU(s)")


def place_job(fleet: FleetConfig, name: str, scheduler: Scheduler | None = None) -> tuple[Scheduler, Placement, JobLayout]:
    """Submit the job's gang to ``scheduler`` (a fresh one over ``fleet.cluster`` by default) and place it now
    (a job on a local cluster is placed so when it starts, before Ray does; jobs on Ray go to the service).

    Returns:
        The scheduler, the placement (node and GPU indices of every bundle) and the layout.

    Raises:
        PlacementError: the request is invalid for the cluster, or it does not fit now.
    """
    if scheduler is None:
        options = {"policy": fleet.policy} if fleet.policy else {}
        scheduler = Scheduler(cluster_of(fleet.cluster), **options)
    layout = job_request(fleet, name)
    try:
        placement = scheduler.submit(layout.gang)
    except RequestError as exc:
        raise _refused(fleet, exc) from exc
    if placement is None:
        scheduler.release(name)
        raise _misfit(fleet, layout, "with its constraints")
    return scheduler, placement, layout

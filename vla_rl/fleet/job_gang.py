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
raises :class:`PlacementError` naming the component and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

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
from vla_rl.config import ConfigError
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


def place_job(fleet: FleetConfig, name: str, scheduler: Scheduler | None = None) -> tuple[Scheduler, Placement, JobLayout]:
    """Submit the job's gang to ``scheduler`` (a fresh one over ``fleet.cluster`` by default) and place it now
    (``validate_fleet`` checks with it that a job fits the cluster it starts; jobs on Ray go to the service).

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
        raise PlacementError(f"fleet placement of {fleet.mode!r} mode: {exc} (see the fleet.* placement fields)") from exc
    if placement is None:
        scheduler.release(name)
        demand = ", ".join(f"{b.name}: gpu_milli={b.total_gpu_milli} cpu_milli={b.cpu_milli}" for b in layout.gang.bundles)
        raise PlacementError(
            f"fleet mode {fleet.mode!r} does not fit fleet.cluster ({fleet.cluster.nodes} node(s) x "
            f"{fleet.cluster.gpus} GPU(s), {fleet.cluster.cpus} CPUs) with its constraints; demand: {demand}. "
            "Lower fleet.<component>.gpu / cpus, use fewer shards, or add GPUs/nodes to fleet.cluster"
        )
    return scheduler, placement, layout

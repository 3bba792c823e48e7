"""The ``fleet`` section of a run: where the job's components run and how they talk.

Typed dataclasses, no string mini-language: each component (simulator shards, the inference server,
the trainer) gets a :class:`ComponentPlacement` saying how much CPU and GPU it takes and, optionally,
which node and GPU indices it is pinned to. :meth:`FleetConfig.validate` checks the section's own values,
:func:`vla_rl.fleet.checks.validate_fleet` (which ``TrainConfig.validate`` calls) checks it against the algorithm,
the environments and the cluster it starts; both raise :class:`~infra.common.typed_config.ConfigError` naming the fix and never edit the config. Mode defaults (which GPU share each component takes when the user gives none) are
derived by :func:`resolved_placement`, a pure function, so the config stays what the user wrote.

This module imports neither Ray nor torch: the run config is parsed without starting anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from infra.common.typed_config import ConfigError
from rlcore.update_config import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, out_of_range

Mode = Literal["inprocess", "colocated", "disaggregated", "pipelined", "data_parallel"]
MODES: tuple[str, ...] = ("inprocess", "colocated", "disaggregated", "pipelined", "data_parallel")


@dataclass
class ComponentPlacement:
    """Resources and pinning of one component (each shard gets one of these)."""

    cpus: float = 1.0
    """CPU cores reserved (logical on Ray; may exceed the physical cores of a test box)."""
    memory_mib: int = 1024
    """Host memory reserved, MiB."""
    gpu: float | None = None
    """GPU share: ``0`` none, ``0 < gpu < 1`` a fraction of one GPU, an integer ``>= 1`` whole GPUs;
    ``None`` takes the mode's default (see :func:`resolved_placement`)."""
    node: str = ""
    """Pin to this node of ``fleet.cluster`` (``""``: the scheduler chooses)."""
    gpu_ids: tuple[int, ...] = ()
    """Pin to these GPU indices of ``node`` (needs ``node``; empty: the scheduler chooses)."""


@dataclass
class ClusterSpec:
    """The nodes the job is placed on: ``nodes`` alike machines named ``node0``, ``node1`` ..."""

    nodes: int = 1
    """Number of nodes."""
    cpus: int = 8
    """Logical CPUs per node offered to the scheduler."""
    memory_mib: int = 16384
    """Host memory per node, MiB."""
    gpus: int = 2
    """GPUs per node (logical on a CPU-only machine)."""
    gpu_model: str = "logical"
    """GPU model name (``"H200"``, or ``"logical"`` for GPUs declared on a CPU machine)."""

    @property
    def node_names(self) -> list[str]:
        """Names of the nodes, in order."""
        return [f"node{i}" for i in range(self.nodes)]


@dataclass
class InferenceSettings:
    """The batching inference server (one per job)."""

    max_batch: int | None = None
    """Environments per forward pass; ``None``: all N (co-located/disaggregated) or N / stages (pipelined)."""
    timeout_ms: float | None = None
    """Serve a partial batch after its first request waited this long; ``None``: wait for ``max_batch``
    environments (exact, deterministic batches — what synchronous mode uses by default)."""
    threads: int = 1
    """Torch threads of the server process."""
    transport: Literal["socket", "ray"] = "socket"
    """How shards send their per-step requests: ``socket``, over the server's Unix socket when they
    share its node (Ray calls otherwise); ``ray``, always as Ray actor calls (2-5 ms each on a small
    machine). See :mod:`vla_rl.fleet.channel`."""


@dataclass
class SyncSettings:
    """Weight synchronisation trainer -> inference server."""

    mode: Literal["sync", "async"] = "sync"
    """``sync``: every iteration's experience comes from the newest weights (identical learning to
    in-process); ``async``: shards keep collecting while the trainer updates, with the weights they have."""
    max_staleness: int = 1
    """``async`` only: S, the most rollouts the shards run ahead of the trainer, hence the most versions
    a batch's weights may be behind the trainer's when it is handed over (``fleet/staleness_max <= S``).
    Collection blocks rather than exceed it: with S batches queued the shards wait for the trainer to
    take one, so no simulated batch is ever dropped as too old (dropping would waste the simulation
    and rendering it cost, and would still have to wait for its replacement). ``1``: one batch
    collected during each update, one version behind. Queued batches are not checkpointed; a resumed
    run collects them again from the checkpoint's environment state with its own weights."""


@dataclass
class FleetConfig:
    """Where the training job's components run: in this process, or as Ray actors placed by ``infra``."""

    mode: Mode = "inprocess"
    """``inprocess`` (no Ray), ``colocated`` (all components share GPU(s)), ``disaggregated`` (simulators
    and inference on some GPUs, trainer on others), ``pipelined`` (co-located placement with each
    shard's envs split into ``stages`` whose simulation overlaps the inference of the others) or
    ``data_parallel`` (``num_gpus`` ranks, each a whole trainer with its own simulators on one GPU,
    averaging gradients with ``torch.distributed``)."""
    address: str = "local"
    """Ray cluster: ``local`` starts one on this machine with ``cluster``'s nodes (logical GPUs), a new
    one even where ``/tmp/ray`` names another (``ray start``'s, or a dead one's); or an address such
    as ``auto`` / ``HOST:PORT`` of a running cluster. Either way the job's gang goes to the cluster's
    scheduler service (``infra.service``), shared with every other job there."""
    shards: int = 2
    """Simulator shards; each holds ``env.num_envs / shards`` environments."""
    num_gpus: int = 2
    """``data_parallel`` only: ranks, one GPU each (placed as ``trainer``); each holds ``env.num_envs / num_gpus``
    environments."""
    stages: int = 2
    """Pipeline stages per shard (``pipelined`` only; must divide the envs of a shard)."""
    offload: bool = False
    """``colocated``: move the inference model off the GPU while the trainer updates."""
    policy: str = ""
    """Placement policy of infra's scheduler (one of ``infra.scheduler.node_scoring.names()``; ``""``: the scheduler's default)."""
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    """The nodes started for ``address=local`` (the service discovers the nodes of other clusters)."""
    shard: ComponentPlacement = field(default_factory=lambda: ComponentPlacement(cpus=1.0))
    """Placement of every simulator shard."""
    inference: ComponentPlacement = field(default_factory=lambda: ComponentPlacement(cpus=1.0))
    """Placement of the inference server."""
    trainer: ComponentPlacement = field(default_factory=lambda: ComponentPlacement(cpus=1.0, memory_mib=4096))
    """Placement of the trainer (in ``data_parallel`` mode: of every rank)."""
    server: InferenceSettings = field(default_factory=InferenceSettings)
    """Batching of the inference server."""
    sync: SyncSettings = field(default_factory=SyncSettings)
    """Weight synchronisation."""
    max_restarts: int = 3
    """Restarts allowed per component (shards, server, trainer) before the job fails."""
    collect_timeout_s: float = 600.0
    """An iteration's collection that takes longer than this raises (a hung component)."""
    priority: int = 0
    """Priority of the job's gang in the cluster's scheduler service (higher preempts lower)."""
    tenant: str = "default"
    """Tenant whose GPU quota the job uses (the service's quotas, if any)."""
    grace_s: float = 120.0
    """When preempted: seconds the trainer has to checkpoint and stop before it is stopped by force."""
    queue_timeout_s: float | None = None
    """Longest wait in the service's queue before the job fails with the reason (None: no limit)."""

    @property
    def num_stages(self) -> int:
        """Stages per shard actually used (1 unless pipelined)."""
        return self.stages if self.mode == "pipelined" else 1

    def validate(self) -> None:
        """Raise :class:`~infra.common.typed_config.ConfigError` naming the first bad value of the section and the
        fix: every number's range (:data:`FLEET_RANGES`, in every mode) and, in a Ray mode, the components'
        placements and the placement policy. What depends on the algorithm, the environments and the cluster's
        sizes is :func:`vla_rl.fleet.checks.validate_fleet`'s."""
        message = out_of_range(self, FLEET_RANGES, "fleet.")
        if message:
            raise ConfigError(message)
        if self.mode not in MODES:
            raise ConfigError(f"fleet.mode={self.mode!r} is not a valid choice; valid: {', '.join(MODES)}")
        if self.mode == "inprocess":
            return
        if self.mode == "data_parallel" and self.sync.mode != "sync":
            raise ConfigError("fleet.mode=data_parallel averages gradients every step; drop fleet.sync.mode=async")
        if self.mode == "data_parallel" and self.trainer.gpu not in (None, 1):
            raise ConfigError(f"fleet.trainer.gpu={self.trainer.gpu}: data_parallel gives every rank one whole GPU; "
                              "drop it (or use colocated to share GPUs)")
        if self.offload and self.mode != "colocated":
            raise ConfigError(f"fleet.offload=true applies to fleet.mode=colocated only (got {self.mode}); drop it")
        if self.policy:
            from infra.scheduler.node_scoring import names

            if self.policy not in names():
                raise ConfigError(f"fleet.policy={self.policy!r} is not a placement policy; valid: {', '.join(names())}")
        for name, comp in resolved_placement(self).items():
            _check_component(name, comp, self.cluster)
        # Disaggregated: a whole-GPU trainer never shares a GPU with fractional simulators and inference.
        trainer_gpu = self.trainer.gpu
        if self.mode == "disaggregated" and trainer_gpu is not None and 0 < trainer_gpu < 1:
            raise ConfigError(
                f"fleet.trainer.gpu={trainer_gpu}: disaggregated mode gives the trainer whole GPUs (an integer) so it "
                "never shares one with simulators and inference; use colocated for sharing"
            )


FLEET_RANGES: dict[str, Range] = {
    "shards": AT_LEAST_1, "stages": AT_LEAST_1, "max_restarts": NON_NEGATIVE, "collect_timeout_s": POSITIVE,
    "priority": Range(), "grace_s": NON_NEGATIVE, "queue_timeout_s": POSITIVE,
    "cluster.nodes": AT_LEAST_1, "cluster.cpus": AT_LEAST_1, "cluster.memory_mib": AT_LEAST_1,
    "cluster.gpus": NON_NEGATIVE, "server.max_batch": AT_LEAST_1, "server.timeout_ms": POSITIVE,
    "server.threads": AT_LEAST_1, "sync.max_staleness": AT_LEAST_1,
    **{f"{c}.{k}": r for c in ("shard", "inference", "trainer")
       for k, r in (("cpus", POSITIVE), ("memory_mib", AT_LEAST_1), ("gpu", NON_NEGATIVE), ("gpu_ids", NON_NEGATIVE))},
}
"""Valid range of every numeric field of :class:`FleetConfig` (dotted keys), checked by :meth:`FleetConfig.validate`
in every mode."""


#: GPU share of each component when the user gives none, per mode (shard share is for all shards together).
MODE_GPU_DEFAULTS: dict[str, dict[str, float]] = {
    "colocated": {"shard": 0.3, "inference": 0.3, "trainer": 0.4},
    "pipelined": {"shard": 0.3, "inference": 0.3, "trainer": 0.4},
    "disaggregated": {"shard": 0.5, "inference": 0.5, "trainer": 1.0},
    "data_parallel": {"shard": 0.0, "inference": 0.0, "trainer": 1.0},
}


def resolved_placement(fleet: FleetConfig) -> dict[str, ComponentPlacement]:
    """Each component's placement with the mode's GPU defaults filled in (``fleet`` is not changed).

    Returns:
        ``{"shard": ..., "inference": ..., "trainer": ...}``; the shard entry is per shard.
    """
    defaults = MODE_GPU_DEFAULTS.get(fleet.mode, {"shard": 0.0, "inference": 0.0, "trainer": 0.0})
    out = {}
    for name in ("shard", "inference", "trainer"):
        comp: ComponentPlacement = getattr(fleet, name)
        if comp.gpu is None:
            share = defaults[name] / fleet.shards if name == "shard" else defaults[name]
            comp = replace(comp, gpu=round(share, 3))
        out[name] = comp
    return out


def _check_component(name: str, comp: ComponentPlacement, cluster: ClusterSpec) -> None:
    where = f"fleet.{name}"
    if comp.gpu is not None:  # its range (>= 0) is FLEET_RANGES'
        if comp.gpu >= 1 and not float(comp.gpu).is_integer():
            raise ConfigError(
                f"{where}.gpu={comp.gpu}: shares above one GPU must be whole GPUs; use {int(comp.gpu)} or a fraction < 1"
            )
        if 0 < comp.gpu < 0.001:
            raise ConfigError(f"{where}.gpu={comp.gpu} is below the scheduler's unit (0.001 GPU); use 0 or at least 0.001")
    if comp.node and comp.node not in cluster.node_names:
        raise ConfigError(f"{where}.node={comp.node!r} is not in fleet.cluster; nodes: {', '.join(cluster.node_names)}")
    if comp.gpu_ids:
        if not comp.node:
            raise ConfigError(f"{where}.gpu_ids={list(comp.gpu_ids)} needs {where}.node (GPU indices are per node)")
        count = cluster.gpus
        bad = [g for g in comp.gpu_ids if not 0 <= g < count]
        if bad:
            raise ConfigError(f"{where}.gpu_ids has {bad}; node {comp.node!r} has GPUs 0..{count - 1}")

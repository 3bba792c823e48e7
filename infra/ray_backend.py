"""Realisation of the scheduler's placements on a Ray cluster: the node and the GPUs are ours, never Ray's.

Every Ray node is started with custom resources naming it and each of its GPUs
(``node_args(node)`` gives the ``num_cpus``/``num_gpus``/``resources`` to start it with):

* ``sched_node_<name>``: present only on that node;
* ``sched_gpu_<name>_<i>``: 1.0 per GPU index ``i`` of that node (fractions take part of it).

A placed gang becomes one Ray placement group (created atomically, like the gang) whose bundle
``b`` asks for the CPU of bundle ``b``, a sliver of ``sched_node_<node>`` and the chosen GPUs'
``sched_gpu_*`` amounts: the only node that can hold it is the chosen one, and Ray's own GPU
choice is bypassed. Actors run in that bundle with ``CUDA_VISIBLE_DEVICES`` set to the chosen GPU
indices. When a node is lost, ``remove_node`` lets the scheduler move its gangs, removes their old
placement groups and restarts their actors where the scheduler put them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from infra.gang_placer import Placement
from infra.requests import GangRequest
from infra.resources import MILLI, Cluster, Node
from infra.scheduler import PreemptCallback, Scheduler

NODE_MARK = 0.001
"""Amount of ``sched_node_<name>`` each bundle takes (the node holds 1000 of it)."""


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def node_resource(node_name: str) -> str:
    """Custom resource present only on node ``node_name``."""
    return f"sched_node_{_safe(node_name)}"


def gpu_resource(node_name: str, index: int) -> str:
    """Custom resource standing for GPU ``index`` of node ``node_name``."""
    return f"sched_gpu_{_safe(node_name)}_{index}"


def node_resources(node: Node) -> dict[str, float]:
    """Custom resources the Ray node of ``node`` must declare (``ray start --resources``)."""
    resources = {node_resource(node.name): 1000.0}
    resources.update({gpu_resource(node.name, i): 1.0 for i in range(len(node.gpus))})
    return resources


def node_args(node: Node) -> dict[str, Any]:
    """Keyword arguments to start the Ray node of ``node`` (``ray.cluster_utils.Cluster.add_node``)."""
    return {"num_cpus": node.cpu_milli / MILLI, "num_gpus": len(node.gpus), "resources": node_resources(node)}


@dataclass
class _ActorSpec:
    cls: Any
    args: tuple
    kwargs: dict
    options: dict


class RayBackend:
    """Realises placements of ``scheduler`` on the Ray cluster ``ray.init`` connected to.

    Args:
        scheduler: the scheduler whose placements are realised.
        timeout_s: how long to wait for a placement group to be ready before raising.
    """

    def __init__(self, scheduler: Scheduler, timeout_s: float = 60.0) -> None:
        self.scheduler = scheduler
        self.timeout_s = timeout_s
        self._groups: dict[str, PlacementGroup] = {}
        self._placements: dict[str, Placement] = {}
        self._specs: dict[tuple[str, int], _ActorSpec] = {}
        self._actors: dict[tuple[str, int], Any] = {}

    def submit(self, req: GangRequest, on_preempt: PreemptCallback | None = None) -> Placement | None:
        """``Scheduler.submit`` whose preemptions also stop the victims' Ray actors.

        A victim's ``on_preempt`` runs first (its actors still live, so it can checkpoint), then its
        actors and placement group go; its actors restart when ``restart(gang)`` is called after
        it is placed again.
        """

        def evict(gang: str, reason: str) -> None:
            if on_preempt is not None:
                on_preempt(gang, reason)
            self._drop(gang)

        return self.scheduler.submit(req, on_preempt=evict)

    def restart(self, gang: str) -> Placement | None:
        """Start again the recorded actors of ``gang`` if it runs (after a preemption); its placement."""
        placement = self.scheduler.placement(gang)
        if placement is not None and gang not in self._groups:
            self.realize(placement)
            for key in [k for k in self._specs if k[0] == gang]:
                self._launch(*key)
        return placement

    def bundle_resources(self, placement: Placement) -> list[dict[str, float]]:
        """Ray bundles of a placement: CPU, the node mark and the chosen GPUs."""
        req = self.scheduler.request(placement.gang)
        out = []
        for a in placement.assignments:
            b = req.bundles[a.bundle]
            res = {"CPU": b.cpu_milli / MILLI, node_resource(a.node): NODE_MARK}
            for g in a.gpus:
                res[gpu_resource(a.node, g)] = a.gpu_milli / MILLI
            out.append(res)
        return out

    def realize(self, placement: Placement) -> PlacementGroup:
        """Create (and wait for) the placement group of ``placement``."""
        pg = placement_group(
            self.bundle_resources(placement), strategy="PACK", name=f"sched:{placement.gang}"
        )
        ready, _ = ray.wait([pg.ready()], timeout=self.timeout_s)
        if not ready:
            remove_placement_group(pg)
            raise TimeoutError(
                f"placement group of gang {placement.gang!r} not ready after {self.timeout_s}s: are the Ray nodes "
                "started with infra.ray_backend.node_args(node)?"
            )
        self._groups[placement.gang] = pg
        self._placements[placement.gang] = placement
        return pg

    def start_actor(
        self, placement: Placement, bundle: int, actor_cls, *args, options: dict | None = None, **kwargs
    ):
        """Start ``actor_cls`` (a ``@ray.remote`` class) on the node and GPUs of ``bundle``.

        The actor sees ``CUDA_VISIBLE_DEVICES`` set to its GPU indices and is restarted by
        ``remove_node`` if its node is lost. ``options`` are passed to Ray's ``.options()``
        (``max_restarts``, ``max_concurrency``, ``name`` ...); the placement keys
        (``scheduling_strategy``, ``num_cpus``, ``num_gpus``, ``resources``) are ours and refused.
        """
        options = dict(options or {})
        ours = {"scheduling_strategy", "num_cpus", "num_gpus", "resources"} & set(options)
        if ours:
            raise ValueError(f"start_actor options {sorted(ours)} are set by the placement; drop them.")
        if placement.gang not in self._groups:
            self.realize(placement)
        self._specs[(placement.gang, bundle)] = _ActorSpec(actor_cls, args, kwargs, options)
        return self._launch(placement.gang, bundle)

    def actor(self, gang: str, bundle: int):
        """The current handle of the actor of ``bundle`` of ``gang``."""
        return self._actors[(gang, bundle)]

    def _launch(self, gang: str, bundle: int):
        placement = self._placements[gang]
        a = next(x for x in placement.assignments if x.bundle == bundle)
        index = [x.bundle for x in placement.assignments].index(bundle)
        req = self.scheduler.request(gang)
        spec = self._specs[(gang, bundle)]
        options = dict(spec.options)
        runtime_env = dict(options.pop("runtime_env", None) or {})
        runtime_env["env_vars"] = {
            **runtime_env.get("env_vars", {}),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in a.gpus),
        }
        handle = spec.cls.options(
            num_cpus=req.bundles[bundle].cpu_milli / MILLI,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._groups[gang], placement_group_bundle_index=index
            ),
            runtime_env=runtime_env,
            **options,
        ).remote(*spec.args, **spec.kwargs)
        self._actors[(gang, bundle)] = handle
        return handle

    def release(self, gang: str) -> None:
        """Stop the gang's actors, remove its placement group and release it in the scheduler."""
        self._drop(gang)
        for key in [k for k in self._specs if k[0] == gang]:
            del self._specs[key]
        self.scheduler.release(gang)

    def _drop(self, gang: str) -> None:
        for key in [k for k in self._actors if k[0] == gang]:
            ray.kill(self._actors.pop(key))
        pg = self._groups.pop(gang, None)
        if pg is not None:
            remove_placement_group(pg)
        self._placements.pop(gang, None)

    def remove_node(self, node_name: str) -> dict[str, Placement | None]:
        """Node ``node_name`` is lost: reschedule its gangs and restart their actors elsewhere.

        Returns:
            The new placement of every moved gang (None if it now waits in the queue).
        """
        moved = self.scheduler.remove_node(node_name)
        out: dict[str, Placement | None] = {}
        for gang in moved:
            specs = {k: v for k, v in self._specs.items() if k[0] == gang}
            self._drop(gang)
            placement = self.scheduler.placement(gang)
            out[gang] = placement
            if placement is None:
                continue
            self.realize(placement)
            for key in specs:
                self._launch(*key)
        return out


@dataclass
class LocalCluster:
    """A multi-node Ray cluster on this machine (one raylet per infra node, loopback, logical GPUs).

    Attributes:
        ray_cluster: the ``ray.cluster_utils.Cluster``.
        nodes: infra node name -> its Ray node handle (removed nodes are dropped).
    """

    ray_cluster: Any
    nodes: dict[str, Any]

    def remove(self, node_name: str) -> None:
        """Kill the raylet of ``node_name`` (a node loss)."""
        self.ray_cluster.remove_node(self.nodes.pop(node_name))

    def node_id(self, node_name: str) -> str | None:
        """Ray's node id of ``node_name`` (None once removed)."""
        node = self.nodes.get(node_name)
        if node is None:
            return None
        alive = {n["NodeManagerPort"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        return alive.get(node.node_manager_port)

    def shutdown(self) -> None:
        """Disconnect and stop every raylet."""
        ray.shutdown()
        self.ray_cluster.shutdown()


def start_local_cluster(cluster: Cluster, object_store_mib: int = 80, head_cpus: int = 1) -> LocalCluster:
    """Start a Ray head plus one raylet per node of ``cluster`` and connect this process to it.

    Each raylet declares ``node_args(node)`` (its CPUs, logical GPUs and our custom resources).
    Keep clusters small on small machines: every raylet costs memory and CPU. Call ``shutdown()``.
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from ray.cluster_utils import Cluster as RayCluster

    store = object_store_mib * 1024 * 1024
    rc = RayCluster(
        initialize_head=True, head_node_args={"num_cpus": head_cpus, "object_store_memory": store}
    )
    try:
        nodes = {n.name: rc.add_node(object_store_memory=store, **node_args(n)) for n in cluster.nodes}
        ray.init(address=rc.address, include_dashboard=False, log_to_driver=False)
        rc.wait_for_nodes(timeout=60)
    except Exception:
        rc.shutdown()
        raise
    return LocalCluster(rc, nodes)

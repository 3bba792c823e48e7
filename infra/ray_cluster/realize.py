"""The scheduler's plan on Ray: nodes discovered from Ray, placement groups on exactly the planned GPUs.

**Nodes.** Every alive Ray node with CPUs is a node of the plan. Its name, GPU model and memory come
from labels (``node_args(node)`` gives the ``ray start`` / ``Cluster.add_node`` arguments):
``infra/node`` (default ``node-<id prefix>``), ``infra/gpu-model`` (else Ray's accelerator type,
else ``GPU``), ``infra/gpu-memory-mib`` (0: unknown) and ``infra/memory-mib`` (else Ray's
``memory``). CPUs and GPU counts are Ray's own ``CPU`` and ``GPU`` resources.

**Ray's accounting agrees with the plan, on the planned device.** Each placed bundle is one
detached placement group on its node (``bundle_label_selector`` on ``ray.io/node-id``) that
reserves the bundle's CPUs *and its GPUs from Ray's own* ``GPU`` *resource*; actors started in it
ask for the same ``num_gpus``, so Ray sets ``CUDA_VISIBLE_DEVICES`` and ``ray.get_gpu_ids()``
itself, and other Ray work is kept off those GPUs by Ray. Ray decides which GPU instance a bundle
gets: the lowest-index fully free ones for whole GPUs, the fullest one that fits (lowest index on
ties) for a fraction. ``ray_gpu_choice`` mirrors that rule on the GPUs' occupancy by the
placement groups this module created; when Ray's pick would differ from the planned GPUs, every
other GPU of the node with room is first filled by a short-lived *blocker* group (in index
order, which makes each land on its own GPU), so Ray's only choice is the planned one, and the
blockers are removed once the bundle's group exists. This relies on the service being the only
creator of GPU placement groups on its nodes; the tests check the rule against the installed Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from infra.common.files import write_atomic
from infra.scheduler.resources import GPU, MILLI, Cluster, Node

GROUP_PREFIX = "infra|"
"""Prefix of the placement group names this module creates (``BundleSpec.group_name``)."""
BLOCKER_PREFIX = "infra-blocker|"
"""Prefix of the short-lived blocker groups (removed by the service's reconciliation if left over)."""


def node_labels(node: Node) -> dict[str, str]:
    """Labels a Ray node of ``node`` declares (name, GPU model and memory, memory)."""
    labels = {"infra/node": node.name, "infra/memory-mib": str(node.memory_mib)}
    if node.gpus:
        labels["infra/gpu-model"] = node.gpus[0].model
        labels["infra/gpu-memory-mib"] = str(node.gpus[0].memory_mib)
    return labels


def node_args(node: Node) -> dict[str, Any]:
    """Arguments to start the Ray node of ``node`` (``ray.cluster_utils.Cluster.add_node``, ``ray.init``)."""
    return {"num_cpus": node.cpu_milli / MILLI, "num_gpus": len(node.gpus), "labels": node_labels(node)}


def discover_nodes(ray_nodes: list[dict]) -> dict[str, tuple[str, Node]]:
    """Alive Ray nodes with CPUs (``ray.nodes()``) as plan nodes: name -> (Ray node id, node)."""
    out = {}
    for n in ray_nodes:
        res, labels = n.get("Resources", {}), n.get("Labels", {}) or {}
        cpu = round(res.get("CPU", 0) * MILLI)
        if not n.get("Alive") or cpu <= 0:
            continue
        name = labels.get("infra/node") or f"node-{n['NodeID'][:8]}"
        accel = next((k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")), None)
        model = labels.get("infra/gpu-model") or labels.get("ray.io/accelerator-type") or accel or "GPU"
        memory = int(labels.get("infra/memory-mib") or res.get("memory", 0) // 2**20) or 1
        gpu = GPU(model, int(labels.get("infra/gpu-memory-mib") or 0))
        out[name] = (n["NodeID"], Node(name, cpu, memory, (gpu,) * int(res.get("GPU", 0))))
    return out


def ray_gpu_choice(used: list[int], milli: int, count: int) -> tuple[int, ...] | None:
    """The GPU indices Ray gives a bundle of ``count`` x ``milli`` on a node whose GPUs hold ``used`` milli."""
    if milli >= MILLI:
        free = [i for i, u in enumerate(used) if u == 0]
        return tuple(free[:count]) if len(free) >= count else None
    fits = [(MILLI - u, i) for i, u in enumerate(used) if MILLI - u >= milli]
    return (min(fits)[1],) if fits else None


@dataclass(frozen=True)
class BundleSpec:
    """One bundle to realise: its node, the planned GPUs and the amounts."""

    gang: str
    epoch: int
    bundle: int
    node: str
    gpus: tuple[int, ...]
    gpu_milli: int
    cpu_milli: int

    @property
    def group_name(self) -> str:
        """``infra|<gang>|<epoch>|<bundle>|<node>|<gpus>|<gpu_milli>|<cpu_milli>``: a group says what it holds."""
        gpus = "-".join(map(str, self.gpus))
        return f"{GROUP_PREFIX}{self.gang}|{self.epoch}|{self.bundle}|{self.node}|{gpus}|{self.gpu_milli}|{self.cpu_milli}"

    def resources(self) -> dict[str, float]:
        res = {"CPU": self.cpu_milli / MILLI}
        if self.gpus:
            res["GPU"] = len(self.gpus) * self.gpu_milli / MILLI
        return res


def parse_group_name(name: str) -> BundleSpec | None:
    """The bundle a group created here holds, from its name; None for other groups."""
    if not name.startswith(GROUP_PREFIX):
        return None
    gang, epoch, bundle, node, gpus, milli, cpu = name[len(GROUP_PREFIX) :].rsplit("|", 6)
    return BundleSpec(gang, int(epoch), int(bundle), node, tuple(int(g) for g in gpus.split("-") if g), int(milli), int(cpu))


class Realizer:
    """Creates and removes the placement groups of planned bundles (see the module docstring).

    Args:
        timeout_s: how long a placement group may take to be ready before the realisation fails.
    """

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.node_ids: dict[str, str] = {}
        self.used: dict[str, list[int]] = {}
        self.groups: dict[tuple[str, int], tuple[BundleSpec, PlacementGroup]] = {}

    def set_node(self, name: str, node_id: str, num_gpus: int) -> None:
        """A node (re)appeared with Ray id ``node_id``; its GPUs start empty unless groups hold them."""
        self.node_ids[name] = node_id
        self.used[name] = [0] * num_gpus
        for spec, _ in self.groups.values():
            if spec.node == name:
                self._account(spec, +1)

    def adopt(self, spec: BundleSpec, pg: PlacementGroup) -> None:
        """Take over a group found alive (after a restart of the service)."""
        self.groups[(spec.gang, spec.bundle)] = (spec, pg)
        if spec.node in self.used:
            self._account(spec, +1)

    def _account(self, spec: BundleSpec, sign: int) -> None:
        used = self.used[spec.node]
        for g in spec.gpus:
            used[g] += sign * spec.gpu_milli

    async def create(self, spec: BundleSpec) -> PlacementGroup:
        """Create the group of ``spec`` on its node and planned GPUs (blockers first when needed)."""
        node_id = self.node_ids[spec.node]
        blockers: dict[int, PlacementGroup] = {}
        try:
            if spec.gpus and ray_gpu_choice(self.used[spec.node], spec.gpu_milli, len(spec.gpus)) != spec.gpus:
                blockers = await self._block_all(spec.node, node_id)
                for g in spec.gpus:
                    remove_placement_group(blockers.pop(g))
            pg = placement_group([spec.resources()], strategy="PACK", name=spec.group_name, lifetime="detached",
                                 bundle_label_selector=[{"ray.io/node-id": node_id}])
            await self._ready(pg, spec.group_name)
        finally:
            for b in blockers.values():
                remove_placement_group(b)
        self.groups[(spec.gang, spec.bundle)] = (spec, pg)
        self._account(spec, +1)
        return pg

    async def _block_all(self, node: str, node_id: str) -> dict[int, PlacementGroup]:
        """Fill every GPU of ``node`` that has room, in index order (each blocker lands on its GPU)."""
        out = {}
        for g, u in enumerate(self.used[node]):
            if u >= MILLI:
                continue
            name = f"{BLOCKER_PREFIX}{node}|{g}|{uuid.uuid4().hex[:8]}"
            pg = placement_group([{"GPU": (MILLI - u) / MILLI}], name=name, lifetime="detached",
                                 bundle_label_selector=[{"ray.io/node-id": node_id}])
            out[g] = pg
            await self._ready(pg, name)
        return out

    async def _ready(self, pg: PlacementGroup, name: str) -> None:
        try:
            await asyncio.wait_for(pg.ready(), self.timeout_s)
        except TimeoutError:
            remove_placement_group(pg)
            raise TimeoutError(
                f"placement group {name} not ready after {self.timeout_s} s: does Ray's view of the node "
                "(its CPU and GPU resources) match the plan? GPU work outside the scheduler breaks it."
            ) from None

    def remove(self, gang: str, bundles: set[int] | None = None) -> None:
        """Remove the groups of ``gang`` (only ``bundles`` when given); Ray stops the actors in them."""
        for key in [k for k in self.groups if k[0] == gang and (bundles is None or k[1] in bundles)]:
            spec, pg = self.groups.pop(key)
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
            if spec.node in self.used:
                self._account(spec, -1)

    def forget_node(self, name: str) -> None:
        """A node died: its groups are gone with it."""
        self.node_ids.pop(name, None)
        self.used.pop(name, None)

    def realized(self, gang: str) -> dict[int, tuple[BundleSpec, PlacementGroup]]:
        """The groups of ``gang`` by bundle."""
        return {b: v for (g, b), v in self.groups.items() if g == gang}


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

    def add(self, node: Node, object_store_mib: int = 80) -> None:
        """Start a raylet for ``node`` (a node joining)."""
        self.nodes[node.name] = self.ray_cluster.add_node(object_store_memory=object_store_mib * 2**20,
                                                          node_ip_address=LOOPBACK, **node_args(node))

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


LOOPBACK = "127.0.0.1"
"""The address every Ray node the project starts on this machine binds."""


def secure_local_ray() -> None:
    """Prepare this process to start a local Ray cluster: loopback only, Ray's token authentication on.

    Sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` and ``RAY_AUTH_MODE=token`` unless set (an explicit
    ``RAY_AUTH_MODE=disabled`` is obeyed), makes Ray's default token file ``~/.ray/auth_token``
    (0600) when no token is configured (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``) and keeps it
    0600 (Ray writes it with the umask's mode), then updates what Ray cached of both when it was
    imported, so the call works also after ``import ray``. The GCS, raylets and workers started
    afterwards inherit this environment and require the token; every node is also started with
    ``LOOPBACK`` as its address, which does not depend on when ray was imported.
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ["RAY_AUTH_MODE"] == "token" and not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        path = Path.home() / ".ray" / "auth_token"
        if path.is_file():
            if path.stat().st_uid == os.getuid():  # a file this user does not own is left as it is
                path.chmod(0o600)
        else:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(path, secrets.token_hex(32).encode())  # Ray's own token format; mkstemp: 0600
    from ray._common.utils import env_bool
    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config

    # Ray read both at import: without these, a process that imported ray first resolves its own
    # 127.0.0.1 to the machine's address (where the loopback GCS does not listen) and runs without token.
    ray_constants.ENABLE_RAY_CLUSTER = env_bool(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, True)
    Config.initialize("")  # what Ray's own ray.init does after it turns token mode on
    AuthenticationTokenLoader.instance().reset_cache()


def start_local_cluster(cluster: Cluster, object_store_mib: int = 80, namespace: str | None = None) -> LocalCluster:
    """Start a Ray head (no CPUs: it holds no plan node) plus one raylet per node of ``cluster``, connect.

    Each raylet declares ``node_args(node)``; every node binds ``LOOPBACK`` and requires Ray's token
    (``secure_local_ray``). Keep clusters small on small machines: every raylet costs memory and
    CPU. Call ``shutdown()``.
    """
    secure_local_ray()
    from ray.cluster_utils import Cluster as RayCluster

    store = object_store_mib * 1024 * 1024
    rc = RayCluster(initialize_head=True,
                    head_node_args={"num_cpus": 0, "object_store_memory": store, "node_ip_address": LOOPBACK})
    try:
        nodes = {n.name: rc.add_node(object_store_memory=store, node_ip_address=LOOPBACK, **node_args(n))
                 for n in cluster.nodes}
        ray.init(address=rc.address, include_dashboard=False, log_to_driver=False, namespace=namespace,
                 _node_ip_address=LOOPBACK)
        rc.wait_for_nodes(timeout=60)
    except Exception:
        rc.shutdown()
        raise
    return LocalCluster(rc, nodes)

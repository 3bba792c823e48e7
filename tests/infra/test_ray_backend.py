"""Placements realised on a real multi-node Ray cluster on one machine (loopback, logical GPUs)."""

import os

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster as RayCluster  # noqa: E402

from infra.ray_backend import RayBackend, node_args  # noqa: E402
from infra.scheduler import GPU, Bundle, Cluster, GangRequest, Node, SameNode, Scheduler  # noqa: E402

OBJECT_STORE = 80 * 1024 * 1024


@ray.remote(num_cpus=0)
class Probe:
    """Reports where it runs."""

    def where(self):
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    nodes = (Node("w0", 2000, 2048, (GPU("L4"),) * 2), Node("w1", 2000, 2048, (GPU("L4"),) * 2))
    rc = RayCluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE})
    ray_nodes = {n.name: rc.add_node(object_store_memory=OBJECT_STORE, **node_args(n)) for n in nodes}
    ray.init(address=rc.address, include_dashboard=False, log_to_driver=False)
    rc.wait_for_nodes(timeout=60)
    yield Cluster(nodes), rc, ray_nodes
    ray.shutdown()
    rc.shutdown()


def _node_ids(ray_nodes):
    alive = {n["NodeManagerPort"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    return {name: alive.get(node.node_manager_port) for name, node in ray_nodes.items()}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_actors_run_on_the_chosen_node_and_gpus_and_move_when_the_node_is_lost(ray_cluster):
    cluster, rc, ray_nodes = ray_cluster
    ids = _node_ids(ray_nodes)
    sched = Scheduler(cluster, policy="bestfit")
    backend = RayBackend(sched, timeout_s=60)
    # A policy server and its renderer on the same node, one whole GPU and a fraction of another.
    req = GangRequest(
        "job", (Bundle(500, 256, gpus=1), Bundle(500, 256, gpu_fraction=300)), constraints=(SameNode((0, 1)),)
    )
    p = sched.submit(req)
    server = backend.start_actor(p, 0, Probe)
    renderer = backend.start_actor(p, 1, Probe)
    a = {x.bundle: x for x in p.assignments}
    node_id, cuda = ray.get(server.where.remote(), timeout=60)
    assert node_id == ids[a[0].node] and cuda == ",".join(map(str, a[0].gpus))
    node_id2, cuda2 = ray.get(renderer.where.remote(), timeout=60)
    assert node_id2 == ids[a[1].node] and cuda2 == str(a[1].gpus[0])

    lost = a[0].node
    rc.remove_node(ray_nodes[lost])
    moved = backend.remove_node(lost)
    q = moved["job"]
    assert q is not None and q.nodes() == {"w1" if lost == "w0" else "w0"}
    new_id, _ = ray.get(backend.actor("job", 0).where.remote(), timeout=60)
    assert new_id == ids[next(iter(q.nodes()))]
    backend.release("job")
    assert sched.placements == {}

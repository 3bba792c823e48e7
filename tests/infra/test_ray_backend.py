"""Placements realised on a real multi-node Ray cluster on one machine (loopback, logical GPUs)."""

import os

import pytest

ray = pytest.importorskip("ray")

from infra.ray_backend import RayBackend, start_local_cluster  # noqa: E402
from infra.scheduler import GPU, Bundle, Cluster, GangRequest, Node, SameNode, Scheduler  # noqa: E402


@ray.remote(num_cpus=0)
class Probe:
    """Reports where it runs."""

    def where(self):
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.fixture(scope="module")
def local():
    cluster = Cluster((Node("w0", 2000, 2048, (GPU("L4"),) * 2), Node("w1", 2000, 2048, (GPU("L4"),) * 2)))
    lc = start_local_cluster(cluster)
    yield cluster, lc
    lc.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_actors_follow_the_plan_through_node_loss_and_preemption(local):
    cluster, lc = local
    ids = {name: lc.node_id(name) for name in lc.nodes}
    backend = RayBackend(Scheduler(cluster, policy="bestfit"), timeout_s=60)
    told = []
    # A policy server and its renderer on the same node, one whole GPU and a fraction of another.
    req = GangRequest(
        "job", (Bundle(500, 256, gpus=1), Bundle(500, 256, gpu_fraction=300)), constraints=(SameNode((0, 1)),)
    )
    p = backend.submit(req, on_preempt=lambda gang, why: told.append(why))
    server = backend.start_actor(p, 0, Probe, options={"max_restarts": 0, "max_concurrency": 2})
    renderer = backend.start_actor(p, 1, Probe)
    a = {x.bundle: x for x in p.assignments}
    assert ray.get(server.where.remote(), timeout=60) == (ids[a[0].node], ",".join(map(str, a[0].gpus)))
    assert ray.get(renderer.where.remote(), timeout=60) == (ids[a[1].node], str(a[1].gpus[0]))

    # The node dies under the gang: the scheduler moves it, the backend restarts its actors there.
    lost = a[0].node
    lc.remove(lost)
    q = backend.remove_node(lost)["job"]
    other = "w1" if lost == "w0" else "w0"
    assert q is not None and q.nodes() == {other} and "lost" in told[-1]
    assert ray.get(backend.actor("job", 0).where.remote(), timeout=60)[0] == ids[other]

    # A higher-priority gang takes both GPUs of the last node: the job is told, then stopped.
    old = backend.actor("job", 0)
    assert backend.submit(GangRequest("urgent", (Bundle(500, 256, gpus=2),), priority=5)) is not None
    assert "preempted" in told[-1] and backend.scheduler.queue == ["job"]
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(old.where.remote(), timeout=60)
    backend.release("urgent")
    assert backend.restart("job") is not None
    assert ray.get(backend.actor("job", 0).where.remote(), timeout=60)[0] == ids[other]
    backend.release("job")
    assert backend.scheduler.placements == {}

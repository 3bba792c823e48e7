"""Scheduler behaviour: per-GPU feasibility, constraints, queue, preemption, resize, node loss."""

import pytest

from infra.scheduler import (
    GPU,
    Bundle,
    Cluster,
    DifferentNodes,
    GangRequest,
    Node,
    PinGPUs,
    SameGPU,
    SameNode,
    Scheduler,
    node_scoring,
)


def frac(m, cpu=1000):
    return Bundle(cpu, 1024, gpu_fraction=m)


@pytest.mark.parametrize("policy", node_scoring.names())
def test_a_fraction_never_spans_two_half_free_gpus(policy):
    one = Cluster((Node("n", 8000, 8192, (GPU("T4"),) * 2),))
    s = Scheduler(one, policy=policy)
    assert s.submit(GangRequest("a", (frac(500),))) is not None
    assert s.submit(GangRequest("b", (frac(500),))) is not None
    # Whatever the policy, the two halves sit on one GPU or on two; the expectation follows from where
    # the placements put them, not from the scheduler's own free counters.
    gpus = [s.placement(n).assignments[0].gpus for n in ("a", "b")]
    p = s.submit(GangRequest("c", (frac(600),)))
    if gpus[0] == gpus[1]:  # one GPU holds both halves: the other is whole and takes the 0.6
        assert p is not None
        assert p.assignments[0].gpus != gpus[0], "0.6 placed on the GPU that holds two halves"
    else:  # two half-free GPUs: 0.6 must not fit on their sum
        assert p is None and s.queue == ["c"]


def test_whole_gpu_request_needs_fully_free_gpus(cluster):
    s = Scheduler(cluster, policy="bestfit")
    for i in range(2):  # a 0.1 on every GPU of n2 (the A10 node)
        s.submit(
            GangRequest(
                f"f{i}",
                (Bundle(100, 10, gpu_fraction=100, gpu_models=frozenset({"A10"})),),
                constraints=(PinGPUs(0, "n2", (i,)),),
            )
        )
    p = s.submit(GangRequest("w", (Bundle(1000, 1024, gpus=1, gpu_models=frozenset({"A10"})),)))
    assert p is None and s.queue == ["w"]


def test_same_gpu_same_node_different_nodes_and_pins(cluster):
    s = Scheduler(cluster, policy="fgd-strand")
    p = s.submit(
        GangRequest(
            "job",
            (
                frac(300),
                frac(500),
                Bundle(2000, 4096, gpus=2),
                Bundle(1000, 1024),
                Bundle(1000, 1024, gpus=1),
            ),
            constraints=(SameGPU((0, 1)), SameNode((0, 2)), DifferentNodes((2, 3)), PinGPUs(4, "n1", (2, 3))),
        )
    )
    a = {x.bundle: x for x in p.assignments}
    assert a[0].node == a[1].node == a[2].node and a[0].gpus == a[1].gpus
    assert a[3].node != a[2].node
    assert a[4].node == "n1" and set(a[4].gpus) <= {2, 3}
    # Against a placed service: a renderer on the policy server's GPU, a replica away from its node.
    q = s.submit(
        GangRequest(
            "r",
            (frac(100), Bundle(1000, 1024)),
            constraints=(SameGPU((0,), service="job/0"), DifferentNodes((1,), services=("job/2",))),
        )
    )
    b = {x.bundle: x for x in q.assignments}
    assert (b[0].node, b[0].gpus) == (a[0].node, a[0].gpus) and b[1].node != a[2].node


def test_gang_is_all_or_nothing_and_waits_in_the_queue(cluster):
    s = Scheduler(cluster, policy="bestfit")
    big = GangRequest("big", tuple(Bundle(1000, 1024, gpus=4) for _ in range(3)))  # needs 12 GPUs, 10 exist
    assert s.submit(big) is None
    assert s.state.gpu_free.sum() == 10 * 1000 and s.queue == ["big"]


def test_preemption_evicts_only_lower_priority_and_tells_the_victim(cluster):
    s = Scheduler(cluster, policy="bestfit")
    told = []
    s.submit(
        GangRequest("low", (Bundle(1000, 1024, gpus=4),), priority=0),
        on_preempt=lambda n, r: told.append((n, r)),
    )
    s.submit(GangRequest("mid", (Bundle(1000, 1024, gpus=4),), priority=5))
    s.submit(GangRequest("peer", (Bundle(1000, 1024, gpus=2),), priority=5))
    p = s.submit(GangRequest("eq", (Bundle(1000, 1024, gpus=4),), priority=0))
    assert p is None and told == []  # equal priority is never evicted
    p = s.submit(GangRequest("top", (Bundle(1000, 1024, gpus=4),), priority=9))
    assert p is not None and [n for n, _ in told] == ["low"]
    assert s.queue == ["low", "eq"] and s.placement("mid") is not None and s.placement("peer") is not None
    evt = next(e for e in s.events if e.kind == "preempt_notice")
    assert evt.gang == "low" and evt.detail["by"] == "top"


def test_release_serves_the_queue_by_priority(cluster):
    s = Scheduler(cluster, policy="bestfit")
    s.submit(GangRequest("a", (Bundle(1000, 1024, gpus=4),) * 2, priority=3))
    s.submit(GangRequest("b", (Bundle(1000, 1024, gpus=2),), priority=3))
    s.submit(GangRequest("lo", (Bundle(1000, 1024, gpus=4),), priority=1))
    s.submit(GangRequest("hi", (Bundle(1000, 1024, gpus=4),), priority=2))
    assert s.queue == ["hi", "lo"]
    s.release("a")
    assert s.placement("hi") is not None and s.placement("lo") is not None


def test_elastic_gang_places_what_fits_and_resizes(cluster):
    s = Scheduler(cluster, policy="pack")
    p = s.submit(GangRequest("el", (Bundle(1000, 1024, gpus=2),) * 8, min_bundles=2))
    assert len(p.assignments) == 5  # 10 GPUs / 2
    assert len(s.resize("el", 3).assignments) == 3
    assert s.state.gpu_free.sum() == 4000
    assert len(s.resize("el", 5).assignments) == 5
    with pytest.raises(RuntimeError, match="do not fit"):
        s.resize("el", 6)


def test_node_loss_reschedules_its_gangs_elsewhere(cluster):
    s = Scheduler(cluster, policy="spread")
    told = []
    p = s.submit(GangRequest("svc", (Bundle(1000, 1024, gpus=1),)), on_preempt=lambda n, r: told.append(r))
    lost = p.assignments[0].node
    moved = s.remove_node(lost)
    assert moved == ["svc"] and told and "lost" in told[0]
    q = s.placement("svc")
    assert q is not None and q.assignments[0].node != lost
    assert [e.kind for e in s.events][-4:] == ["node_lost", "evicted_by_node_loss", "queued", "placed"]


def test_pack_fills_the_gangs_node_and_spread_avoids_it(cluster):
    gang = GangRequest("g", (Bundle(1000, 1024, gpus=1),) * 3)
    packed = Scheduler(cluster, policy="pack").submit(gang)
    spread = Scheduler(cluster, policy="spread").submit(gang)
    assert len(packed.nodes()) == 1
    assert len(spread.nodes()) == 3


@pytest.mark.parametrize("policy", node_scoring.names())
def test_every_policy_respects_gpu_models(cluster, policy):
    s = Scheduler(cluster, policy=policy)
    p = s.submit(GangRequest("g", (Bundle(1000, 1024, gpus=2, gpu_models=frozenset({"A10"})),)))
    assert p.assignments[0].node == "n2"
    assert (
        s.submit(GangRequest("h", (Bundle(1000, 1024, gpu_fraction=10, gpu_models=frozenset({"A10"})),)))
        is None
    )

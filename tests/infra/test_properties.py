"""Property tests over random clusters and request streams (hypothesis).

After every operation: no GPU, CPU or memory is oversubscribed and the free amounts equal capacity
minus what the running gangs hold; running gangs hold all their bundles (elastic ones between
their minimum and maximum) and satisfy their constraints, waiting gangs hold nothing; release
returns exactly what was taken; preemption never evicts equal or higher priority.
"""

import contextlib
import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra import node_scoring
from infra.scheduler import (
    GPU,
    Bundle,
    Cluster,
    DifferentNodes,
    GangRequest,
    Node,
    RequestError,
    SameGPU,
    SameNode,
    Scheduler,
)

MODELS = ("A", "B")


@st.composite
def clusters(draw):
    n = draw(st.integers(1, 4))
    nodes = []
    for i in range(n):
        g = draw(st.integers(0, 4))
        model = draw(st.sampled_from(MODELS))
        nodes.append(
            Node(f"n{i}", draw(st.integers(2, 16)) * 1000, draw(st.integers(1, 16)) * 1024, (GPU(model),) * g)
        )
    return Cluster(tuple(nodes))


@st.composite
def bundles(draw):
    kind = draw(st.sampled_from(["cpu", "whole", "frac"]))
    cpu = draw(st.integers(1, 8)) * 500
    mem = draw(st.integers(1, 8)) * 512
    models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=1)))
    if kind == "cpu":
        return Bundle(cpu, mem)
    if kind == "whole":
        return Bundle(cpu, mem, gpus=draw(st.integers(1, 3)), gpu_models=models)
    return Bundle(cpu, mem, gpu_fraction=draw(st.sampled_from([100, 250, 300, 500, 700])), gpu_models=models)


@st.composite
def gangs(draw, name):
    bs = tuple(draw(st.lists(bundles(), min_size=1, max_size=3)))
    constraints = ()
    elastic = None
    if len(bs) >= 2 and draw(st.booleans()):
        c = draw(st.sampled_from(["same_node", "different", "same_gpu"]))
        if c == "same_node":
            constraints = (SameNode((0, 1)),)
        elif c == "different":
            constraints = (DifferentNodes((0, 1)),)
        elif bs[0].gpu_fraction and bs[1].gpu_fraction and bs[0].gpu_models == bs[1].gpu_models:
            constraints = (SameGPU((0, 1)),)
    elif draw(st.booleans()):
        bs = (bs[0],) * draw(st.integers(2, 4))
        elastic = draw(st.integers(1, len(bs)))
    return GangRequest(name, bs, constraints, priority=draw(st.integers(0, 3)), min_bundles=elastic)


def check_invariants(s: Scheduler) -> None:
    state = s.state
    assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()
    assert (state.gpu_free >= 0).all() and (state.gpu_free <= 1000).all()
    assert (state.gpu_free[~state.gpu_exists] == 0).all()
    cpu = np.zeros_like(state.cpu_free)
    mem = np.zeros_like(state.mem_free)
    gpu = np.zeros_like(state.gpu_free)
    placements = s.placements
    for name in list(placements) + s.queue:
        req = s.request(name)
        p = s.placement(name)
        if p is None:
            continue
        assert len(p.assignments) == len(req.bundles) or (
            req.min_bundles is not None and req.min_size <= len(p.assignments) <= len(req.bundles)
        )
        where = {}
        for a in p.assignments:
            n = state.node_index[a.node]
            assert state.alive[n]
            b = req.bundles[a.bundle]
            assert len(a.gpus) == b.num_gpu and a.gpu_milli == b.gpu_milli
            if b.gpu_models:
                assert {state.model_names[state.gpu_model[n, g]] for g in a.gpus} <= b.gpu_models
            cpu[n] += b.cpu_milli
            mem[n] += b.memory_mib
            gpu[n, list(a.gpus)] += b.gpu_milli
            where[a.bundle] = (a.node, a.gpus)
        for c in req.constraints:
            if isinstance(c, SameNode):
                assert len({where[i][0] for i in c.bundles}) == 1
            if isinstance(c, SameGPU):
                assert len({where[i] for i in c.bundles}) == 1
            if isinstance(c, DifferentNodes):
                assert len({where[i][0] for i in c.bundles}) == len(c.bundles)
    live = state.alive
    assert np.array_equal(cpu[live], (state.cpu_cap - state.cpu_free)[live])
    assert np.array_equal(mem[live], (state.mem_cap - state.mem_free)[live])
    assert np.array_equal(gpu[live], (np.where(state.gpu_exists, 1000, 0) - state.gpu_free)[live])
    prio = {e.gang: e.detail["priority"] for e in s.events if e.kind == "submitted"}
    for e in s.events:
        if e.kind == "preempted":
            assert prio[e.gang] < e.detail["by_priority"] == prio[e.detail["by"]]


ops = st.lists(
    st.tuples(
        st.sampled_from(["submit", "submit", "submit", "release", "resize", "lose", "restore"]),
        st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), stream=ops, policy=st.sampled_from(node_scoring.names()), data=st.data())
def test_invariants_hold_over_random_request_streams(cluster, stream, policy, data):
    s = Scheduler(cluster, policy=policy, seed=1)
    for k, (op, r) in enumerate(stream):
        names = sorted(s.placements) + s.queue
        if op == "submit":
            with contextlib.suppress(RequestError):
                s.submit(data.draw(gangs(f"g{k}")), on_preempt=lambda n, why: None)
        elif op == "release" and names:
            s.release(names[r % len(names)])
        elif op == "resize":
            elastic = [n for n in s.placements if s.request(n).min_bundles is not None]
            if elastic:
                name = elastic[r % len(elastic)]
                req = s.request(name)
                with contextlib.suppress(RuntimeError):
                    s.resize(name, req.min_size + r % (len(req.bundles) - req.min_size + 1))
        elif op == "lose":
            s.remove_node(cluster.nodes[r % len(cluster.nodes)].name)
        elif op == "restore":
            s.restore_node(cluster.nodes[r % len(cluster.nodes)].name)
        check_invariants(s)


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), data=st.data(), policy=st.sampled_from(node_scoring.names()))
def test_release_returns_exactly_what_was_taken(cluster, data, policy):
    s = Scheduler(cluster, policy=policy)
    for k in range(data.draw(st.integers(0, 4))):  # some load first
        with contextlib.suppress(RequestError):
            s.submit(data.draw(gangs(f"pre{k}")))
    before = (s.state.cpu_free.copy(), s.state.mem_free.copy(), s.state.gpu_free.copy())
    req = dataclasses.replace(data.draw(gangs("x")), priority=-1)  # never preempts the load
    try:
        p = s.submit(req)
    except RequestError:
        return
    if p is None:
        s.release("x")
    else:
        taken = sum(req.bundles[a.bundle].cpu_milli for a in p.assignments)
        assert before[0].sum() - s.state.cpu_free.sum() == taken
        s.release("x")
    assert np.array_equal(before[0], s.state.cpu_free)
    assert np.array_equal(before[1], s.state.mem_free)
    assert np.array_equal(before[2], s.state.gpu_free)

"""Property tests over random clusters and request streams (hypothesis), small and at scale.

After every operation (or every few hundred at scale): no CPU, memory, milli-GPU or GPU memory is
oversubscribed and the free amounts equal capacity minus what placed gangs, the reservation and
draining gangs hold; placed gangs hold all their bundles (elastic ones between their minimum and maximum) and
satisfy their constraints; waiting and draining gangs hold nothing; quota usage equals what each
tenant's placed gangs hold; a notice only ever goes to a lower-priority gang of the same tenant or
to a gang of a borrowing tenant; victim sets are minimal for the preemptor's placement; a
reserved gang runs once the gangs that used its reserved nodes are gone; release returns exactly
what was taken.
"""

import contextlib
import dataclasses
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from infra.scheduler import (
    GPU,
    Bundle,
    Cluster,
    DifferentNodes,
    EventKind,
    GangRequest,
    GangState,
    Node,
    Quota,
    RequestError,
    SameGPU,
    SameNode,
    Scheduler,
    node_scoring,
)
from infra.scheduler.resources import Alloc

MODELS = ("A", "B")


@st.composite
def clusters(draw, min_nodes=1, max_nodes=4):
    n = draw(st.integers(min_nodes, max_nodes))
    nodes = []
    for i in range(n):
        g = draw(st.integers(0, 4))
        model = draw(st.sampled_from(MODELS))
        mem = draw(st.sampled_from([0, 8192, 16384]))
        nodes.append(
            Node(f"n{i}", draw(st.integers(2, 16)) * 1000, draw(st.integers(1, 16)) * 1024, (GPU(model, mem),) * g)
        )
    return Cluster(tuple(nodes))


@st.composite
def bundles(draw):
    kind = draw(st.sampled_from(["cpu", "whole", "frac"]))
    cpu = draw(st.integers(1, 8)) * 500
    mem = draw(st.integers(1, 8)) * 512
    models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=1)))
    gmem = draw(st.sampled_from([0, 0, 3000, 6000]))
    if kind == "cpu":
        return Bundle(cpu, mem)
    if kind == "whole":
        return Bundle(cpu, mem, gpus=draw(st.integers(1, 3)), gpu_models=models, gpu_memory_mib=gmem)
    frac = draw(st.sampled_from([100, 250, 300, 500, 700]))
    return Bundle(cpu, mem, gpu_fraction=frac, gpu_models=models, gpu_memory_mib=gmem)


@st.composite
def gangs(draw, name, tenants=("default",)):
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
    return GangRequest(
        name, bs, constraints, priority=draw(st.integers(0, 3)), min_bundles=elastic,
        tenant=draw(st.sampled_from(tenants)), grace_s=draw(st.sampled_from([0.0, 0.0, 5.0])),
        timeout_s=draw(st.sampled_from([None, None, 30.0])),
    )


def check_invariants(s: Scheduler) -> None:
    state = s.state
    assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()
    assert (state.gpu_free >= 0).all() and (state.gpu_free <= 1000).all()
    assert (state.gpu_mem_free >= 0).all() and (state.gpu_mem_free <= state.gpu_mem).all()
    assert (state.gpu_free[~state.gpu_exists] == 0).all()
    cpu, mem = np.zeros_like(state.cpu_free), np.zeros_like(state.mem_free)
    gpu, gmem = np.zeros_like(state.gpu_free), np.zeros_like(state.gpu_mem_free)
    usage = {}

    def add(a: Alloc) -> None:
        cpu[a.node] += a.cpu
        mem[a.node] += a.mem
        gpu[a.node, list(a.gpus)] += a.gpu_milli
        for g in a.gpus:
            gmem[a.node, g] += a.gpu_mem if state.gpu_mem[a.node, g] else 0

    for name in s.gangs():
        req, p = s.request(name), s.placement(name)
        if s.gang_state(name) is not GangState.PLACED:
            assert p is None and (name in s.queue) == (s.gang_state(name) is GangState.WAITING)
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
            add(Alloc(n, a.gpus, b.gpu_milli, b.cpu_milli, b.memory_mib, b.gpu_memory_mib))
            usage[req.tenant] = usage.get(req.tenant, 0) + b.total_gpu_milli
            where[a.bundle] = (a.node, a.gpus)
        for c in req.constraints:
            if isinstance(c, SameNode):
                assert len({where[i][0] for i in c.bundles}) == 1
            if isinstance(c, SameGPU):
                assert len({where[i] for i in c.bundles}) == 1
            if isinstance(c, DifferentNodes):
                assert len({where[i][0] for i in c.bundles}) == len(c.bundles)
    if s.reservation is not None:
        assert s.gang_state(s.reservation.gang) is GangState.WAITING
    for a in s.holds():  # the reservation's, and what draining gangs still run on
        add(a)
    live = state.alive
    assert np.array_equal(cpu[live], (state.cpu_cap - state.cpu_free)[live])
    assert np.array_equal(mem[live], (state.mem_cap - state.mem_free)[live])
    assert np.array_equal(gpu[live], (np.where(state.gpu_exists, 1000, 0) - state.gpu_free)[live])
    assert np.array_equal(gmem[live], (state.gpu_mem - state.gpu_mem_free)[live])
    if s.ledger.enabled:
        assert {t: u for t, u in s.ledger.usage.items() if u} == {t: u for t, u in usage.items() if u}


def check_notices(s: Scheduler, tenants: dict[str, str], priorities: dict[str, int], borrowing: set[str]) -> None:
    """Each notice went to a lower-priority gang of the preemptor's tenant or to a borrower's gang."""
    for e in s.events:
        if e.kind is EventKind.PREEMPT_NOTICE:
            by = e.detail["by"]
            same = tenants[e.gang] == tenants[by]
            assert (same and priorities[e.gang] < priorities[by]) or (not same and e.gang in borrowing), e


ops = st.lists(
    st.tuples(
        st.sampled_from(["submit"] * 4 + ["release", "resize", "lose", "restore", "stopped", "tick", "join"]),
        st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=30,
)


def apply(s: Scheduler, cluster: Cluster, op: str, r: int, draw_gang, t: float) -> None:
    """One operation of a random stream."""
    names = s.gangs()
    if op == "submit":
        with contextlib.suppress(RequestError):
            s.submit(draw_gang(), on_preempt=lambda n, why: None, now=t)
    elif op == "release" and names:
        s.release(names[r % len(names)], now=t)
    elif op == "resize":
        elastic = [n for n in s.placements if s.request(n).min_bundles is not None]
        if elastic:
            name = elastic[r % len(elastic)]
            req = s.request(name)
            with contextlib.suppress(RuntimeError):
                s.resize(name, req.min_size + r % (len(req.bundles) - req.min_size + 1), now=t)
    elif op == "lose":
        s.remove_node(s.cluster.nodes[r % len(s.cluster.nodes)].name, now=t)
    elif op == "restore":
        s.restore_node(s.cluster.nodes[r % len(s.cluster.nodes)].name, now=t)
    elif op == "stopped":
        draining = [n for n in names if s.gang_state(n) is GangState.DRAINING]
        if draining:
            s.stopped(draining[r % len(draining)], now=t)
    elif op == "tick":
        s.tick(now=t)
    elif op == "join" and len(s.cluster.nodes) < 8:
        s.add_node(Node(f"x{len(s.cluster.nodes)}", 8000, 8192, (GPU(MODELS[r % 2], 16384),) * (r % 3)), now=t)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), stream=ops, policy=st.sampled_from(node_scoring.names()), data=st.data(),
       quotas=st.booleans())
def test_invariants_hold_over_random_request_streams(cluster, stream, policy, data, quotas):
    tenants = ("a", "b") if quotas else ("default",)
    q = {"a": Quota(2000), "b": Quota(1000, borrowing_limit_milli=1000)} if quotas else None
    s = Scheduler(cluster, policy=policy, seed=1, quotas=q)
    tenant_of, prio_of, borrowing = {}, {}, set()
    for k, (op, r) in enumerate(stream):
        def draw_gang(k=k):
            g = data.draw(gangs(f"g{k}", tenants))
            tenant_of[g.name], prio_of[g.name] = g.tenant, g.priority
            return g
        borrowing |= {n for n in s.placements if s.ledger.borrowing(s.request(n).tenant)}
        apply(s, cluster, op, r, draw_gang, t=float(k))
        check_invariants(s)
    check_notices(s, tenant_of, prio_of, borrowing)


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), data=st.data(), policy=st.sampled_from(node_scoring.names()))
def test_release_returns_exactly_what_was_taken(cluster, data, policy):
    s = Scheduler(cluster, policy=policy, reserve=False)
    for k in range(data.draw(st.integers(0, 4))):  # some load first
        with contextlib.suppress(RequestError):
            s.submit(data.draw(gangs(f"pre{k}")))
    for waiting in s.queue:  # else the pass x's release runs may place one with what x gave back (a greedy policy,
        s.release(waiting)   # random, can leave a gang waiting that fits)
    before = (s.state.cpu_free.copy(), s.state.mem_free.copy(), s.state.gpu_free.copy(), s.state.gpu_mem_free.copy())
    req = dataclasses.replace(data.draw(gangs("x")), priority=-1)  # never preempts the load
    try:
        p = s.submit(req)
    except RequestError:
        assume(False)  # an invalid request takes nothing; draw another instead of passing vacuously
    if p is not None:
        taken = sum(req.bundles[a.bundle].cpu_milli for a in p.assignments)
        assert before[0].sum() - s.state.cpu_free.sum() == taken
    s.release("x")
    for was, now in zip(before, (s.state.cpu_free, s.state.mem_free, s.state.gpu_free, s.state.gpu_mem_free)):
        assert np.array_equal(was, now)


@settings(max_examples=80, deadline=None)
@given(cluster=clusters(2, 5), data=st.data(), policy=st.sampled_from(["fgd-strand", "bestfit", "pack"]))
def test_victim_sets_are_minimal_for_the_placement(cluster, data, policy):
    s = Scheduler(cluster, policy=policy, reserve=False)
    for k in range(data.draw(st.integers(1, 12))):
        with contextlib.suppress(RequestError):
            s.submit(dataclasses.replace(data.draw(gangs(f"low{k}")), priority=0))
    held = {n: [(s.state.node_index[a.node], a, s.request(n).bundles[a.bundle]) for a in p.assignments]
            for n, p in s.placements.items()}
    try:
        s.submit(dataclasses.replace(data.draw(gangs("high")), priority=9))
    except RequestError:
        assume(False)
    victims = [e.gang for e in s.events if e.kind is EventKind.PREEMPT_NOTICE]
    assume(victims)  # only streams that preempted say anything about minimal victim sets
    for v in victims:  # giving any one victim back its exact resources must fail: it was needed
        allocs = [Alloc(n, a.gpus, b.gpu_milli, b.cpu_milli, b.memory_mib, b.gpu_memory_mib) for n, a, b in held[v]]
        taken = []
        for a in allocs:
            if not s.state.fits(a):
                break
            s.state.allocate(a)
            taken.append(a)
        for a in taken:
            s.state.free(a)
        assert len(taken) < len(allocs), f"victim {v} could have kept running"


class ReservationWatch:
    """Checks the reservation bound (``infra/scheduler/reservation.py``) after every operation of a stream.

    While gang G (priority p) holds reservation R on target nodes T: what R holds never shrinks,
    except in an operation that placed a gang served before G (higher priority, or equal priority
    and earlier arrival) on T, which then counts as a blocker; G's quota keeps admitting it; and G
    is placed no later than the operation after which no blocker (a gang that ran or drained on T
    when R was made, or such a gang served before G) occupies T. R ends only when G is placed or
    leaves, a node of T is lost, a gang served before G takes the reservation over, or one is
    placed or grows (taking what R held or the quota G needs).
    """

    def __init__(self, s: Scheduler, priority: dict[str, int], arrival: dict[str, int]) -> None:
        self.s, self.priority, self.arrival = s, priority, arrival
        self.res = None
        self.seq = -1
        self.checked = 0

    def before(self, a: str, b: str) -> bool:
        return (-self.priority[a], self.arrival[a]) < (-self.priority[b], self.arrival[b])

    def after_operation(self) -> None:
        s = self.s
        new = s.events_since(self.seq)
        self.seq = s.events[-1].seq if s.events else self.seq
        if self.res is not None:
            self._check(new)
        if s.reservation is not self.res:
            self.res = s.reservation
            if self.res is not None:
                self.nodes = {s.cluster.nodes[n].name for n in self.res.nodes}
                self.blockers = set(self.res.blockers)
                self.held = _held(self.res)

    def _check(self, new) -> None:
        s, res, g = self.s, self.res, self.res.gang
        # A gang served before G that is placed, or that grows (an elastic gang's resize adding bundles), may take
        # what R held or the quota G needs.
        placed = [e for e in new if (e.kind is EventKind.PLACED or (e.kind is EventKind.RESIZED and e.detail.get("added")))
                  and self.before(e.gang, g)]
        ahead = {e.gang for e in placed if set(e.detail["nodes"]) & self.nodes}
        self.blockers |= ahead
        if s.reservation is not res:
            placed_or_gone = g not in s.gangs() or any(e.kind is EventKind.PLACED and e.gang == g for e in new)
            lost = any(e.kind is EventKind.NODE_LOST and e.detail["node"] in self.nodes for e in new)
            taken = any(e.kind is EventKind.RESERVED and self.before(e.gang, g) for e in new)
            assert placed_or_gone or lost or taken or placed, f"the reservation of {g} ended without cause: {new}"
            return
        held = _held(res)
        assert ahead or all(held[k] >= v for k, v in self.held.items()), f"what {g}'s reservation held went elsewhere"
        req = s.request(g)
        assert s.ledger.admissible(req.tenant, req.gpu_milli(req.min_size)), f"{g} lost its quota while reserved: {new}"
        self.held = held
        occupied = any(b in s.gangs_on(n) for n in self.nodes for b in self.blockers) or any(
            self.blockers & s.occupants(n) for n in self.nodes)
        assert occupied, f"{g} still waits although no blocker {sorted(self.blockers)} occupies {sorted(self.nodes)}"
        self.checked += 1


def _held(res) -> Counter:
    """What a reservation holds, per node (CPU, memory) and per GPU (milli-GPU, GPU memory)."""
    out = Counter()
    for a in res.holds:
        out[a.node, "cpu"] += a.cpu
        out[a.node, "mem"] += a.mem
        for g in a.gpus:
            out[a.node, g] += a.gpu_milli
            out[a.node, g, "mem"] += a.gpu_mem
    return out


long_ops = st.lists(  # more submissions and longer streams than ``ops``: queues long enough to reserve
    st.tuples(st.sampled_from(["submit"] * 6 + ["release"] * 2 + ["resize", "lose", "restore", "stopped", "tick"]),
              st.integers(0, 10**6)),
    min_size=10,
    max_size=80,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(1, 4), stream=long_ops, data=st.data(), quotas=st.booleans())
def test_the_reservation_bound_holds_with_mixed_priorities(cluster, stream, data, quotas):
    tenants = ("a", "b") if quotas else ("default",)
    q = {"a": Quota(2000), "b": Quota(1000, borrowing_limit_milli=1000)} if quotas else None
    s = Scheduler(cluster, policy="fgd-strand", seed=1, quotas=q)
    priority, arrival = {}, {}
    watch = ReservationWatch(s, priority, arrival)
    for k, (op, r) in enumerate(stream):
        def draw_gang(k=k):
            g = data.draw(gangs(f"g{k}", tenants))
            priority[g.name], arrival[g.name] = g.priority, k
            return g
        apply(s, cluster, op, r, draw_gang, t=float(k))
        watch.after_operation()
    check_invariants(s)
    assume(watch.checked)  # only streams that held a reservation across an operation test the bound


@st.composite
def big_clusters(draw):
    n = draw(st.integers(100, 400))
    nodes = []
    for i in range(n):
        g = draw(st.sampled_from([0, 1, 2, 4, 8]))
        nodes.append(Node(f"n{i}", draw(st.sampled_from([16, 32, 64, 96])) * 1000, 262144,
                          (GPU(MODELS[i % 2], 16384),) * g))
    return Cluster(tuple(nodes))


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cluster=big_clusters(), data=st.data(), seed=st.integers(0, 2**16))
def test_invariants_hold_at_hundreds_of_nodes_and_thousands_of_gangs(cluster, data, seed):
    """2,000-3,000 operations on 100-400 nodes with quotas, priorities 0-3 and grace periods; invariants
    checked every 250 operations, the reservation bound after every operation."""
    rng = np.random.default_rng(seed)
    total = 1000 * sum(len(n.gpus) for n in cluster.nodes)  # quotas at 80 % of the GPUs: both bind
    q = {"a": Quota(total // 2), "b": Quota(total * 3 // 10, borrowing_limit_milli=total // 5)}
    s = Scheduler(cluster, policy="fgd-strand", seed=seed, quotas=q)
    shapes = [data.draw(gangs(f"shape{i}", ("a", "b"))) for i in range(12)]
    tenant_of, prio_of, arrival, borrowing = {}, {}, {}, set()
    watch = ReservationWatch(s, prio_of, arrival)
    for k in range(int(rng.integers(2000, 3000))):
        op = rng.choice(["submit", "submit", "submit", "release", "stopped", "tick", "lose", "restore"],
                        p=[0.2, 0.2, 0.2, 0.3, 0.04, 0.04, 0.01, 0.01])
        def draw_gang(k=k):
            g = dataclasses.replace(shapes[int(rng.integers(len(shapes)))], name=f"g{k}",
                                    priority=int(rng.integers(0, 4)))
            tenant_of[g.name], prio_of[g.name], arrival[g.name] = g.tenant, g.priority, k
            return g
        if k % 50 == 0:
            borrowing |= {n for n in s.placements if s.ledger.borrowing(s.request(n).tenant)}
        apply(s, cluster, str(op), int(rng.integers(10**6)), draw_gang, t=float(k))
        watch.after_operation()
        if k % 250 == 0:
            check_invariants(s)
    check_invariants(s)
    assert len(s.placements) > 50

"""Routers and the multiplexing / routing simulation: invariants and closed-form cases."""

import itertools
import math
from dataclasses import replace

import pytest

from infra.llm.pool_shape import PoolShape
from infra.llm.router import (
    EngineCost,
    InstanceLoad,
    LeastLoaded,
    PrefillDecodeAware,
    RoundRobin,
    load_router,
)
from infra.llm.sim.emulator import job_work
from infra.llm.sim.phased import dedicated_placement, multiplexed_placement, simulate_group
from infra.llm.sim.report import BenchConfig, run_simulated
from infra.llm.sim.routing import RouterWorkload, simulate_routing
from infra.llm.sim.service_pool import DrawSource, HomeRule, ServicePool, home_nodes, simulate_services
from infra.llm.sim.sizing import dedicated_service_jct, size_service_pool
from infra.llm.sim.workload import Hardware, JobProfile, draw_batch, mixed_workload


def test_routers_choose_by_their_rule() -> None:
    loads = [
        InstanceLoad(outstanding=1, queued_prefill_tokens=8000, running=0),
        InstanceLoad(outstanding=3, queued_prefill_tokens=0, running=3),
    ]
    assert LeastLoaded().choose(100, loads) == 0  # fewest requests, blind to their length
    assert PrefillDecodeAware(EngineCost()).choose(100, loads) == 1  # a long prompt queued dominates
    rr = RoundRobin()
    assert [rr.choose(1, loads) for _ in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="unknown router"):
        load_router("random")


def test_routing_simulation_single_instance_is_router_independent() -> None:
    wl = RouterWorkload(requests=300, rate_per_s=5.0)
    cost = EngineCost()
    results = [
        simulate_routing(load_router(n, cost), 1, wl, cost, seed=3)
        for n in ("round_robin", "prefill_decode_aware")
    ]
    assert results[0] == results[1]
    assert 0 < results[0]["ttft_p50_s"] <= results[0]["ttft_p99_s"] < results[0]["e2e_mean_s"] * 10


def test_dedicated_job_matches_closed_form() -> None:
    hw = Hardware()
    p = JobProfile(
        "j",
        "math",
        params=1e9,
        gpus=1,
        iterations=2,
        batch=1,
        prompt_median=100,
        prompt_sigma=0.0,
        out_median=1000,
        out_sigma=0.0,
        reward_median_s=0.0,
    )
    out = simulate_group([p], hw, seed=0)
    prefill = 2 * p.params / (hw.peak_flops * hw.prefill_mfu) * 100
    decode = 1000 * (hw.decode_step_s + hw.decode_s_per_seq)
    train = 10 * p.params * 1000 / (hw.peak_flops * hw.train_mfu)
    assert out["j"]["jct_s"] == pytest.approx(2 * (prefill + decode + train), rel=1e-9)
    assert out["_group"]["swap_gpu_s"] == 0.0


def test_sharing_a_group_bounds() -> None:
    hw = Hardware()
    jobs = [
        JobProfile(f"m{i}", "math", iterations=2, batch=64, out_median=400, reward_median_s=60.0)
        for i in range(2)
    ]
    alone = [simulate_group([j], hw, seed=1)[j.name]["jct_s"] for j in jobs]
    shared = simulate_group(jobs, hw, seed=1)
    grp = shared.pop("_group")
    assert grp["makespan_s"] >= max(alone)  # sharing never makes a job faster than alone here
    assert grp["busy_gpu_s"] <= jobs[0].gpus * grp["makespan_s"] + 1e-6
    assert grp["swap_gpu_s"] > 0
    assert all(math.isfinite(r["jct_s"]) and r["jct_s"] > 0 for r in shared.values())


def test_multiplexing_respects_the_slowdown_bound_it_planned_for() -> None:
    hw = Hardware()
    jobs = [
        JobProfile(f"m{i}", "math", iterations=2, batch=64, out_median=300, reward_median_s=120.0)
        for i in range(3)
    ]
    ded = dedicated_placement(jobs, hw, cluster_gpus=12, seed=0)
    loose = multiplexed_placement(
        jobs, hw, ded, cluster_gpus=12, max_slowdown=10.0, seed=0, profile_iterations=2
    )
    assert len(loose.groups) < len(jobs)  # reward-heavy jobs leave room to share
    assert loose.gpu_hours < ded.gpu_hours
    strict = multiplexed_placement(
        jobs, hw, ded, cluster_gpus=12, max_slowdown=1.0, seed=0, profile_iterations=2
    )
    assert strict.groups == [[j.name] for j in jobs] or len(strict.groups) == len(jobs)
    with pytest.raises(ValueError, match="cluster has 8"):
        dedicated_placement(mixed_workload(4, 1), hw, cluster_gpus=8)


def _small_mix() -> list[JobProfile]:
    return [replace(p, iterations=2, batch=24, out_cap=2048) for p in mixed_workload(4, 2)]


def test_services_conserve_requests_capacity_and_affinity() -> None:
    jobs = _small_mix()
    pool = ServicePool(PoolShape(rollout_gpus=6, trainer_gpus=4, rollout_homes=1), node_gpus=4, capacity=10, max_resident=2)
    out = simulate_services(jobs, Hardware(), pool, seed=2, trace=True)
    # every turn of every sequence served exactly once, turns in order, every sequence of every iteration
    served = [(job, it, seq, turn) for job, it, seq, turn, _ in out.served]
    assert len(served) == len(set(served))
    turns: dict[tuple[str, int, int], list[int]] = {}
    for job, it, seq, turn in served:
        turns.setdefault((job, it, seq), []).append(turn)
    assert sorted(turns) == sorted(
        (p.name, it, s) for p in jobs for it in range(p.iterations) for s in range(p.batch)
    )
    assert all(ts == list(range(len(ts))) for ts in turns.values())
    assert any(len(ts) > 1 for ts in turns.values())  # agent jobs really had multi-turn sequences
    # affinity: requests only on the job's home nodes, chunks only for jobs whose weights are resident
    node = {i: i // pool.node_gpus for i in range(pool.shape.rollout_gpus)}
    assert all(node[i] in out.homes[job] for job, _, _, _, i in out.served)
    assert len({out.homes[p.name] for p in jobs}) > 1  # affinity really restricts (two home nodes used)
    by_inst: dict[int, list[tuple[float, float]]] = {}
    for i, job, start, end, n_job, n_inst, resident in out.chunks:
        assert job in resident and len(resident) <= pool.max_resident
        assert 1 <= n_job <= n_inst <= pool.capacity
        by_inst.setdefault(i, []).append((start, end))
    for spans in by_inst.values():  # an instance runs one chunk at a time
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(spans))
    assert out.busy_gpu_s <= out.reserved_gpu_s
    assert max(n_inst for *_, n_inst, _ in out.chunks) == pool.capacity  # the capacity was binding


def _single_sequence_job(name: str) -> JobProfile:
    """One sequence of 100 prompt and 1,000 output tokens, one iteration, one GPU, no reward time."""
    return JobProfile(
        name,
        "math",
        params=1e9,
        gpus=1,
        iterations=1,
        batch=1,
        prompt_median=100,
        prompt_sigma=0.0,
        out_median=1000,
        out_sigma=0.0,
        reward_median_s=0.0,
    )


def _closed_form(p: JobProfile, hw: Hardware) -> tuple[float, float, float, float]:
    """Rollout weight swap, train-state swap, and the rollout and train times (swaps included) of
    :func:`_single_sequence_job`."""
    swap_roll = 2 * p.params / hw.pcie_bytes_per_s
    swap_train = 2 * 16 * p.params / hw.pcie_bytes_per_s
    rollout = (
        swap_roll
        + 2 * p.params / (hw.peak_flops * hw.prefill_mfu) * 100
        + 1000 * (hw.decode_step_s + hw.decode_s_per_seq)
    )
    train = swap_train + 10 * p.params * 1000 / (hw.peak_flops * hw.train_mfu)
    return swap_roll, swap_train, rollout, train


def test_services_match_closed_form_on_two_single_sequence_jobs() -> None:
    hw = Hardware()
    p = _single_sequence_job("a")
    jobs = [p, replace(p, name="b")]
    out = simulate_services(jobs, hw, ServicePool(PoolShape(rollout_gpus=1, trainer_gpus=1)), seed=0)
    swap_roll, swap_train, rollout, train = _closed_form(p, hw)
    # one instance, one resident job at a time: b waits for a's sequence, then swaps its weights in
    assert out.jobs["a"]["jct_s"] == pytest.approx(rollout + train, rel=1e-9)
    assert out.jobs["b"]["jct_s"] == pytest.approx(2 * rollout + train, rel=1e-9)
    assert out.jobs["b"]["charged_gpu_s"] == pytest.approx(rollout + train, rel=1e-9)
    assert out.reserved_gpu_s == pytest.approx(2 * (2 * rollout + train), rel=1e-9)
    # b arriving after a is done runs as if alone (its weights and train state still swap in)
    later = simulate_services(
        jobs, hw, ServicePool(PoolShape(rollout_gpus=1, trainer_gpus=1)), seed=0, arrivals=[0.0, 100.0]
    )
    assert later.jobs["b"]["jct_s"] == pytest.approx(rollout + train, rel=1e-9)
    assert later.makespan_s == pytest.approx(100.0 + rollout + train, rel=1e-9)
    with pytest.raises(ValueError, match="one start time >= 0 per job"):
        simulate_services(jobs, hw, ServicePool(PoolShape(rollout_gpus=1, trainer_gpus=1)), seed=0, arrivals=[0.0])
    alone = dedicated_service_jct([p], hw, seed=0)["a"]
    assert alone.jobs["a"]["jct_s"] == pytest.approx(rollout + train - swap_roll - swap_train, rel=1e-9)


def test_pool_sizing_respects_the_bound_and_is_minimal() -> None:
    hw = Hardware()
    jobs = _small_mix()
    ded = {n: r.jobs[n]["jct_s"] for n, r in dedicated_service_jct(jobs, hw, seed=0).items()}
    base = ServicePool(PoolShape(rollout_gpus=1, trainer_gpus=4))
    sized = size_service_pool(jobs, hw, base, max_slowdown=1.10, seeds=[0], max_gpus=16)
    rerun = simulate_services(jobs, hw, sized.pool, seed=0)
    assert max(rerun.jobs[n]["jct_s"] / ded[n] for n in ded) <= 1.10
    total = sized.pool.shape.rollout_gpus + sized.pool.shape.trainer_gpus
    assert total < sum(p.gpus for p in jobs)  # sharing saves GPUs on this workload
    for t in range(4, total, 4):  # no smaller pool (any split) meets the bound
        smaller = (
            simulate_services(jobs, hw, base.with_shape(rollout_gpus=total - 1 - t, trainer_gpus=t), seed=0)
            if total - 1 - t >= 1
            else None
        )
        if smaller is not None:
            assert max(smaller.jobs[n]["jct_s"] / ded[n] for n in ded) > 1.10
    with pytest.raises(ValueError, match="no service pool"):
        size_service_pool(jobs, hw, base, max_slowdown=1.0, seeds=[0], max_gpus=8)
    robust = size_service_pool(jobs, hw, base, max_slowdown=1.10, seeds=[0, 1], max_gpus=16)
    assert (
        robust.pool.shape.rollout_gpus + robust.pool.shape.trainer_gpus >= total
    )  # more draws never need a smaller pool
    assert max(robust.slowdown.values()) <= 1.10
    with pytest.raises(ValueError, match="multiple of the jobs"):
        simulate_services(jobs, hw, ServicePool(PoolShape(rollout_gpus=4, trainer_gpus=6)), seed=0)


def test_elastic_pool_matches_closed_form_and_holds_gpus_only_while_used() -> None:
    hw = Hardware()
    p = _single_sequence_job("a")
    jobs = [p, replace(p, name="b")]
    _, _, rollout, train = _closed_form(p, hw)
    provision, keep = 3.0, 1.0
    pool = ServicePool(PoolShape(rollout_gpus=1, trainer_gpus=1, keep_alive_s=keep), provision_s=provision)
    # b arrives after a's GPUs were handed back: both pay the start-up of each GPU they take
    apart = simulate_services(jobs, hw, pool, seed=0, arrivals=[0.0, 100.0], trace=True)
    for name in ("a", "b"):
        assert apart.jobs[name]["jct_s"] == pytest.approx(2 * provision + rollout + train, rel=1e-9)
        assert apart.jobs[name]["charged_gpu_s"] == pytest.approx(2 * provision + rollout + train, rel=1e-9)
    assert apart.reserved_gpu_s == pytest.approx(2 * (2 * provision + rollout + train + 2 * keep), rel=1e-9)
    assert apart.peak_gpus == 2  # the rollout GPU's keep-alive overlaps the train step
    held = sum(end - start for *_, start, end in apart.holds)
    assert held == pytest.approx(apart.reserved_gpu_s, rel=1e-12)
    for i, _, start, end, *_ in apart.chunks:  # every chunk runs on a GPU the pool holds
        assert any(s == "rollout" and k == i and a <= start and end <= e for s, k, a, e in apart.holds)
    # with a keep-alive longer than the gap, b finds both GPUs still held: no start-up, only swaps
    kept = simulate_services(jobs, hw, pool.with_shape(keep_alive_s=1000.0), seed=0, arrivals=[0.0, 100.0])
    assert kept.jobs["b"]["jct_s"] == pytest.approx(rollout + train, rel=1e-9)
    static = simulate_services(jobs, hw, pool.with_shape(keep_alive_s=None), seed=0, arrivals=[0.0, 100.0])
    assert apart.reserved_gpu_s < static.reserved_gpu_s  # idle GPUs went back to the cluster
    with pytest.raises(ValueError, match=r"shape\.keep_alive_s=-1\.0 must be >= 0 seconds"):
        simulate_services(jobs, hw, pool.with_shape(keep_alive_s=-1.0), seed=0)
    with pytest.raises(ValueError, match=r"provision_s=-1\.0 must be >= 0 seconds"):
        simulate_services(jobs, hw, replace(pool, provision_s=-1.0), seed=0)


def test_elastic_pool_conserves_requests_and_never_runs_on_a_handed_back_gpu() -> None:
    jobs = _small_mix()
    pool = ServicePool(
        PoolShape(rollout_gpus=6, trainer_gpus=8, rollout_homes=1, keep_alive_s=2.0), node_gpus=4, capacity=10
    )
    out = simulate_services(jobs, Hardware(), pool, seed=2, trace=True)
    served = [(job, it, seq, turn) for job, it, seq, turn, _ in out.served]
    assert len(served) == len(set(served))
    assert {(job, it, seq) for job, it, seq, _ in served} == {
        (p.name, it, s) for p in jobs for it in range(p.iterations) for s in range(p.batch)
    }
    for i, _, start, end, *_ in out.chunks:
        assert any(
            s == "rollout" and k == i and a <= start + 1e-9 and end <= e + 1e-9 for s, k, a, e in out.holds
        )
    for service in ("rollout", "trainer"):  # a GPU is never taken twice at once
        spans: dict[int, list[tuple[float, float]]] = {}
        for s, k, a, e in out.holds:
            if s == service:
                spans.setdefault(k, []).append((a, e))
        for row in spans.values():
            row.sort()
            assert all(x[1] <= y[0] for x, y in itertools.pairwise(row))
    gang = jobs[0].gpus
    assert out.reserved_gpu_s == pytest.approx(
        sum((1 if s == "rollout" else gang) * (e - a) for s, _, a, e in out.holds), rel=1e-9
    )
    assert out.busy_gpu_s <= out.reserved_gpu_s
    assert 0 < out.peak_gpus <= pool.shape.rollout_gpus + pool.shape.trainer_gpus
    assert (
        len([h for h in out.holds if h[0] == "rollout"]) > pool.shape.rollout_gpus
    )  # GPUs really went and came back


def test_earliest_deadline_first_serves_the_job_furthest_behind() -> None:
    hw = Hardware()
    jobs = [_single_sequence_job(n) for n in ("a", "b", "c")]
    pool = ServicePool(PoolShape(rollout_gpus=1, trainer_gpus=1), capacity=1)
    fifo = simulate_services(jobs, hw, pool, seed=0)
    edf = simulate_services(jobs, hw, pool, seed=0, pace={"a": 1.0, "b": 100.0, "c": 10.0})
    # a takes the one instance; b then c queue. FIFO serves b first, EDF c (its deadline is earlier)
    assert fifo.jobs["b"]["jct_s"] < fifo.jobs["c"]["jct_s"]
    assert edf.jobs["c"]["jct_s"] < edf.jobs["b"]["jct_s"]
    assert edf.jobs["c"]["jct_s"] == pytest.approx(fifo.jobs["b"]["jct_s"], rel=1e-9)


def test_simulated_benchmark_reports_each_placement_against_its_targets() -> None:
    cfg = BenchConfig(jobs=2, gpus=12, iterations=1, slowdowns=(1.10, 3.0), router_requests=200)
    run = run_simulated(cfg)
    res = run.results
    assert set(res["multiplex"]) == {"dedicated", "max_slowdown_1.10", "max_slowdown_3.00"}
    strict, loose = res["multiplex"]["max_slowdown_1.10"], res["multiplex"]["max_slowdown_3.00"]
    assert strict["slowdown_max_ratio"] <= loose["slowdown_max_ratio"] or strict["groups"] == loose["groups"]
    assert res["targets"]["gpu_hours_saving_pct_at_slowdown_1_10"] == strict["gpu_hours_saving_pct"]
    assert res["targets"]["gpu_hours_saving_target_met"] == (
        strict["gpu_hours_saving_pct"] >= 40 and strict["slowdown_max_ratio"] <= 1.10
    )
    for kind in ("static", "elastic"):  # each sized pool keeps every job within the bound it was sized for
        rl = res["services"][kind]["request_level"]
        assert rl is not None and rl["slowdown_max_ratio"] <= cfg.service_slowdown
        assert rl["gpus_used"] == rl["pool"]["shape"]["rollout_gpus"] + rl["pool"]["shape"]["trainer_gpus"]
    static, elastic = (res["services"][k]["request_level"] for k in ("static", "elastic"))
    # the elastic pool hands idle GPUs back: it reserves fewer GPU-hours and never peaks above its size
    assert elastic["user_gpu_hours_reserved"] < static["user_gpu_hours_reserved"]
    assert elastic["peak_gpus"] <= elastic["gpus_used"]
    assert set(res["pace_s_per_iteration"]) == {p["name"] for p in run.config["jobs"]}  # EDF by default
    assert run_simulated(replace(cfg, priority="fifo")).results["pace_s_per_iteration"] is None
    assert set(res["router"]) == {"round_robin", "least_loaded", "prefill_decode_aware"}
    # 8 GPUs hold the dedicated jobs but no shared pool within 1.10x: reported as a result, not a crash
    small = run_simulated(
        replace(cfg, gpus=8, targets=replace(cfg.targets, gpu_hours_saving_pct=101.0))
    ).results
    assert small["services"]["static"]["request_level"] is None
    assert "no service pool of at most 8 GPUs" in small["services"]["static"]["error"]
    assert small["targets"]["request_level_target_met_on_3rd_draw"] == {"static": False, "elastic": False}
    assert not small["targets"]["gpu_hours_saving_target_met"]  # a target no run can meet


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"jobs": 0}, "jobs=0"),
        ({"slowdowns": (0.9,)}, "bounds >= 1.0"),
        ({"service_slowdown": 0.5}, "bounds >= 1.0"),
        ({"keep_alive_s": -1.0}, "keep_alive_s=-1.0"),
        ({"priority": "lifo"}, "'edf' or 'fifo'"),
    ],
)
def test_bench_config_names_the_bad_field(change: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BenchConfig(**change).validate()


def test_turn_synchronous_batches_wait_for_their_slowest_sequence_on_one_instance() -> None:
    hw = Hardware()
    agent = replace(mixed_workload(2, 2)[1], gpus=1, batch=16)
    assert agent.kind == "agent"
    ded = ServicePool(PoolShape(1, 1), node_gpus=1, capacity=16, swap=False, turn_sync=True, draws=DrawSource.EMULATOR)
    alone = simulate_services([agent], hw, ded, seed=3)
    # alone, each turn lasts its slowest sequence's decode, then the slowest tool call: the emulator's closed form
    closed = sum(w.alone_s for w in job_work(agent, hw, 3))
    assert alone.jobs[agent.name]["jct_s"] == pytest.approx(closed, rel=1e-3)
    free = simulate_services([agent], hw, replace(ded, turn_sync=False), seed=3)
    assert free.jobs[agent.name]["jct_s"] < 0.9 * alone.jobs[agent.name]["jct_s"]  # sequences went on alone
    # shared: no sequence starts turn k+1 before every sequence of turn k ended and its tool call returned
    jobs = [replace(p, gpus=1, batch=16, iterations=2) for p in mixed_workload(4, 2)]
    pool = ServicePool(PoolShape(4, 2, keep_alive_s=5.0), node_gpus=1, capacity=16, turn_sync=True, draws=DrawSource.EMULATOR)
    out = simulate_services(jobs, hw, pool, seed=3, trace=True)
    on: dict[tuple[str, int, int], set[int]] = {}
    for job, it, _, turn, i in out.served:
        on.setdefault((job, it, turn), set()).add(i)
    assert all(len(inst) == 1 for inst in on.values())  # a turn's batch is one request, on one instance
    assert max(t for _, _, t in on) >= 2
    for p in jobs:  # sharing never makes a batch end before its slowest sequence and tool call
        assert out.jobs[p.name]["jct_s"] >= sum(w.alone_s for w in job_work(p, hw, 3)) * (1 - 1e-3)
    assert draw_batch(jobs[1], 3, 0).n_turns.max() > 1  # the agents really had multi-turn sequences


def test_homes_by_demand_spread_two_heavy_jobs() -> None:
    heavy, light = (0.45, 0.25), (0.05, 0.02)
    jobs = [replace(p, gpus=1, batch=8, iterations=1) for p in mixed_workload(4, 1)]
    demand = {p.name: heavy if p.kind == "math" else light for p in jobs}  # math0, math2 heavy
    pool = ServicePool(PoolShape(4, 2, rollout_homes=2, keep_alive_s=5.0), node_gpus=1, trainer_home_nodes=1, capacity=8)
    by_index = home_nodes(jobs, pool, 4, 2, None)
    assert by_index[0] == by_index[2] == ([0, 1], [0])  # job index pairs the heavy jobs on rollout and trainer
    by_demand = home_nodes(jobs, replace(pool, homes=HomeRule.DEMAND), 4, 2, demand)
    assert [h for h, _ in by_demand] == [[0, 1], [2, 3], [2, 3], [0, 1]]
    assert [t for _, t in by_demand] == [[0], [1], [1], [0]]  # one heavy job per trainer, each beside a light one
    out = simulate_services(jobs, Hardware(), replace(pool, homes=HomeRule.DEMAND), seed=0, demand=demand)
    assert out.homes == {p.name: tuple(h) for p, (h, _) in zip(jobs, by_demand, strict=True)}
    with pytest.raises(ValueError, match="needs demand"):
        simulate_services(jobs, Hardware(), replace(pool, homes=HomeRule.DEMAND), seed=0)


def test_elastic_pool_hands_a_finished_jobs_gpus_back_and_holds_from_ready() -> None:
    hw = Hardware()
    p = _single_sequence_job("a")
    jobs = [p, replace(p, name="b")]
    _, _, rollout, train = _closed_form(p, hw)
    provision, keep = 3.0, 1.0
    pool = ServicePool(PoolShape(rollout_gpus=2, trainer_gpus=2, rollout_homes=1, keep_alive_s=keep), trainer_home_nodes=1,
                       node_gpus=1, provision_s=provision, homes=HomeRule.DEMAND)
    demand = {"a": (0.5, 0.5), "b": (0.5, 0.5)}
    base = simulate_services(jobs, hw, pool, seed=0, demand=demand, trace=True)
    assert base.homes == {"a": (0,), "b": (1,)}  # the second job takes the emptier nodes
    # each job holds its rollout GPU through the keep-alive after its turn, its trainer after the step
    assert base.reserved_gpu_s == pytest.approx(2 * (2 * provision + rollout + train + 2 * keep), rel=1e-9)
    done = simulate_services(jobs, hw, replace(pool, release_on_finish=True), seed=0, demand=demand, trace=True)
    # the trainer idles only once the job ended: handed back at once, no keep-alive
    assert done.reserved_gpu_s == pytest.approx(base.reserved_gpu_s - 2 * keep, rel=1e-9)
    assert all(e == pytest.approx(done.jobs[n]["jct_s"]) for s, k, _, e in done.holds if s == "trainer"
               for n in [("a", "b")[k]])
    ready = simulate_services(jobs, hw, replace(pool, held_from_ready=True), seed=0, demand=demand)
    assert ready.reserved_gpu_s == pytest.approx(base.reserved_gpu_s - 4 * provision, rel=1e-9)  # 4 leases
    assert ready.jobs == base.jobs  # billing only: the start-up still delays the jobs


def test_the_running_pool_and_its_simulation_hold_one_pool_shape() -> None:
    """``PoolShape`` is the one description: neither pool repeats one of its fields, and both refuse a bad
    shape with the same one-line error naming the field and the fix."""
    import dataclasses
    import typing

    from infra.common.typed_config import ConfigError
    from infra.llm.elastic import PoolConfig

    shared = {f.name for f in dataclasses.fields(PoolShape)}
    for pool in (PoolConfig, ServicePool):
        assert typing.get_type_hints(pool)["shape"] is PoolShape
        assert {f.name for f in dataclasses.fields(pool)} & shared == set(), pool
    for change, message in [({"rollout_gpus": 0}, r"shape\.rollout_gpus=0 must be >= 1"),
                            ({"trainer_gpus": 0}, r"shape\.trainer_gpus=0 must be >= 1"),
                            ({"rollout_homes": 0}, r"shape\.rollout_homes=0 must be >= 1"),
                            ({"keep_alive_s": float("nan")}, r"shape\.keep_alive_s=nan must be >= 0 seconds")]:
        bad = replace(PoolShape(4, 2), **change)
        for check in (PoolConfig(bad).validate, ServicePool(bad).validate):
            with pytest.raises(ConfigError, match=message) as err:
                check()
            assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"shape\.rollout_homes=3 exceeds shape\.rollout_gpus=2"):
        PoolConfig(PoolShape(2, 1, rollout_homes=3)).validate()  # the running pool: one home per slot
    ServicePool(PoolShape(1, 4, rollout_homes=2), node_gpus=4).validate()  # the simulation: homes modulo nodes
    with pytest.raises(ConfigError, match=r"unknown router 'random'"):
        PoolConfig(PoolShape(2, 1), router="random").validate()

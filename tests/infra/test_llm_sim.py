"""Routers and the multiplexing / routing simulation: invariants and closed-form cases."""

import math

import pytest

from infra.llm.router import (
    EngineCost,
    InstanceLoad,
    LeastLoaded,
    PrefillDecodeAware,
    RoundRobin,
    load_router,
)
from infra.llm.simulate import (
    Hardware,
    JobProfile,
    RouterWorkload,
    dedicated_placement,
    mixed_workload,
    multiplexed_placement,
    simulate_group,
    simulate_routing,
)


def test_routers_choose_by_their_rule() -> None:
    loads = [InstanceLoad(outstanding=1, queued_prefill_tokens=8000, running=0),
             InstanceLoad(outstanding=3, queued_prefill_tokens=0, running=3)]
    assert LeastLoaded().choose(100, loads) == 0  # fewest requests, blind to their length
    assert PrefillDecodeAware(EngineCost()).choose(100, loads) == 1  # a long prompt queued dominates
    rr = RoundRobin()
    assert [rr.choose(1, loads) for _ in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="unknown router"):
        load_router("random")


def test_routing_simulation_single_instance_is_router_independent() -> None:
    wl = RouterWorkload(requests=300, rate_per_s=5.0)
    cost = EngineCost()
    results = [simulate_routing(load_router(n, cost), 1, wl, cost, seed=3) for n in ("round_robin", "prefill_decode_aware")]
    assert results[0] == results[1]
    assert 0 < results[0]["ttft_p50_s"] <= results[0]["ttft_p99_s"] < results[0]["e2e_mean_s"] * 10


def test_dedicated_job_matches_closed_form() -> None:
    hw = Hardware()
    p = JobProfile("j", "math", params=1e9, gpus=1, iterations=2, batch=1, prompt_median=100, prompt_sigma=0.0,
                   out_median=1000, out_sigma=0.0, reward_median_s=0.0)
    out = simulate_group([p], hw, seed=0)
    prefill = 2 * p.params / (hw.peak_flops * hw.prefill_mfu) * 100
    decode = 1000 * (hw.decode_step_s + hw.decode_s_per_seq)
    train = 10 * p.params * 1000 / (hw.peak_flops * hw.train_mfu)
    assert out["j"]["jct_s"] == pytest.approx(2 * (prefill + decode + train), rel=1e-9)
    assert out["_group"]["swap_gpu_s"] == 0.0


def test_sharing_a_group_bounds() -> None:
    hw = Hardware()
    jobs = [JobProfile(f"m{i}", "math", iterations=2, batch=64, out_median=400, reward_median_s=60.0) for i in range(2)]
    alone = [simulate_group([j], hw, seed=1)[j.name]["jct_s"] for j in jobs]
    shared = simulate_group(jobs, hw, seed=1)
    grp = shared.pop("_group")
    assert grp["makespan_s"] >= max(alone)  # sharing never makes a job faster than alone here
    assert grp["busy_gpu_s"] <= jobs[0].gpus * grp["makespan_s"] + 1e-6
    assert grp["swap_gpu_s"] > 0
    assert all(math.isfinite(r["jct_s"]) and r["jct_s"] > 0 for r in shared.values())


def test_multiplexing_respects_the_slowdown_bound_it_planned_for() -> None:
    hw = Hardware()
    jobs = [JobProfile(f"m{i}", "math", iterations=2, batch=64, out_median=300, reward_median_s=120.0) for i in range(3)]
    ded = dedicated_placement(jobs, hw, cluster_gpus=12, seed=0)
    loose = multiplexed_placement(jobs, hw, ded, cluster_gpus=12, max_slowdown=10.0, seed=0, profile_iterations=2)
    assert len(loose.groups) < len(jobs)  # reward-heavy jobs leave room to share
    assert loose.gpu_hours < ded.gpu_hours
    strict = multiplexed_placement(jobs, hw, ded, cluster_gpus=12, max_slowdown=1.0, seed=0, profile_iterations=2)
    assert strict.groups == [[j.name] for j in jobs] or len(strict.groups) == len(jobs)
    with pytest.raises(ValueError, match="cluster has 8"):
        dedicated_placement(mixed_workload(4, 1), hw, cluster_gpus=8)

"""Cross-job multiplexing in-process: slices never overlap, weights never mix, crashes stay local."""

import dataclasses
import itertools
import threading

import pytest
import torch

from infra.llm.gpu_group import GPUGroup
from infra.llm.grpo_trainer import llm_grpo_config
from infra.llm.handles import LocalHandle
from infra.llm.model import ModelConfig
from infra.llm.multiplex import JobRefused, LLMJobSpec, Multiplexer
from infra.llm.rlvr import RLVRConfig, local_services, run_job
from infra.llm.service_actors import RewardService, RolloutService, TrainerService
from infra.llm.verifiable_tasks import VOCAB_SIZE

torch.set_num_threads(1)

SMALL = ModelConfig(kind="char", vocab_size=VOCAB_SIZE, max_len=16, d_model=32, n_heads=2, n_layers=1)


def _cfg(name: str, seed: int, task: str = "sort") -> RLVRConfig:
    return RLVRConfig(
        name=name,
        task=task,
        task_size=3 if task == "sort" else 1,
        seed=seed,
        iterations=3,
        prompts_per_iter=4,
        grpo=llm_grpo_config(group_size=4),
        warmup_steps=2,
        warmup_batch=8,
        eval_prompts=8,
        eval_every=2,
        model=SMALL,
        checkpoint_every=0,  # the same job names run several times here; a checkpoint is never overwritten
    )


def _group(name: str = "g0", node: str = "n0") -> GPUGroup:
    return GPUGroup(
        name,
        node,
        gpu_memory_mib=16_384,
        num_gpus=1,
        host_memory_mib=65_536,
        rollout=LocalHandle(RolloutService(SMALL)),
        trainer=LocalHandle(TrainerService()),
    )


def _overlaps(slices: list) -> list:
    s = sorted(slices, key=lambda r: r.start)
    return [(a, b) for a, b in itertools.pairwise(s) if b.start < a.end]


def test_interleaved_jobs_match_jobs_run_alone_and_slices_never_overlap() -> None:
    cfgs = [_cfg("a", 1), _cfg("b", 2, task="add"), _cfg("c", 3)]
    alone = {c.name: run_job(c.name, c, local_services(c)) for c in cfgs}

    group = _group()
    mux = Multiplexer([group], LocalHandle(RewardService()))
    results = mux.run([(LLMJobSpec(c.name, SMALL.num_params()), c) for c in cfgs], timeout_s=120)

    for c in cfgs:
        res = results[c.name]
        assert not isinstance(res, BaseException), res
        assert res.version == alone[c.name].version
        for k, v in alone[c.name].weights.items():
            assert torch.equal(res.weights[k], v), (
                f"job {c.name}: parameter {k} differs from the job run alone"
            )
        assert [r.get("mean_reward") for r in res.rows] == [r.get("mean_reward") for r in alone[c.name].rows]
    # Jobs really interleaved on the shared services, and the rollout swapped weights between them.
    order = [s.job for s in sorted(mux.slices(), key=lambda s: s.start)]
    assert sum(a != b for a, b in itertools.pairwise(order)) >= 2 * len(cfgs)
    assert group.rollout.service.swaps > 3
    for svc in (group.rollout.service, group.trainer.service):
        assert _overlaps(svc.slices()) == []
    assert _overlaps(mux.slices()) == []
    assert group.rollout.service.jobs() == [] and group.trainer.service.jobs() == []


def test_one_job_crash_leaves_the_others_untouched() -> None:
    good = _cfg("good", 5)
    # The crashing job asks for completions longer than the model's context: it fails mid-run, after
    # registering on the shared services.
    bad = dataclasses.replace(_cfg("bad", 6), task_size=14)
    alone = run_job("good", good, local_services(good))
    group = _group()
    mux = Multiplexer([group], LocalHandle(RewardService()))
    results = mux.run(
        [(LLMJobSpec("bad", SMALL.num_params()), bad), (LLMJobSpec("good", SMALL.num_params()), good)]
    )
    assert isinstance(results["bad"], Exception)
    res = results["good"]
    assert not isinstance(res, BaseException), res
    for k, v in alone.weights.items():
        assert torch.equal(res.weights[k], v)
    assert group.trainer.service.jobs() == []  # the crashed job's state was dropped


def test_admission_refuses_too_large_models_and_respects_affinity() -> None:
    mux = Multiplexer([_group("g0", "n0"), _group("g1", "n1")], LocalHandle(RewardService()))
    with pytest.raises(JobRefused, match="largest GPU"):
        mux.admit(LLMJobSpec("huge", num_params=70_000_000_000))
    with pytest.raises(JobRefused, match="training state"):
        mux.admit(LLMJobSpec("big", num_params=3_000_000_000))  # weights fit, Adam state does not
    assert mux.admit(LLMJobSpec("pinned", SMALL.num_params(), nodes=("n1",))) == "g1"
    with pytest.raises(JobRefused, match="does not hold the job's state"):
        mux.admit(LLMJobSpec("nowhere", SMALL.num_params(), nodes=("n9",)))
    assert mux.admit(LLMJobSpec("free", SMALL.num_params())) == "g0"  # least loaded


# ---------------------------------------------------------------- the elastic pool on Ray (infra.llm.elastic)


def test_edf_queue_serves_the_earliest_deadline_first_and_ties_in_arrival_order() -> None:
    from infra.llm.elastic import EDFQueue

    q = EDFQueue()
    tickets = {name: q.push(deadline) for name, deadline in [("late", 9.0), ("soon", 1.0), ("mid", 4.0), ("soon2", 1.0)]}
    order = [q.pop() for _ in range(len(q))]
    assert order == [tickets["soon"], tickets["soon2"], tickets["mid"], tickets["late"]]
    assert q.head() is None


def test_router_chooses_on_the_slots_reports() -> None:
    from infra.llm.elastic import SlotReport, choose_home
    from infra.llm.router import EngineCost, PrefillDecodeAware, load_router

    router = PrefillDecodeAware(EngineCost())
    busy = SlotReport("s0", queue_depth=3, prefill_tokens=9000, kv_sequences=64, leased=True, resident="a")
    idle = SlotReport("s1", queue_depth=0, prefill_tokens=0, kv_sequences=0, leased=False, resident=None)
    assert choose_home(router, "a", 100, [busy, idle]) == 1  # the reported load outweighs the resident weights
    same = SlotReport("s1", queue_depth=0, prefill_tokens=0, kv_sequences=0, leased=True, resident="a")
    other = SlotReport("s0", queue_depth=0, prefill_tokens=0, kv_sequences=0, leased=True, resident="b")
    assert choose_home(router, "a", 100, [other, same]) == 1  # equal loads: where the job's weights are
    assert choose_home(load_router("least_loaded"), "b", 100, [busy, idle]) == 1


@pytest.fixture(scope="module")
def scheduler_client():
    import ray

    from infra.llm.sim.real_bench import start_cluster

    client = start_cluster(gpus=4)
    yield client
    ray.shutdown()


@pytest.mark.timeout(300)
def test_elastic_pool_jobs_match_alone_runs_never_overlap_and_return_every_lease(scheduler_client) -> None:
    from infra.llm.elastic import ElasticPool, PoolConfig
    from infra.llm.pool_shape import PoolShape
    from infra.llm.sim.real_bench import TINY, RealBenchConfig, held_gpu_seconds

    bench = RealBenchConfig(jobs=3, iterations=2)
    cfgs = [bench.job_config(f"j{i}", i) for i in range(3)]
    alone = {c.name: run_job(c.name, c, local_services(c)) for c in cfgs}
    since = scheduler_client.events(-1, 1)[-1].seq
    # Two rollout slots and one trainer slot for three jobs: slots are shared, GPUs leased per call.
    pool = ElasticPool(scheduler_client, TINY, PoolConfig(PoolShape(rollout_gpus=2, trainer_gpus=1, keep_alive_s=0.05)))
    results = {}

    def work(i: int) -> None:
        c = cfgs[i]
        results[c.name] = run_job(c.name, c, pool.job_services(c.name, pace_s=1.0))
        pool.finish(c.name)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    logs = pool.logs()
    pool.close()
    for name, res in alone.items():  # no two jobs' weights ever mix
        assert all(torch.equal(results[name].weights[k], v) for k, v in res.weights.items()), name
    per_slot: dict[str, list] = {}
    for r in logs["requests"]:
        per_slot.setdefault(r.slot, []).append(r)
    for rows in per_slot.values():  # one device call at a time on a slot, and within its lease
        assert _overlaps(rows) == []
    for slot in {s for s, _ in logs["slices"]}:
        assert _overlaps([r for s, r in logs["slices"] if s == slot]) == []
    held, leases = held_gpu_seconds(scheduler_client, pool.prefix, since)  # raises if a lease was not released
    assert leases == len(logs["leases"]) >= 3 and held > 0
    assert all(g == 1000 for n in scheduler_client.status().nodes for g in n.gpu_free)  # no GPU held after

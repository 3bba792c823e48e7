"""LLM services as Ray actors placed by the scheduler: multiplexed jobs, a killed rollout actor
is restarted and its in-flight work re-sent, a model larger than any GPU is refused."""

import dataclasses
import itertools

import pytest
import torch

from infra.llm.grpo_trainer import llm_grpo_config
from infra.llm.handles import JobServices
from infra.llm.model import ModelConfig
from infra.llm.multiplex import LLMJobSpec, Multiplexer
from infra.llm.rlvr import RLVRConfig, run_job
from infra.llm.router import EngineCost, PrefillDecodeAware
from infra.llm.service_plane import group_request, place_services
from infra.llm.verifiable_tasks import VOCAB_SIZE
from infra.scheduler import GPU, Cluster, Node, RequestError, Scheduler

SMALL = ModelConfig(kind="char", vocab_size=VOCAB_SIZE, max_len=16, d_model=32, n_heads=2, n_layers=1)


def _cfg(name: str, seed: int, iterations: int = 3) -> RLVRConfig:
    return RLVRConfig(name=name, task="sort", task_size=3, seed=seed, iterations=iterations, prompts_per_iter=4,
                      grpo=llm_grpo_config(group_size=4), warmup_steps=2, warmup_batch=8, eval_prompts=8, eval_every=100, model=SMALL,
                      checkpoint_every=0)  # "a" runs twice here; a checkpoint is never overwritten


def test_model_larger_than_any_gpu_is_refused_by_the_scheduler() -> None:
    cluster = Cluster((Node("n0", 8000, 65536, (GPU("H100", memory_mib=81920),) * 2),))
    sched = Scheduler(cluster, policy="bestfit")
    from infra.llm.service_plane import ServiceSizes

    with pytest.raises(RequestError, match="GPU memory"):
        sched.submit(group_request("huge", ServiceSizes(), gpu=True, weights_mib=140_000))  # 70B in bf16
    placed = sched.submit(group_request("ok", ServiceSizes(), gpu=True, weights_mib=14_000, rollout_instances=2))
    # Affinity: both rollout instances and the trainer of a group share one GPU of one node.
    assert len({(a.node, a.gpus) for a in placed.assignments}) == 1 and len(placed.assignments) == 3


@pytest.fixture(scope="module")
def plane():
    import ray

    from infra.ray_cluster.realize import node_labels
    from infra.service.client import connect

    node = Node("local", cpu_milli=4000, memory_mib=8192)
    ray.init(address="local", num_cpus=4, labels=node_labels(node), include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    p = place_services(connect(), SMALL, rollout_instances=2, router=PrefillDecodeAware(EngineCost()), chunk=4,
                       timeout_s=60, wait_s=60)
    yield p
    p.close()
    ray.shutdown()


@pytest.mark.timeout(240)
def test_killed_rollout_actor_is_restarted_and_the_job_result_is_unchanged(plane) -> None:
    import ray

    group = plane.groups[0]
    svc = JobServices(rollout=group.rollout, reward=plane.reward, trainer=group.trainer)
    reference = run_job("reference", _cfg("reference", 7, iterations=4), svc)

    pool = group.rollout
    victim = pool.instances[1]
    original_submit = victim.submit

    def submit_then_die(method, *args, **kwargs):
        # Fault injection: the first generation request of job "victim" to this instance meets a
        # dead actor (killed for real), so its answer never comes and it has to be re-sent.
        if method == "generate" and args[0] == "victim" and victim.restarts == 0:
            ray.kill(victim.actor, no_restart=True)
        return original_submit(method, *args, **kwargs)

    victim.submit = submit_then_die
    result = run_job("victim", _cfg("victim", 7, iterations=4), svc)
    assert pool.resent >= 1
    assert victim.restarts >= 1
    for k, v in reference.weights.items():
        assert torch.equal(result.weights[k], v), f"{k} differs after the rollout actor was killed and restarted"


@pytest.mark.timeout(240)
def test_jobs_multiplexed_on_ray_services_do_not_overlap_or_mix(plane) -> None:
    import ray

    group = plane.groups[0]
    mux = Multiplexer(plane.groups, plane.reward)
    cfgs = [_cfg("a", 1), _cfg("b", 2)]
    crashing = dataclasses.replace(_cfg("crash", 3), task_size=14)  # longer than the model's context: dies mid-run
    jobs = [(LLMJobSpec(c.name, SMALL.num_params()), c) for c in [*cfgs, crashing]]
    results = mux.run(jobs, timeout_s=180)
    assert isinstance(results["crash"], Exception)
    for c in cfgs:
        assert not isinstance(results[c.name], BaseException), results[c.name]
    alone = run_job("a-alone", _cfg("a", 1), JobServices(group.rollout, plane.reward, group.trainer))
    for k, v in alone.weights.items():
        assert torch.equal(results["a"].weights[k], v)
    trainer_slices = ray.get(group.trainer.actor.slices.remote(), timeout=30)
    s = sorted((x for x in trainer_slices if x.job in ("a", "b")), key=lambda x: x.start)
    assert all(b.start >= a.end for a, b in itertools.pairwise(s))
    assert {x.job for x in s} == {"a", "b"}


@pytest.mark.timeout(240)
def test_rlvr_script_path_on_ray_services(plane, tmp_path) -> None:
    from infra.llm.rlvr import run_rlvr

    cfg = dataclasses.replace(_cfg("on_ray", 4, iterations=2), ray=True, out_dir=str(tmp_path), threads=1)
    summary = run_rlvr(cfg)
    assert (tmp_path / "on_ray" / "metrics.csv").exists() and (tmp_path / "on_ray" / "model" / "model.safetensors").exists()
    assert 0.0 <= summary["mean_reward_last_iters"] <= 1.0

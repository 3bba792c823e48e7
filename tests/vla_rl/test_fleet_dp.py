"""``fleet.mode=data_parallel`` on a local Ray cluster with logical GPUs: two ranks with gloo on the CPU.

Each rank holds two Pendulum environments, a policy and its update; the ranks average gradients.
Ranks are killed and stopped for real (SIGKILL, SIGTERM). One Ray session serves the module; every
wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import pytest
import torch

from vla_rl.checkpoint import LATEST, load_checkpoint
from vla_rl.config import ConfigError, build_config

ray = pytest.importorskip("ray")

from vla_rl.fleet.data_parallel import DataParallelFleet, join_ranks, start_ranks, wait_all  # noqa: E402
from vla_rl.fleet.job import run_fleet_job, start_fleet, submit_job  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ITERATIONS = 5


def _config(tmp_path, name, **overrides):
    return build_config({
        "out_dir": str(tmp_path), "name": name, "seed": 3, "total_env_steps": ITERATIONS * 32, "checkpoint_every": 1,
        "env": {"kind": "gym", "task": "Pendulum-v1", "num_envs": 4, "max_episode_steps": 7},
        # The reward normaliser (per rank) and the KL early stop and adaptive rate (agreed by all) are exercised.
        "ppo": {"rollout_steps": 8, "normalize_reward": True,
                "optim": {"epochs": 2, "num_minibatches": 2, "target_kl": 0.01, "kl_adaptive_lr": True}},
        "policy": {"name": "mlp", "hidden_sizes": [16, 16]},
        "eval": {"every": 0},
        "log": {"wandb": "disabled", "progress": False, "video": False},
        "fleet": {"mode": "data_parallel", "num_gpus": 2, "max_restarts": 2},
        **overrides,
    })


@pytest.fixture(scope="module")
def ray_session():
    """One Ray node with 4 logical GPUs and this module's scheduler service."""
    from infra.ray_cluster.realize import node_args
    from infra.service.client import connect
    from vla_rl.fleet.job_gang import cluster_of
    from vla_rl.fleet.section import ClusterSpec

    cluster = cluster_of(ClusterSpec(gpus=4))
    ray.init(address="local", **node_args(cluster.nodes[0]), include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        yield connect()
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def uninterrupted(ray_session, tmp_path_factory):
    """The final checkpoint of a data-parallel run that nothing disturbed."""
    tmp_path = tmp_path_factory.mktemp("dp")
    summary = run_fleet_job(_config(tmp_path, "whole"))
    assert summary["iterations"] == ITERATIONS and summary["env_steps"] == ITERATIONS * 32
    return load_checkpoint(tmp_path / "whole" / "checkpoints" / LATEST)


def test_config_refuses_what_data_parallel_cannot_run(tmp_path):
    with pytest.raises(ConfigError, match=r"fleet\.num_gpus=3 must be >= 1 and divide env\.num_envs=4"):
        _config(tmp_path, "x", fleet={"mode": "data_parallel", "num_gpus": 3, "cluster": {"gpus": 4}})
    with pytest.raises(ConfigError, match="data_parallel trains PPO"):
        _config(tmp_path, "x", algo="grpo", env={"kind": "sims", "task": "reach", "num_envs": 4, "frames": None},
                grpo={"group_size": 2}, policy={"name": "mlp", "obs_keys": ["proprio", "state"]})
    with pytest.raises(ConfigError, match="every rank one whole GPU"):
        _config(tmp_path, "x", fleet={"mode": "data_parallel", "trainer": {"gpu": 0.5}})
    with pytest.raises(ConfigError, match=r"does not fit fleet\.cluster"):  # 4 ranks, 2 GPUs
        _config(tmp_path, "x", fleet={"mode": "data_parallel", "num_gpus": 4})


def test_ranks_are_one_gang_of_gpu_bundles_and_equal_after_every_update(ray_session, tmp_path):
    cfg = _config(tmp_path, "steps")
    gang, layout = submit_job(cfg)
    fleet = start_fleet(cfg, gang=gang, layout=layout)
    assert isinstance(fleet, DataParallelFleet)
    ranks = start_ranks(gang, fleet.backend, layout, cfg, attempt=0)
    try:
        # Placement through the scheduler service: one gang, one whole GPU per rank, each rank on its own GPU.
        assert [(b.gpus, b.gpu_fraction) for b in gang.request.bundles] == [(1, 0), (1, 0)]
        (mine,) = [g for g in ray_session.gangs() if g.name == gang.name]
        assert [(a.gpu_milli, len(a.gpus)) for a in mine.placement.assignments] == [(1000, 1), (1000, 1)]
        planned = {a.bundle: ",".join(map(str, a.gpus)) for a in mine.placement.assignments}
        seen = ray.get([rank.describe.remote() for rank in ranks])
        assert [d["gpus"] for d in seen] == [planned[layout.bundle("rank", r)] for r in range(2)]
        assert len({d["gpus"] for d in seen}) == 2, f"two ranks on one GPU: {seen}"

        join_ranks(ranks, resume=False)
        before = ray.get(ranks[0].weights.remote())
        for _ in range(3):
            metrics = wait_all([rank.step.remote() for rank in ranks])
            weights = wait_all([rank.weights.remote() for rank in ranks])
            for key, value in weights[0].items():
                assert torch.equal(weights[1][key], value), f"{key} differs between the ranks after an update"
            assert any(not torch.equal(before[k], v) for k, v in weights[0].items()), "the update changed nothing"
            before = weights[0]
            # Both ranks report the global step count, and the update's statistics are averaged over them.
            assert metrics[0]["env_steps"] == metrics[1]["env_steps"]
            assert metrics[0]["approx_kl"] == metrics[1]["approx_kl"]
        # ... while each rank learned from episodes of its own environments.
        assert metrics[0]["episode_return"] != metrics[1]["episode_return"]
    finally:
        for rank in ranks:
            with contextlib.suppress(Exception):
                ray.kill(rank)
        fleet.close()


def _assert_same_run(got, want):
    assert got["iteration"] == want["iteration"] == ITERATIONS
    for key, value in want["policy"].items():
        assert torch.equal(got["policy"][key], value), f"{key} differs from the uninterrupted run"
    for rank, (mine, theirs) in enumerate(zip(got["ranks"], want["ranks"], strict=True)):
        assert torch.equal(mine["rng"]["torch"], theirs["rng"]["torch"]), f"rank {rank}'s RNG differs"
        for key, value in theirs["episode_stats"].items():
            assert torch.equal(mine["episode_stats"][key], value), f"rank {rank}'s episode {key} differs"


def _on_rank_after(latest, eventually, processes, sig, done):
    """A thread that sends ``sig`` to one rank once a checkpoint of iteration >= 2 exists; appends True or the error."""

    def act():
        try:
            if eventually(lambda: latest.exists() and load_checkpoint(latest)["iteration"] >= 2, 180):
                pids = processes("ray::RankActor")
                assert len(pids) == 2, f"expected two rank processes, found {pids}"
                os.kill(max(pids), sig)
                done.append(True)
        except Exception as exc:  # reported by the test's assertion
            done.append(exc)

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


def test_a_stopped_run_resumes_exactly(ray_session, uninterrupted, tmp_path, eventually, processes):
    cfg = _config(tmp_path, "stopped")
    latest = tmp_path / "stopped" / "checkpoints" / LATEST
    stopped: list = []
    thread = _on_rank_after(latest, eventually, processes, signal.SIGTERM, stopped)
    first = run_fleet_job(cfg)
    thread.join(timeout=5)
    assert stopped == [True], f"no rank was stopped mid-run ({stopped}); the test proves nothing"
    assert first["stopped_by"] == "SIGTERM" and 2 <= first["iterations"] < ITERATIONS
    assert not (tmp_path / "stopped" / "summary.json").exists()

    run_fleet_job(cfg, resume=True)
    _assert_same_run(load_checkpoint(latest), uninterrupted)


def test_a_killed_rank_restarts_the_gang_from_its_checkpoint(ray_session, uninterrupted, tmp_path, capsys,
                                                              eventually, processes):
    cfg = _config(tmp_path, "killed")
    latest = tmp_path / "killed" / "checkpoints" / LATEST
    killed: list = []
    thread = _on_rank_after(latest, eventually, processes, signal.SIGKILL, killed)
    summary = run_fleet_job(cfg)
    thread.join(timeout=5)
    assert killed == [True], f"no rank was killed mid-run ({killed}); the test proves nothing"
    assert "a rank actor died" in capsys.readouterr().out
    assert summary["iterations"] == ITERATIONS
    _assert_same_run(load_checkpoint(latest), uninterrupted)

"""The fleet on a real (local, loopback) Ray cluster with logical GPUs: identical learning, modes, faults.

Components are killed for real with ``ray.kill``. One Ray session serves the whole module and is
always shut down; every wait is bounded.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

import policies
from vla_rl.checkpoint import LATEST, load_checkpoint
from vla_rl.config import build_config, load_config
from vla_rl.fleet.collector import FleetCollector
from vla_rl.fleet.job import run_fleet_job, start_fleet
from vla_rl.rollout import Timer
from vla_rl.trainer import Trainer

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path, name, total_steps=256, **fleet):
    return build_config(
        {
            "out_dir": str(tmp_path), "name": name, "seed": 3, "total_env_steps": total_steps, "checkpoint_every": 1,
            "env": {"kind": "gym", "task": "Pendulum-v1", "num_envs": 4, "max_episode_steps": 7},
            "ppo": {"rollout_steps": 8, "normalize_reward": True, "optim": {"epochs": 2, "num_minibatches": 2}},
            "policy": {"name": "mlp", "hidden_sizes": [16, 16]},
            "eval": {"every": 0},
            "log": {"wandb": "disabled", "progress": False, "video": False},
            "fleet": {"shards": 2, **fleet},
        }
    )


@pytest.fixture(scope="module")
def ray_session():
    """One Ray node with 4 logical GPUs; its scheduler service shares them among this module's fleets."""
    from infra.ray_cluster.realize import node_args
    from infra.service.client import connect
    from vla_rl.fleet.job_gang import cluster_of
    from vla_rl.fleet.section import ClusterSpec

    cluster = cluster_of(ClusterSpec(gpus=4))
    ray.init(address="local", **node_args(cluster.nodes[0]), include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        yield connect()
    finally:
        ray.shutdown()


def test_ray_job_learns_exactly_like_in_process_even_when_the_trainer_is_killed(ray_session, tmp_path, capsys, eventually,
                                                                                  processes):
    # run_fleet_job shares the service with this module's other fleets; none runs now.
    assert not ray_session.gangs()
    local = Trainer(_config(tmp_path, "local"))
    local.train()
    local.close()

    cfg = _config(tmp_path, "ray", mode="colocated")
    latest = tmp_path / "ray" / "checkpoints" / LATEST
    killed = []

    def kill_trainer_after_two_checkpoints():
        # SIGKILL, as the OOM killer would; found in the process table, so this thread makes no Ray call.
        try:
            if eventually(lambda: latest.exists() and load_checkpoint(latest)["iteration"] >= 2, 180):
                (trainer,) = processes("ray::TrainerActor")
                os.kill(trainer, signal.SIGKILL)
                killed.append(True)
        except Exception as exc:  # reported by the assertion below
            killed.append(exc)

    killer = threading.Thread(target=kill_trainer_after_two_checkpoints, daemon=True)
    killer.start()
    summary = run_fleet_job(cfg)
    killer.join(timeout=5)

    assert killed == [True], f"the trainer was not killed mid-run ({killed}); the test proves nothing"
    assert "trainer actor died" in capsys.readouterr().out
    assert summary["iterations"] == local.iteration == 8
    want = load_checkpoint(tmp_path / "local" / "checkpoints" / LATEST)["policy"]
    got = load_checkpoint(latest)["policy"]
    for key, value in want.items():
        assert torch.equal(got[key], value), f"{key} differs between in-process and Ray"


_STALE_ADDRESS_CHILD = """
import ray
from vla_rl.fleet.section import FleetConfig
from vla_rl.fleet.job import ray_cluster

with ray_cluster(FleetConfig()):
    print("nodes", len(ray.nodes()))
"""


def test_a_local_fleet_starts_its_own_cluster_where_a_stale_address_file_names_a_dead_one():
    # A `ray start` cluster that died leaves ray_current_cluster behind; a plain ray.init() would connect to it.
    temp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths live below it
    try:
        (temp / "ray").mkdir()
        (temp / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")
        env = {**os.environ, "RAY_TMPDIR": str(temp)}
        out = subprocess.run([sys.executable, "-c", _STALE_ADDRESS_CHILD], capture_output=True, text=True, cwd=ROOT,
                             env=env, timeout=180)
        assert out.returncode == 0 and "nodes 1" in out.stdout, out.stderr[-3000:]
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _vla_config(tmp_path, name):
    """The default VLA job (configs/default.yaml: sims reach, 64 px RGB, the VLA), small, co-located."""
    return load_config(ROOT / "configs" / "default.yaml", [
        "env.num_envs=8", "ppo.rollout_steps=16", "ppo.optim.epochs=2", f"total_env_steps={3 * 8 * 16}",
        "eval.every=0", "log.wandb=disabled", "log.progress=false", "log.video=false",
        "fleet.mode=colocated", "fleet.shards=2", f"out_dir={tmp_path}", f"name={name}",
    ])


def test_killed_vla_shard_is_rolled_back_so_batches_and_weights_are_unchanged(ray_session, tmp_path, eventually):
    cfg = _vla_config(tmp_path, "undisturbed")
    fleet = start_fleet(cfg, name="vla")
    try:
        runs = {}
        for name in ("undisturbed", "killed"):
            cfg = _vla_config(tmp_path, name)
            trainer = Trainer(cfg, collector=FleetCollector(cfg.fleet, fleet.workers, fleet.server, cfg.env.num_envs))
            batches = _record_batches(trainer.collector)
            rows = [trainer.step()]
            killer = _kill_mid_collection(eventually, fleet.server, fleet.workers[1], 4) if name == "killed" else None
            rows += [trainer.step(), trainer.step()]
            if killer is not None:
                killer.join(timeout=5)
            runs[name] = (batches, rows, trainer.policy.state_dict())
    finally:
        fleet.close()

    (want, _, want_weights), (got, rows, got_weights) = runs["undisturbed"], runs["killed"]
    # The shard died during the second collection (not between two): it was rolled back there.
    assert [row["fleet/shard_restarts"] for row in rows] == [0.0, 1.0, 1.0]
    assert want[0]["obs", "rgb"].shape == (16, 8, 1, 3, 64, 64)
    for reference, batch in zip(want, got, strict=True):
        for key, value in reference.exclude("version").items(include_nested=True, leaves_only=True):
            assert torch.equal(batch[key], value), f"re-collected {key} differs"
    unequal = [k for k, v in want_weights.items() if not torch.equal(got_weights[k], v)]
    assert not unequal, f"{len(unequal)} of {len(want_weights)} weight tensors differ after the fault: {unequal[:5]}"


@pytest.fixture(scope="module")
def colocated(ray_session, tmp_path_factory):
    cfg = _config(tmp_path_factory.mktemp("fleet"), "faults", mode="colocated")
    fleet = start_fleet(cfg, name="faults")
    try:
        collector = FleetCollector(cfg.fleet, fleet.workers, fleet.server, cfg.env.num_envs)
        obs = collector.reset(cfg.seed)
        torch.manual_seed(0)
        yield fleet, collector, policies.make_policy(cfg.policy, obs, 1), cfg
    finally:
        fleet.close()


def _kill_mid_collection(eventually, server, victim, batches):
    """A started thread that kills ``victim`` (restartably) once ``server`` answered ``batches`` more batches."""
    served = ray.get(server.status.remote())["batches"]

    def kill():
        if eventually(lambda: ray.get(server.status.remote())["batches"] >= served + batches):
            ray.kill(victim, no_restart=False)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_killed_shard_iteration_is_recollected_exactly(colocated, eventually):
    fleet, collector, policy, _ = colocated
    steps = 64
    state, rng = collector.get_state(), torch.get_rng_state()
    reference = collector.collect(policy, steps, Timer())
    after_reference = torch.get_rng_state()

    collector.set_state(state, reset_seed=0)
    torch.set_rng_state(rng)
    killer = _kill_mid_collection(eventually, fleet.server, fleet.workers[1], steps // 4)
    batch = collector.collect(policy, steps, Timer())
    killer.join(timeout=5)

    assert collector.metrics()["fleet/shard_restarts"] == 1
    assert ray.get(fleet.server.status.remote())["socket_clients"] == 2  # the restarted shard reconnected
    assert batch.batch_size == reference.batch_size == torch.Size([steps, 4])
    assert (batch["version"] == reference["version"] + 1).all()  # one push later, same experience:
    for key, value in reference.exclude("version").items(include_nested=True, leaves_only=True):
        assert torch.equal(batch[key], value), f"re-collected {key} differs"
    assert torch.equal(torch.get_rng_state(), after_reference)


def test_inference_server_restart_loses_no_requests(colocated, eventually):
    fleet, collector, policy, _ = colocated
    steps = 64
    state, rng = collector.get_state(), torch.get_rng_state()
    reference = collector.collect(policy, steps, Timer())

    collector.set_state(state, reset_seed=0)
    torch.set_rng_state(rng)
    killer = _kill_mid_collection(eventually, fleet.server, fleet.server, steps // 4)
    batch = collector.collect(policy, steps, Timer())
    killer.join(timeout=5)

    status = ray.get(fleet.server.status.remote())
    assert collector.metrics()["fleet/server_restarts"] == 1 and status["restarted"]
    assert status["socket_clients"] == 2, "the shards did not reconnect to the restarted server's socket"
    assert (batch["version"] == collector.version).all(), "a request was answered by stale weights"
    for key, value in reference.exclude("version").items(include_nested=True, leaves_only=True):
        assert torch.equal(batch[key], value), f"re-collected {key} differs"

    # A server that dies between collections gets the module again with the next weights.
    ray.kill(fleet.server, no_restart=False)
    batch = collector.collect(policy, 8, Timer())
    assert collector.metrics()["fleet/server_restarts"] == 2
    assert batch.batch_size == torch.Size([8, 4]) and (batch["version"] == collector.version).all()


def _collect_three(collector, policy):
    """Three collections; returns their staleness metric (and checks shapes and timings)."""
    staleness = []
    for _ in range(3):
        timer = Timer()
        batch = collector.collect(policy, 8, timer)
        staleness.append(collector.metrics()["fleet/staleness"])
        assert batch.batch_size == torch.Size([8, 4])
        assert timer.seconds["simulate"] > 0 and timer.seconds["infer"] > 0
    return staleness


def test_a_shard_killed_between_iterations_continues_from_where_it_stopped(colocated, eventually):
    fleet, collector, policy, _ = colocated
    state, rng = collector.get_state(), torch.get_rng_state()
    collector.collect(policy, 8, Timer())
    reference = collector.collect(policy, 8, Timer())

    collector.set_state(state, reset_seed=0)
    torch.set_rng_state(rng)
    collector.collect(policy, 8, Timer())
    restarts = collector.restarts["shard"]
    ray.kill(fleet.workers[0], no_restart=False)  # while the trainer would update: no rollout runs
    assert eventually(lambda: _answers(fleet.workers[0])), "the killed shard did not restart"
    batch = collector.collect(policy, 8, Timer())

    assert collector.restarts["shard"] == restarts + 1
    for key, value in reference.exclude("version").items(include_nested=True, leaves_only=True):
        assert torch.equal(batch[key], value), f"{key} differs after the shard's restart"


def _answers(worker):
    """Whether ``worker`` answers a call now (False while Ray restarts it)."""
    try:
        return ray.get(worker.ping.remote(), timeout=5) is not None
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False


def test_async_collection_runs_one_version_behind(colocated):
    fleet, _, policy, cfg = colocated
    fleet_cfg = copy.deepcopy(cfg.fleet)
    fleet_cfg.sync.mode = "async"  # the fixture's fleet, a collector in asynchronous mode
    collector = FleetCollector(fleet_cfg, fleet.workers, fleet.server, cfg.env.num_envs)
    collector.reset(cfg.seed)
    assert _collect_three(collector, policy) == [0.0, 1.0, 1.0]
    collector.reset(cfg.seed)  # ends the rollout queued in the background, leaving the shards idle


SLOW_UPDATE_S = 0.6
"""Seconds added to every update: several 8-step Pendulum rollouts fit in it (each takes ~0.05 s)."""


@pytest.mark.parametrize("bound", [1, 3])
def test_async_staleness_stays_within_max_staleness_under_a_slow_trainer(colocated, tmp_path, monkeypatch, bound):
    fleet, _, _, base = colocated
    cfg = copy.deepcopy(base)
    cfg.out_dir, cfg.total_env_steps = str(tmp_path), 6 * 32  # six iterations of 4 envs x 8 steps
    cfg.fleet.sync.mode, cfg.fleet.sync.max_staleness = "async", bound
    trainer = Trainer(cfg, collector=FleetCollector(cfg.fleet, fleet.workers, fleet.server, cfg.env.num_envs))
    update = trainer.algorithm.updater.update

    def slow_update(batch, **kwargs):
        time.sleep(SLOW_UPDATE_S)  # a slow trainer: the shards run ahead, up to the bound
        return update(batch, **kwargs)

    monkeypatch.setattr(trainer.algorithm.updater, "update", slow_update)
    trainer.train()  # checkpoints every iteration, with rollouts queued
    staleness = [(row["fleet/staleness"], row["fleet/staleness_max"]) for row in trainer.log.rows]
    trainer.collector.reset(cfg.seed)  # ends the rollouts still queued
    assert len(staleness) == 6 and staleness[0] == (0.0, 0.0)
    if bound == 1:
        assert staleness[1:] == [(1.0, 1.0)] * 5
    else:
        assert 1 < max(s for _, s in staleness) <= bound, staleness
        assert all(mean <= worst <= bound for mean, worst in staleness), staleness

    # A resumed run starts from the environments after the last batch trained on and collects the
    # batches that were queued at the checkpoint again, with its own weights.
    saved = load_checkpoint(tmp_path / cfg.run_name / "checkpoints" / LATEST)["collector"]["shards"]
    cfg.total_env_steps = 8 * 32
    resumed = Trainer(cfg, resume=True, collector=FleetCollector(cfg.fleet, fleet.workers, fleet.server, 4))
    batches = _record_batches(resumed.collector)
    resumed.train()
    resumed.collector.reset(cfg.seed)
    assert resumed.log.rows[6]["fleet/staleness"] == 0.0
    first_obs = torch.cat([stage["state"] for shard in saved for stage in shard["obs"]])
    assert torch.equal(batches[0]["obs", "state"][0], first_obs)


def _record_batches(collector):
    """Make ``collector.collect`` keep a copy of every batch it returns; returns the list of copies."""
    batches, collect = [], collector.collect

    def recording(policy, steps, timer):
        batch = collect(policy, steps, timer)
        batches.append(batch.clone())
        return batch

    collector.collect = recording
    return batches


@pytest.mark.parametrize(("mode", "transport"), [("disaggregated", "ray"), ("pipelined", "socket")])
def test_modes_collect_complete_versioned_batches(ray_session, tmp_path, mode, transport):
    cfg = _config(tmp_path, mode, mode=mode, server={"timeout_ms": 5.0, "transport": transport})
    fleet = start_fleet(cfg, name=mode)
    try:
        collector = FleetCollector(cfg.fleet, fleet.workers, fleet.server, cfg.env.num_envs)
        policy = policies.make_policy(cfg.policy, collector.reset(cfg.seed), 1)
        assert _collect_three(collector, policy) == [0.0, 0.0, 0.0]
        assert ray.get(fleet.server.status.remote())["socket_clients"] == (2 if transport == "socket" else 0)
    finally:
        fleet.close()


def test_shards_use_the_socket_only_on_the_servers_node(ray_session):
    import socket

    from vla_rl.fleet.channel import RayLink, SocketLink, connect

    class Server:  # defined here so that Ray ships the class itself to its worker
        """A server that reports where its socket is."""

        def __init__(self, node, path):
            self.node, self.path = node, path

        def socket_address(self):
            return self.node, self.path

    here = ray.get_runtime_context().get_node_id()
    folder = tempfile.mkdtemp(dir="/tmp")  # short: Unix socket paths are limited to ~108 bytes
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, "s.sock"))
    listener.listen(1)
    local = ray.remote(Server).remote(here, os.path.join(folder, "s.sock"))
    elsewhere = ray.remote(Server).remote("another-node", "/nonexistent.sock")
    try:
        link = connect(local, "socket")
        assert isinstance(link, SocketLink)  # same node: the socket
        link.client.sock.close()
        assert isinstance(connect(elsewhere, "socket"), RayLink)  # never a socket on another node
        assert isinstance(connect(local, "ray"), RayLink)  # transport=ray: Ray calls even on the same node
    finally:
        ray.kill(local)
        ray.kill(elsewhere)
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


def _grpo_config(tmp_path, name, **top):
    """GRPO on sims reach with state observations: 2 shards of 2 groups of 2 environments, co-located."""
    return build_config({
        "out_dir": str(tmp_path), "name": name, "seed": 5, "algo": "grpo", "checkpoint_every": 1,
        "env": {"kind": "sims", "task": "reach", "num_envs": 8, "frames": None},
        "grpo": {"group_size": 2, "optim": {"epochs": 1, "num_minibatches": 2}},
        "policy": {"name": "mlp", "hidden_sizes": [16, 16]},
        "eval": {"every": 0}, "log": {"wandb": "disabled", "progress": False, "video": False},
        "fleet": {"mode": "colocated", "shards": 2}, **top,
    })


def test_grpo_on_the_fleet_collects_the_in_process_episodes_even_when_a_shard_is_killed(ray_session, tmp_path, eventually):
    from vla_rl.envs import make_env
    from vla_rl.rollout import collect_episodes

    cfg = _grpo_config(tmp_path, "grpo-fleet")
    fleet = start_fleet(cfg, name="grpo-fleet")
    try:
        collector = FleetCollector(cfg.fleet, fleet.workers, fleet.server, cfg.env.num_envs)
        obs = collector.reset(cfg.seed)
        torch.manual_seed(0)
        policy = policies.make_policy(cfg.policy, obs, 4)
        rng, state = torch.get_rng_state(), collector.get_state()
        env = make_env(cfg.env, seed=cfg.seed, group_size=2)
        limit = collector.max_episode_steps
        want, want_return, want_success = collect_episodes(env, policy, cfg.seed, limit, Timer(), torch.device("cpu"))
        env.close()

        torch.set_rng_state(rng)
        got, got_return, got_success = collector.collect_episodes(policy, cfg.seed, limit, Timer())
        torch.set_rng_state(rng)
        collector.set_state(state, reset_seed=0)
        killer = _kill_mid_collection(eventually, fleet.server, fleet.workers[0], limit // 3)
        again, again_return, _ = collector.collect_episodes(policy, cfg.seed, limit, Timer())
        killer.join(timeout=5)
    finally:
        fleet.close()

    # The fleet runs every shard to the episode limit; in process the loop stops once every episode ended.
    t = want.batch_size[0]
    assert got.batch_size == torch.Size([limit, 8]) and t <= limit
    assert not got["alive"][t:].any()
    for key in ("action", "log_prob", "alive", "reward", "success"):
        assert torch.equal(got[key][:t], want[key]), f"fleet GRPO {key} differs from in process"
    assert torch.equal(got["obs"][:t]["state"], want["obs"]["state"])
    assert torch.equal(got_return, want_return) and torch.equal(got_success, want_success)
    # Groups are groups across shards: both members of each pair started from the same state.
    assert torch.equal(got["obs"][0]["state"][0::2], got["obs"][0]["state"][1::2])
    assert collector.metrics()["fleet/shard_restarts"] == 1
    assert torch.equal(again_return, got_return)
    for key in ("action", "log_prob", "alive", "reward"):
        assert torch.equal(again[key], got[key]), f"re-collected {key} differs"


def test_rl_from_a_checkpoint_runs_grpo_on_the_fleet(ray_session, tmp_path):
    start = _grpo_config(tmp_path, "start", total_env_steps=1, fleet={"mode": "inprocess"})
    Trainer(start).train()
    cfg = _grpo_config(tmp_path, "from-start", total_env_steps=2 * 8 * 50,
                       init_from=str(tmp_path / "start" / "checkpoints" / LATEST))
    summary = run_fleet_job(cfg)
    assert summary["iterations"] >= 2
    rows = (tmp_path / "from-start" / "metrics.csv").read_text().splitlines()
    assert len(rows) - 1 >= 2 and "fleet/version" in rows[0]

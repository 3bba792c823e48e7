"""Fleet pieces without Ray: config validation, gang translation, the batching server, the shard's rollout."""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from types import SimpleNamespace

import pytest
import torch

import policies
from infra.scheduler import PinGPUs, SameGPU, SameNode, Scheduler
from vla_rl.config import ConfigError, build_config
from vla_rl.envs import make_env
from vla_rl.fleet.channel import SocketLink, SocketServer
from vla_rl.fleet.inference import InferenceCore, RequestsCancelled
from vla_rl.fleet.job_gang import PlacementError, job_request, place_job
from vla_rl.fleet.section import resolved_placement
from vla_rl.fleet.wire import Request, from_wire, to_wire
from vla_rl.fleet.worker import RolloutWorker
from vla_rl.rollout import Timer, collect_steps


def _config(**fleet):
    return build_config(
        {
            "seed": 5,
            "env": {"kind": "gym", "task": "Pendulum-v1", "num_envs": 4, "max_episode_steps": 7},
            "policy": {"name": "mlp", "hidden_sizes": [16, 16]},
            "fleet": fleet,
            "log": {"wandb": "disabled", "progress": False, "video": False},
        }
    )


# ---------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("fleet", "extra", "message"),
    [
        ({"mode": "colocated", "shards": 3}, {}, "divide env.num_envs=4"),
        ({"mode": "pipelined", "shards": 2, "stages": 3}, {}, "fleet.stages=3"),
        ({"mode": "colocated", "offload": True, "shards": 2, "trainer": {"gpu": 1.5}}, {}, "whole GPUs"),
        ({"mode": "disaggregated", "offload": True}, {}, "offload=true applies to fleet.mode=colocated"),
        ({"mode": "colocated", "shard": {"node": "node7"}}, {}, "node='node7' is not in fleet.cluster"),
        ({"mode": "colocated", "shard": {"gpu_ids": [0]}}, {}, "needs fleet.shard.node"),
        ({"mode": "colocated", "inference": {"node": "node0", "gpu_ids": [5]}}, {}, "node 'node0' has GPUs 0..1"),
        ({"mode": "disaggregated", "trainer": {"gpu": 0.5}}, {}, "disaggregated mode gives the trainer whole GPUs"),
        ({"mode": "colocated", "server": {"timeout_ms": 0}}, {}, "timeout_ms=0"),
        ({"mode": "ring"}, {}, "fleet.mode='ring' is not a valid choice"),
        ({"mode": "colocated", "policy": "tetris"}, {}, "fleet.policy='tetris' is not a placement policy"),
        ({"mode": "colocated"}, {"algo": "distill", "distill": {"teacher": "runs/teacher"}}, "runs PPO and GRPO"),
        ({"mode": "pipelined", "shards": 1, "stages": 2}, {"algo": "grpo"}, "synchronously in one stage"),
        ({"mode": "colocated", "sync": {"mode": "async"}}, {"algo": "grpo"}, "synchronously in one stage"),
        ({"mode": "colocated", "shards": 2}, {"algo": "grpo", "grpo": {"group_size": 4}},
         "must divide a shard's 2 environments"),
        ({"mode": "colocated"}, {"env": {"kind": "sims", "task": "reach", "num_envs": 4, "backend": "warp",
                                         "warp_device": "cuda:0"}}, "train in one process to keep the data on the GPU"),
        ({"mode": "pipelined", "shards": 1, "stages": 2}, {"env": {"kind": "sims", "task": "reach", "num_envs": 4,
                                                                   "backend": "warp"}}, "env.warp_device=auto"),
    ],
)
def test_invalid_fleet_sections_name_the_fix(fleet, extra, message):
    data = {
        "env": {"kind": "sims", "task": "reach", "num_envs": 4},
        "policy": {"name": "mlp"},
        "grpo": {"group_size": 2},
        "fleet": fleet,
        **extra,
    }
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config(data)


def test_mode_defaults_are_derived_without_editing_the_config():
    cfg = _config(mode="disaggregated", shards=2)
    comps = resolved_placement(cfg.fleet)
    assert cfg.fleet.shard.gpu is None  # the user's section is untouched
    assert comps["trainer"].gpu == 1.0 and comps["shard"].gpu == pytest.approx(0.25)
    assert sum(comps[c].gpu for c in ("inference",)) + 2 * comps["shard"].gpu <= 1.0


# ---------------------------------------------------------------------------------------- placement


def test_colocated_job_shares_one_gpu():
    cfg = _config(mode="colocated", shards=2)
    _, placement, layout = place_job(cfg.fleet, "job")
    gpus = {(a.node, a.gpus) for a in placement.assignments}
    assert len(gpus) == 1, f"colocated components spread over {gpus}"
    assert any(isinstance(c, SameGPU) and len(c.bundles) == 4 for c in layout.gang.constraints)
    assert [layout.roles[a.bundle][0] for a in placement.assignments] == ["shard", "shard", "inference", "trainer"]


def test_disaggregated_trainer_gets_its_own_gpu():
    cfg = _config(mode="disaggregated", shards=2)
    _, placement, layout = place_job(cfg.fleet, "job")
    by_role = {layout.roles[a.bundle]: a for a in placement.assignments}
    trainer, server = by_role[("trainer", 0)], by_role[("inference", 0)]
    assert trainer.gpu_milli == 1000 and trainer.gpus != server.gpus
    assert by_role[("shard", 0)].gpus == by_role[("shard", 1)].gpus == server.gpus


def test_pins_and_multi_node_clusters():
    cfg = _config(
        mode="colocated", shards=2, cluster={"nodes": 2, "gpus": 2},
        shard={"node": "node1", "gpu_ids": [1]},
    )
    layout = job_request(cfg.fleet, "job")
    assert PinGPUs(0, "node1", (1,)) in layout.gang.constraints
    assert any(isinstance(c, SameNode) for c in layout.gang.constraints)
    _, placement, _ = place_job(cfg.fleet, "job")
    assert {(a.node, a.gpus) for a in placement.assignments} == {("node1", (1,))}


def test_a_job_that_does_not_fit_fails_at_config_time():
    with pytest.raises(PlacementError, match=r"does not fit fleet\.cluster \(1 node\(s\) x 1 GPU\(s\), 8 CPUs\) in total"):
        _config(mode="disaggregated", shards=2, cluster={"gpus": 1})
    with pytest.raises(PlacementError, match="shard0, shard1, inference, trainer share one node and need cpu_milli=10000"):
        _config(mode="colocated", shards=2, shard={"cpus": 4}, cluster={"nodes": 2})  # 8 CPUs a node
    with pytest.raises(PlacementError, match=r"needs 3 GPU.s. of any model .* on one node"):
        _config(mode="disaggregated", trainer={"gpu": 3})
    with pytest.raises(PlacementError, match="inprocess places nothing"):
        job_request(_config().fleet, "job")


def test_validation_places_nothing(monkeypatch):
    def placed(*_args, **_kwargs):
        raise AssertionError("the config's validation ran the scheduler's placement")

    monkeypatch.setattr(Scheduler, "submit", placed)
    for mode in ("colocated", "disaggregated", "pipelined"):
        assert _config(mode=mode, shards=2).fleet.mode == mode
    assert _config(mode="data_parallel", num_gpus=2).fleet.num_gpus == 2


def test_a_job_that_packs_onto_no_node_fails_when_it_starts_before_ray(tmp_path, monkeypatch):
    """Every rank fits a node and the cluster's totals suffice, but two ranks never share a 5-CPU node: only placing
    finds that, at job start, and before Ray starts or the run directory exists."""
    cfg = build_config({
        "out_dir": str(tmp_path), "name": "packs",
        "env": {"kind": "gym", "task": "Pendulum-v1", "num_envs": 6, "max_episode_steps": 7},
        "policy": {"name": "mlp", "hidden_sizes": [16, 16]},
        "fleet": {"mode": "data_parallel", "num_gpus": 3, "trainer": {"cpus": 3},
                  "cluster": {"nodes": 2, "gpus": 2, "cpus": 5}},
    })
    from vla_rl.fleet import job

    monkeypatch.setattr(job, "ray_cluster", lambda _fleet: pytest.fail("Ray started before the job was placed"))
    with pytest.raises(PlacementError, match=r"does not fit fleet\.cluster \(2 node\(s\) x 2 GPU\(s\), 5 CPUs\) with its"):
        job.run_fleet_job(cfg)
    assert not (tmp_path / "packs").exists()


# ---------------------------------------------------------------------------------------- server


def _policy(cfg, obs):
    torch.manual_seed(0)
    return policies.make_policy(cfg.policy, obs, 1)


def _obs(n, start=0.0):
    from tensordict import TensorDict

    state = torch.arange(start, start + 3 * n, dtype=torch.float32).reshape(n, 3) / 10
    return TensorDict({"state": state, "task": torch.zeros(n, dtype=torch.int64),
                       "instruction": torch.zeros(n, dtype=torch.int64)}, batch_size=[n])


def test_server_batches_in_key_order_with_the_trainers_randomness():
    cfg = _config()
    policy = _policy(cfg, _obs(2))
    parts = {(2, 0): _obs(3, 100.0), (1, 0): _obs(2, 50.0), (0, 0): _obs(2)}
    rng = torch.get_rng_state()

    async def serve():
        core = InferenceCore(None, max_batch=7, timeout_s=None)
        tasks = [asyncio.ensure_future(core.infer(Request(k, to_wire(o), min_version=3))) for k, o in parts.items()]
        await asyncio.sleep(0)
        assert not any(t.done() for t in tasks)  # no weights yet: everything waits
        core.set_weights(policy.state_dict(), 3, rng_state=rng, module=copy.deepcopy(policy))
        replies = await asyncio.gather(*tasks)
        return core, dict(zip(parts, replies))

    core, replies = asyncio.run(serve())
    assert core.pop_counters()["batches"] == 1
    torch.set_rng_state(rng)
    with torch.no_grad():
        expected = policy.act(torch.cat([parts[(0, 0)], parts[(1, 0)], parts[(2, 0)]]))
    got = torch.cat([torch.from_numpy(replies[k].action) for k in [(0, 0), (1, 0), (2, 0)]])
    assert torch.equal(got, expected["action"])
    assert {r.version for r in replies.values()} == {3}


def test_server_batches_one_pipeline_stage_at_a_time():
    cfg = _config()
    policy = _policy(cfg, _obs(2))

    async def serve():
        core = InferenceCore(copy.deepcopy(policy), max_batch=4, timeout_s=None)
        core.set_weights(policy.state_dict(), 1)
        # Shard 0 sends both stages before shard 1 sends any: a stage-blind server would batch shard 0 alone.
        tasks, done_after = {}, []
        for key in [(0, 0), (0, 1), (1, 0), (1, 1)]:
            tasks[key] = asyncio.ensure_future(core.infer(Request(key, to_wire(_obs(2)))))
            for _ in range(3):
                await asyncio.sleep(0)
            done_after.append(sorted(k for k, t in tasks.items() if t.done()))
        await asyncio.gather(*tasks.values())
        return core.pop_counters(), done_after

    counters, done_after = asyncio.run(serve())
    assert done_after == [[], [], [(0, 0), (1, 0)], [(0, 0), (0, 1), (1, 0), (1, 1)]]
    assert counters["batches"] == 2 and counters["envs"] == 8


def test_server_timeout_serves_partial_batches_and_cancel_fails_waiters():
    cfg = _config()
    policy = _policy(cfg, _obs(2))

    async def serve():
        core = InferenceCore(copy.deepcopy(policy), max_batch=100, timeout_s=0.01)
        core.set_weights(policy.state_dict(), 1)
        reply = await asyncio.wait_for(core.infer(Request((0, 0), to_wire(_obs(2)), to_wire(_obs(1)), value_only=True)), 5)
        waiting = asyncio.ensure_future(core.infer(Request((0, 0), to_wire(_obs(2)), min_version=9)))
        await asyncio.sleep(0.05)
        assert core.cancel_pending() == 1
        with pytest.raises(RequestsCancelled):
            await waiting
        with pytest.raises(ValueError, match="older than the held"):
            core.set_weights(policy.state_dict(), 0)
        return reply

    reply = asyncio.run(serve())
    assert reply.action is None and reply.value.shape == (2,) and reply.bootstrap_value.shape == (1,)
    with torch.no_grad():
        assert torch.equal(torch.from_numpy(reply.value), policy.value(_obs(2)))


class _LoopThread:
    """An asyncio loop in a thread, as a Ray asyncio actor runs one."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn):
        async def wrapped():
            return fn()

        return self.run(wrapped())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def test_socket_channel_batches_shards_and_relays_failures(eventually):
    cfg = _config()
    policy = _policy(cfg, _obs(2))
    loop = _LoopThread()
    core = InferenceCore(copy.deepcopy(policy), max_batch=4, timeout_s=None)
    server = SocketServer(core.infer)
    path = loop.run(server.start())
    links = [SocketLink(None, path), SocketLink(None, path)]
    try:
        rng = torch.get_rng_state()
        loop.call(lambda: core.set_weights(policy.state_dict(), 1, rng_state=rng))
        # Shard 1 asks first; the batch is still ordered by shard, as in process.
        tickets = [links[1].ask(Request((1, 0), to_wire(_obs(2, 50.0)))), links[0].ask(Request((0, 0), to_wire(_obs(2))))]
        replies = [links[1].wait(tickets[0]), links[0].wait(tickets[1])]
        torch.set_rng_state(rng)
        with torch.no_grad():
            expected = policy.act(torch.cat([_obs(2), _obs(2, 50.0)]))
        got = torch.cat([torch.from_numpy(replies[1].action), torch.from_numpy(replies[0].action)])
        assert torch.equal(got, expected["action"]) and {r.version for r in replies} == {1}
        assert loop.call(lambda: server.clients) == 2

        # A request the server fails raises in the shard, as a failed Ray call does.
        waiting = links[0].ask(Request((0, 0), to_wire(_obs(2)), min_version=5))
        assert eventually(lambda: loop.call(lambda: core.num_pending) == 1)
        assert loop.call(core.cancel_pending) == 1
        with pytest.raises(RequestsCancelled):
            links[0].wait(waiting)

        # The reply to a request forgotten by an aborted rollout is dropped; the next request gets its own.
        links[0].ask(Request((0, 0), to_wire(_obs(2)), value_only=True))
        assert links[1].wait(links[1].ask(Request((1, 0), to_wire(_obs(2)), value_only=True))).action is None
        links[0].forget()
        tickets = [links[0].ask(Request((0, 0), to_wire(_obs(2)))), links[1].ask(Request((1, 0), to_wire(_obs(2))))]
        assert links[0].wait(tickets[0]).action.shape == (2, 1)
        assert links[1].wait(tickets[1]).action.shape == (2, 1)
        assert links[0].held == links[1].held == 0
    finally:
        for link in links:
            link.close()
        assert eventually(lambda: loop.call(lambda: server.clients) == 0)
        loop.call(server.close)
        assert not os.path.exists(path)
        loop.stop()


def test_a_restarted_server_removes_the_socket_files_of_its_predecessors():
    core = InferenceCore(None, max_batch=1, timeout_s=None)
    loop = _LoopThread()
    try:
        killed = loop.run(SocketServer(core.infer, owner="actor42").start())  # never closed, as a killed one
        other = SocketServer(core.infer, owner="actor43")
        other_path = loop.run(other.start())
        restarted = SocketServer(core.infer, owner="actor42")

        async def two_shards_ask_at_once():  # the second must not remove the socket the first opens
            return await asyncio.gather(restarted.start(), restarted.start())

        path, same = loop.run(two_shards_ask_at_once())
        assert path == same
        assert not os.path.exists(killed) and os.path.exists(path) and os.path.exists(other_path)
        loop.call(restarted.close)
        loop.call(other.close)
        assert not os.path.exists(path) and not os.path.exists(other_path)
    finally:
        loop.stop()


# ---------------------------------------------------------------------------------------- shard


class _LocalServer:
    """``infer.remote(request)`` answered at once by an :class:`InferenceCore` (one request per batch)."""

    def __init__(self, core: InferenceCore) -> None:
        self.infer = SimpleNamespace(remote=lambda request: asyncio.run(core.infer(request)))


@pytest.mark.parametrize("stages", [1, 2])
def test_shard_rollout_equals_the_in_process_collection(stages):
    cfg = _config()
    env = make_env(cfg.env, seed=cfg.seed)
    obs = env.reset_td(seed=cfg.seed)
    policy = _policy(cfg, obs)
    torch.manual_seed(11)
    rng = torch.get_rng_state()
    expected, _ = collect_steps(env, policy, obs, 16, Timer(), torch.device("cpu"))

    core = InferenceCore(copy.deepcopy(policy), max_batch=4 // stages, timeout_s=None)
    core.set_weights(policy.state_dict(), 2, rng_state=rng)
    worker = RolloutWorker(cfg.env, 0, 0, 4, stages, cfg.seed, _LocalServer(core))
    worker.reset(cfg.seed)
    wire, seconds, _ = worker.rollout(16, min_version=2)
    batch = from_wire(wire, batch_dims=2)
    assert expected["truncated"].any(), "the test should cover bootstrapping at truncation"
    for key, value in expected.items(include_nested=True, leaves_only=True):
        if stages == 1:  # one forward pass over all envs: the in-process computation exactly
            assert torch.equal(batch[key], value), key
        else:  # stage-sized forward passes round differently; same samples (the RNG stream is the same)
            torch.testing.assert_close(batch[key], value, rtol=0, atol=1e-6, msg=str(key))
    assert torch.equal(batch["version"], torch.full((16, 4), 2))
    assert seconds["simulate"] > 0 and "wait" in seconds


def test_a_new_sims_shard_continues_from_the_state_a_rollout_ended_in():
    """What the collector does for a shard Ray restarted: the state returned by one rollout, set into a
    fresh shard, gives the rollout the old shard would have run next, camera frames included."""
    cfg = build_config(
        {
            "seed": 2,
            "env": {"kind": "sims", "task": "reach", "num_envs": 4, "frames": {"width": 32, "height": 32}},
            "policy": {"name": "mlp", "hidden_sizes": [16]},
            "log": {"wandb": "disabled", "progress": False, "video": False},
        }
    )
    env = make_env(cfg.env, seed=cfg.seed)
    policy = policies.make_policy(cfg.policy, env.reset_td(seed=cfg.seed), 4)
    env.close()
    core = InferenceCore(policy, max_batch=2, timeout_s=None)
    core.set_weights(policy.state_dict(), 1)
    old, new = (RolloutWorker(cfg.env, 1, 2, 2, 1, cfg.seed, _LocalServer(core)) for _ in range(2))
    old.reset(cfg.seed)
    _, _, state = old.rollout(12, min_version=1)
    rng = torch.get_rng_state()
    expected = from_wire(old.rollout(12, min_version=1)[0], batch_dims=2)
    new.set_state(state, reset_seed=99)
    torch.set_rng_state(rng)
    batch = from_wire(new.rollout(12, min_version=1)[0], batch_dims=2)
    assert expected["obs", "rgb"].dtype == torch.uint8 and expected["obs", "rgb"].float().std() > 0
    for key, value in expected.items(include_nested=True, leaves_only=True):
        assert torch.equal(batch[key], value), key
    for worker in (old, new):
        worker.close()


def test_split_shards_see_the_episodes_of_one_env():
    cfg = _config()
    whole = make_env(cfg.env, seed=cfg.seed).reset_td(seed=cfg.seed)
    parts = [make_env(cfg.env, seed=cfg.seed, num_envs=2, env_offset=o).reset_td(seed=cfg.seed) for o in (0, 2)]
    assert torch.equal(torch.cat(parts)["state"], whole["state"])

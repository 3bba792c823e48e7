"""PPO on a device-resident env with ``terminate_on_success``: episodes ended at success restart when the loop
asks (sims' deferred_restarts), a few times per rollout; the steps between an end and its restart belong to no
episode and are left out of the update, the statistics and the reward scaling. Run on Warp's CPU device, where
the device code path runs with CPU tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco_warp")

from vla_rl.config import build_config
from vla_rl.rollout import END_CHECKS
from vla_rl.trainer import Trainer

NUM_ENVS = 8
STEPS = 24
CHECK_EVERY = -(-STEPS // END_CHECKS)


def _trainer(tmp_path, backend: str) -> Trainer:
    return Trainer(build_config({
        "out_dir": str(tmp_path), "name": backend, "algo": "ppo", "seed": 3, "device": "cpu", "total_env_steps": 10**9,
        "env": {"kind": "sims", "task": "reach", "num_envs": NUM_ENVS, "frames": None, "backend": backend,
                "warp_device": "cpu", "terminate_on_success": True},
        "ppo": {"rollout_steps": STEPS, "optim": {"epochs": 1, "num_minibatches": 2}},
        "policy": {"name": "mlp", "hidden_sizes": [16], "obs_keys": ["proprio", "state"]},
        "eval": {"every": 0}, "log": {"wandb": "disabled", "progress": False, "video": False},
    }))


def _recorded(trainer: Trainer, iterations: int) -> tuple[list, list, float]:
    """Each iteration's collected batch and experience, and the episodes the statistics counted."""
    batches, experiences, episodes = [], [], 0.0
    collect, algo_collect = trainer.collector.collect, trainer.algorithm.collect

    def recording_collect(*args, **kwargs):
        batches.append(collect(*args, **kwargs))
        return batches[-1]

    def recording_experience(*args, **kwargs):
        experiences.append(algo_collect(*args, **kwargs))
        return experiences[-1]

    trainer.collector.collect = recording_collect
    trainer.algorithm.collect = recording_experience
    for _ in range(iterations):
        episodes += trainer.step().get("episodes", 0.0)
    return batches, experiences, episodes


def test_ended_episodes_wait_for_the_loop_and_their_steps_are_left_out(tmp_path, scripted_reach):
    trainer = _trainer(tmp_path, "warp")
    scripted = torch.arange(NUM_ENVS) < NUM_ENVS // 2  # these succeed within a few steps, again and again
    scripted_reach(trainer, scripted)
    env = trainer.collector.env
    episodes_before = env._episode.copy()
    batches, experiences, episodes = _recorded(trainer, 3)
    requested_at_end = env.get_state()["restart_requested"]
    trainer.close()
    waits, done_steps = [], 0
    for batch in batches:
        valid, terminated, done = (batch[k].numpy() for k in ("valid", "terminated", "done"))
        for i in np.flatnonzero(scripted.numpy()):
            t = 0
            while t < STEPS:
                if valid[t, i]:
                    t += 1
                    continue
                # A wait starts after a step that ended its episode at success (or carries over from the last rollout).
                assert t == 0 or (valid[t - 1, i] and terminated[t - 1, i]), (t, i)
                start = t
                while t < STEPS and not valid[t, i]:
                    t += 1
                if start > 0 and t < STEPS:
                    waits.append(t - start)
        done_steps += int((done & valid).sum())
    assert waits and max(waits) <= CHECK_EVERY + 1 and min(waits) >= 1, waits
    # The update and the episode statistics see the steps of episodes alone.
    for batch, experience in zip(batches, experiences):
        assert experience.batch.batch_size[0] == int(batch["valid"].sum()) < batch.numel()
    assert episodes == done_steps
    # Every episode that ended was restarted (one new episode each), or is waiting for the restart requested
    # at the end of the last rollout: none is lost and none is sampled twice.
    restarts = int((env._episode - episodes_before).sum())
    assert restarts + int(requested_at_end.sum()) == done_steps


def test_requested_restarts_survive_a_snapshot(tmp_path, scripted_reach):
    trainer = _trainer(tmp_path, "warp")
    scripted_reach(trainer, torch.ones(NUM_ENVS, dtype=torch.bool))
    trainer.step()
    env = trainer.collector.env
    state = env.get_state()
    pending = state["restart_requested"]
    trainer.close()
    assert pending.any()  # the scripted episodes ended by the rollout's end wait for the next step
    other = _trainer(tmp_path / "resumed", "warp")
    resumed = other.collector.env
    resumed.set_state(state)
    before = resumed._episode.copy()
    step = resumed.step_td(torch.zeros(NUM_ENVS, 4))
    other.close()
    restarted = resumed._episode > before
    # Outside the block they restart at once, as ended episodes (a scripted one at its goal may end again too).
    assert restarted[pending].all() and step["terminated"][torch.as_tensor(pending)].all()


def test_host_arrays_restart_in_the_same_step(tmp_path, scripted_reach):
    trainer = _trainer(tmp_path, "batch")
    scripted_reach(trainer, torch.arange(NUM_ENVS) < NUM_ENVS // 2)
    batches, _, _ = _recorded(trainer, 1)
    trainer.close()
    assert "valid" not in batches[0]  # the host reads success for free: nothing waits
    assert batches[0]["terminated"].any()

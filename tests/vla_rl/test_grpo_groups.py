"""GRPO groups stay groups: every iteration, members of a group start from one scene and instruction."""

from __future__ import annotations

import torch

from vla_rl.config import build_config
from vla_rl.trainer import Trainer

GROUP = 4
NUM_ENVS = 16


def test_group_members_share_initial_state_and_instruction_every_iteration(tmp_path, scripted_reach):
    cfg = build_config({
        "out_dir": str(tmp_path), "name": "grpo", "algo": "grpo", "seed": 1, "total_env_steps": 10**9,
        "env": {"kind": "sims", "task": "reach", "num_envs": NUM_ENVS, "frames": None,
                "terminate_on_success": True},
        "grpo": {"group_size": GROUP, "optim": {"epochs": 1, "num_minibatches": 1}},
        "policy": {"name": "mlp", "hidden_sizes": [16], "obs_keys": ["proprio", "state"]},
        "eval": {"every": 0}, "log": {"wandb": "disabled", "progress": False, "video": False},
    })
    trainer = Trainer(cfg)
    scripted_reach(trainer, torch.arange(NUM_ENVS) % GROUP == 0)  # each group's first member ends its episode early
    starts, episodes, lengths = [], [], []
    collect = trainer.collector.collect_episodes

    def recording(*args, **kwargs):
        batch, returns, success = collect(*args, **kwargs)
        starts.append(batch["obs"][0].select("state", "proprio", "instruction", "task"))
        episodes.append(trainer.collector.env._episode.copy())
        lengths.append(batch["alive"].sum(0).reshape(-1, GROUP))
        return batch, returns, success

    trainer.collector.collect_episodes = recording
    for _ in range(4):
        trainer.step()
    trainer.close()
    # The leaders ended their episodes early and started no other while their group mates ran on (the env's
    # first_episodes): every member has run as many episodes as its group.
    assert all((n[:, 0] < n[:, 1]).any() for n in lengths)
    assert all((e.reshape(-1, GROUP) == e.reshape(-1, GROUP)[:, :1]).all() for e in episodes)
    for iteration, start in enumerate(starts):
        for key in ("state", "proprio", "instruction", "task"):
            grouped = start[key].reshape(NUM_ENVS // GROUP, GROUP, -1)
            assert (grouped == grouped[:, :1]).all(), f"iteration {iteration}: group members differ in {key}"
        assert len(set(start["instruction"].tolist())) > 1  # groups differ from each other

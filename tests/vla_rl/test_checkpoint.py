"""Checkpoints: an interrupted-and-resumed run equals an uninterrupted one; bad checkpoints fail loudly."""

import pytest
import torch

from vla_rl.checkpoint import CheckpointError, load_checkpoint
from vla_rl.config import build_config
from vla_rl.trainer import Trainer


def _config(out_dir, **extra):
    data = {
        "out_dir": str(out_dir), "name": "pend", "seed": 3, "total_env_steps": 192, "checkpoint_every": 1,
        "env": {"kind": "gym", "task": "Pendulum-v1", "num_envs": 2},
        "ppo": {"rollout_steps": 32, "normalize_reward": True, "optim": {"epochs": 2, "num_minibatches": 2}},
        "policy": {"name": "mlp", "hidden_sizes": [16, 16]},
        "eval": {"every": 1, "episodes": 2, "num_envs": 2},
        "log": {"wandb": "disabled", "progress": False, "video": False},
    }
    for key, value in extra.items():
        data[key] = value
    return build_config(data)


def test_resumed_run_produces_the_same_iterates(tmp_path, interrupted_training):
    straight = Trainer(_config(tmp_path / "a"))
    straight.train()

    interrupted_training(Trainer(_config(tmp_path / "b")), after=2)
    resumed = Trainer(_config(tmp_path / "b"), resume=True)
    assert resumed.iteration == 2
    resumed.train()

    assert resumed.iteration == straight.iteration == 3
    for key, value in straight.policy.state_dict().items():
        assert torch.equal(value, resumed.policy.state_dict()[key]), key
    opt_a = straight.algorithm.updater.optimizer.state_dict()["state"]
    opt_b = resumed.algorithm.updater.optimizer.state_dict()["state"]
    for idx in opt_a:
        assert torch.equal(opt_a[idx]["exp_avg_sq"], opt_b[idx]["exp_avg_sq"])
    assert (straight.collector.obs == resumed.collector.obs).all()
    row_a, row_b = straight.log.rows[-1], resumed.log.rows[-1]
    for key in ("policy_loss", "value_loss", "approx_kl", "eval/train/return"):
        assert row_a[key] == row_b[key], key
    assert [r["iteration"] for r in resumed.log.rows] == [1.0, 2.0, 3.0]


def test_corrupt_truncated_and_mismatched_checkpoints_raise(tmp_path):
    cfg = _config(tmp_path, total_env_steps=64)
    Trainer(cfg).train()
    latest = tmp_path / "pend" / "checkpoints" / "latest.pt"
    assert load_checkpoint(latest)["iteration"] == 1

    with pytest.raises(CheckpointError, match="already holds checkpoints; pass --resume"):
        Trainer(cfg)
    with pytest.raises(CheckpointError, match=r"different config \(seed: 3 -> 4"):
        Trainer(_config(tmp_path, total_env_steps=64, seed=4), resume=True)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        Trainer(_config(tmp_path, name="other"), resume=True)

    blob = bytearray(latest.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    latest.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        Trainer(cfg, resume=True)
    latest.write_bytes(bytes(blob[:100]))
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(latest)
    latest.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="bad header"):
        load_checkpoint(latest)

"""Checkpoints: an interrupted-and-resumed run equals an uninterrupted one; bad checkpoints fail loudly."""

import io
import os

import pytest
import torch

from infra.common.files import seal
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


class _Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling runs a shell command
        return (os.system, (f"touch {self.marker}",))


def _format_2(payload: dict) -> bytes:
    """``payload`` as the format-2 file the earlier code wrote (a sealed ``torch.save`` pickle)."""
    buf = io.BytesIO()
    torch.save({"format_version": 2, **payload}, buf)
    return seal(b"VLARLCKPT1\n", buf.getvalue())


def test_eval_script_refuses_a_crafted_checkpoint_and_runs_nothing(tmp_path, script, capsys):
    marker = tmp_path / "ran"
    latest = tmp_path / "run" / "checkpoints" / "latest.pt"
    latest.parent.mkdir(parents=True)
    latest.write_bytes(_format_2({"config": {}, "policy": _Boom(marker)}))
    assert script("eval").main(["--checkpoint", str(tmp_path / "run"), "--device", "cpu"]) == 2
    assert not marker.exists()
    err = capsys.readouterr().err
    assert f"python scripts/convert_checkpoint.py {latest}" in err and err.count("\n") == 1


def test_a_converted_format_2_checkpoint_resumes(tmp_path, script):
    cfg = _config(tmp_path, total_env_steps=64)
    Trainer(cfg).train()
    latest = tmp_path / "pend" / "checkpoints" / "latest.pt"
    want = load_checkpoint(latest)
    latest.write_bytes(_format_2(want))
    with pytest.raises(CheckpointError, match="format-2 checkpoint"):
        Trainer(_config(tmp_path, total_env_steps=128), resume=True)
    assert script("convert_checkpoint").main([str(latest)]) == 2  # numpy state: a weights-only load refuses it
    assert latest.read_bytes()[:11] == b"VLARLCKPT1\n" and not (latest.parent / "latest.pt.format2").exists()
    assert script("convert_checkpoint").main([str(latest), "--trust-pickle"]) == 0
    assert (latest.parent / "latest.pt.format2").is_file()
    resumed = Trainer(_config(tmp_path, total_env_steps=128), resume=True)
    assert resumed.iteration == 1
    assert all(torch.equal(v, resumed.policy.state_dict()[k]) for k, v in want["policy"].items())
    assert script("convert_checkpoint").main([str(latest)]) == 2  # already format 3

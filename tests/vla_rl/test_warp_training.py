"""The default VLA job trains with env.backend=warp (MuJoCo Warp on Warp's CPU device): the same loop, on device tensors."""

from __future__ import annotations

import math

import pytest

from vla_rl.checkpoint import load_checkpoint
from vla_rl.config import CONFIG_DIR, load_config
from vla_rl.trainer import Trainer


@pytest.mark.slow  # about a minute on 2 cores: Warp's CPU device runs each kernel on one core
def test_default_vla_job_trains_on_the_warp_backend(tmp_path):
    cfg = load_config(CONFIG_DIR / "default.yaml", [
        f"out_dir={tmp_path}", "name=warp", "env.backend=warp", "env.warp_device=cpu", "env.num_envs=4",
        "ppo.rollout_steps=8", "total_env_steps=64", "ppo.optim.num_minibatches=2", "eval.episodes=4",
        "eval.num_envs=4", "eval.every=1", "log.wandb=disabled", "log.progress=false", "log.video=false",
    ])
    trainer = Trainer(cfg)
    assert type(trainer.collector.env._backend).__name__ == "WarpBackend"
    summary = trainer.train()
    trainer.close()
    row = trainer.log.rows[-1]
    assert summary["env_steps"] == 64 and trainer.iteration == 2
    for key in ("policy_loss", "value_loss", "aux_loss", "approx_kl"):
        assert math.isfinite(row[key]), key
    assert 0.0 <= row["eval/validation/success"] <= 1.0 and row["time/render"] > 0
    assert load_checkpoint(trainer.run_dir)["iteration"] == 2

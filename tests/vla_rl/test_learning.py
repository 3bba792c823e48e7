"""A short PPO run on the reach task (state observations) lifts success far above a random policy's."""

import pytest

from vla_rl.config import CONFIG_DIR, load_config
from vla_rl.trainer import Trainer


@pytest.mark.slow
def test_ppo_learns_reach_from_state(tmp_path):
    cfg = load_config(CONFIG_DIR / "reach_state_ppo.yaml", [
        f"out_dir={tmp_path}", "name=reach", "seed=0", "total_env_steps=64000", "eval.every=0",
        "checkpoint_every=1000", "log.wandb=disabled", "log.progress=false", "log.video=false",
    ])
    trainer = Trainer(cfg)
    before = trainer.evaluate()["eval/validation/success"]
    trainer.train()
    after = trainer.evaluate()
    trainer.close()
    # An untrained policy barely reaches an object by chance; the trained one reaches most.
    assert before <= 0.1
    assert after["eval/validation/success"] >= 0.5
    assert after["eval/train/success"] >= 0.5

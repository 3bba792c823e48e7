"""SFT on demonstrations, then RL from the SFT checkpoint: loss, success, exact loading, warm-up, KL."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from policies.vla import PERCEPTION_MODULES
from vla_rl.checkpoint import load_checkpoint
from vla_rl.config import CONFIG_DIR, ConfigError, load_config
from vla_rl.demos.collect import CollectConfig, collect_demos
from vla_rl.trainer import Trainer

QUIET = ["log.wandb=disabled", "log.progress=false", "log.video=false"]


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> Path:
    """Reach demonstrations with DART noise (recovery states, clean expert labels), with frames."""
    out = tmp_path_factory.mktemp("demos") / "reach"
    collect_demos(CollectConfig(task="reach", episodes=200, out=out, noise=0.3, num_envs=16), progress=False)
    return out


def _rows(run_dir: Path) -> list[dict[str, float]]:
    with (run_dir / "metrics.csv").open() as f:
        return [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(f)]


def _state_job(out_dir: Path, name: str, *overrides: str):
    return load_config(CONFIG_DIR / "reach_state_ppo.yaml",
                       [f"out_dir={out_dir}", f"name={name}", "eval.episodes=64", *QUIET, *overrides])


@pytest.fixture(scope="module")
def sft_run(demos, tmp_path_factory) -> Trainer:
    out = tmp_path_factory.mktemp("runs")
    trainer = Trainer(_state_job(out, "sft", "algo=sft", f"sft.dataset={demos}", "sft.iterations=30",
                                 "sft.updates=40", "sft.batch_size=128", "eval.every=30", "eval.at_start=true"))
    trainer.train()
    trainer.close()
    return trainer


def test_sft_lowers_its_loss_and_raises_success_far_above_chance(sft_run):
    rows = _rows(sft_run.run_dir)
    chance, final = rows[0], rows[-1]
    assert chance["iteration"] == 0 and final["iteration"] == 30
    nll = [r["sft_nll"] for r in rows if "sft_nll" in r]
    assert nll[-1] < nll[0] - 2.0, nll
    assert chance["eval/validation/success"] < 0.2
    assert final["eval/validation/success"] >= 0.8 and final["eval/train/success"] >= 0.8, final
    # The Gaussian head's std is left at its initial value (sft.learn_std=false): RL from here explores.
    assert torch.equal(sft_run.policy.head.log_std, torch.full_like(sft_run.policy.head.log_std, -0.5))


def test_rl_from_the_sft_checkpoint_starts_at_its_success_and_warms_the_critic_up(sft_run, tmp_path):
    sft_final = _rows(sft_run.run_dir)[-1]
    rl = Trainer(_state_job(tmp_path, "rl", f"init_from={sft_run.run_dir}", "eval.at_start=true", "eval.every=1",
                            "total_env_steps=4800", "checkpoint_every=1", "ppo.optim.critic_warmup_iterations=1",
                            "ppo.optim.ref_kl_coef=0.1"))
    sft_weights = load_checkpoint(sft_run.run_dir)["policy"]
    for key, value in rl.policy.state_dict().items():
        assert torch.equal(value, sft_weights[key]), key  # loading is exact
    rl.train()
    rl.close()
    rows = _rows(rl.run_dir)
    start, first = rows[0], rows[1]
    for key in ("eval/validation/success", "eval/train/success", "eval/validation/return"):
        assert start[key] == sft_final[key], key  # the RL run starts where SFT ended
    assert first["critic_warmup"] == 1.0 and rows[2]["critic_warmup"] == 0.0
    assert rows[2]["ref_kl"] > 0.0  # the actor moved away from the SFT reference in its first update
    # After the warm-up iteration alone the actor is the SFT actor: only the critic (and the
    # observation statistics, which move after every update) changed.
    warm = load_checkpoint(rl.run_dir / "checkpoints" / "iter_000001.pt")["policy"]
    changed = {k for k in warm if not torch.equal(warm[k], sft_weights[k])}
    assert changed and all(k.startswith(("critic", "value", "normalizer")) for k in changed), changed
    assert any(k.startswith("value") for k in changed)


def test_sft_of_the_default_vla_lowers_its_loss_on_pixels(demos, tmp_path):
    cfg = load_config(CONFIG_DIR / "default.yaml", [f"out_dir={tmp_path}", "name=vla", "algo=sft",
                                                    f"sft.dataset={demos}", "sft.iterations=4", "sft.updates=10",
                                                    "sft.batch_size=64", "sft.image_shift=2", "eval.every=0", *QUIET])
    trainer = Trainer(cfg)
    trainer.train()
    trainer.close()
    rows = _rows(trainer.run_dir)
    assert rows[-1]["sft_nll"] < rows[0]["sft_nll"] and "aux_loss" in rows[0]
    # PPO from it with the perception frozen (the suite recipe's RL stage): only the motor pathway moves.
    rl_cfg = load_config(CONFIG_DIR / "default.yaml", [
        f"out_dir={tmp_path}", "name=rl", f"init_from={trainer.run_dir}", "policy.freeze_perception=true",
        "env.num_envs=8", "ppo.rollout_steps=16", "ppo.optim.num_minibatches=2", "total_env_steps=256",
        "eval.every=0", "ppo.optim.ref_kl_coef=0.1", *QUIET])
    rl = Trainer(rl_cfg)
    rl.train()
    rl.close()
    before, after = load_checkpoint(trainer.run_dir)["policy"], load_checkpoint(rl.run_dir)["policy"]
    moved = {k.split(".")[0] for k in after if not torch.equal(after[k], before[k])}
    assert {"trunk", "head", "value_head"} <= moved and not moved & set(PERCEPTION_MODULES), moved


def test_sft_and_init_from_refuse_bad_input(tmp_path, demos):
    with pytest.raises(ConfigError, match=r"algo=sft needs sft\.dataset"):
        _state_job(tmp_path, "x", "algo=sft")
    with pytest.raises(ConfigError, match=r"holds no meta/info\.json"):  # files: checked where the run starts
        _state_job(tmp_path, "x", "algo=sft", f"sft.dataset={tmp_path}").check()
    with pytest.raises(ConfigError, match=r"init_from=.* does not exist"):
        _state_job(tmp_path, "x", f"init_from={tmp_path / 'nothing'}").check()
    with pytest.raises(ConfigError, match="ref_kl_coef and critic_warmup_iterations"):
        _state_job(tmp_path, "x", "ppo.optim.ref_kl_coef=0.1")
    with pytest.raises(ConfigError, match="does not issue"):
        Trainer(_state_job(tmp_path, "x", "algo=sft", f"sft.dataset={demos}", "env.task=push"))


def test_random_shift_moves_each_camera_image_by_its_own_offset_within_the_pad():
    from vla_rl.sft import random_shift

    images = torch.randint(0, 256, (6, 2, 3, 12, 10), dtype=torch.uint8)
    assert torch.equal(random_shift(images, 0), images)
    torch.manual_seed(0)
    out = random_shift(images, 2)
    assert out.shape == images.shape and out.dtype == torch.uint8
    offsets = set()
    for b in range(6):
        for c in range(2):
            padded = torch.nn.functional.pad(images[b, c].float()[None], (2, 2, 2, 2), mode="replicate")[0]
            found = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                     if torch.equal(padded[:, 2 + dy:14 + dy, 2 + dx:12 + dx].to(torch.uint8), out[b, c])]
            assert found, "every image is a replicate-padded crop within 2 pixels"
            offsets.add(found[0])
    assert len(offsets) > 3, "offsets are drawn per image and camera"


def test_language_augmentation_moves_toward_templates_of_the_same_meaning():
    from sims.tasks import instruction_groups, instruction_table
    from vla_rl.sft import LanguageAugment, paraphrase_table

    instructions = instruction_table(("lift", "press"), "train")
    partners = paraphrase_table(instructions, instruction_groups(("lift", "press"), "train"))
    i = instructions.index("lift the red block")
    said = {instructions[j] for j in partners[i].tolist()}
    assert said == {"pick up the red block", "lift the red block", "grab the red block and raise it",
                    "raise the red block off the table"}
    gen = torch.Generator().manual_seed(0)
    embeddings = torch.nn.functional.normalize(torch.randn(len(instructions), 16, generator=gen), dim=-1)
    index = torch.full((256,), i)
    torch.manual_seed(0)
    mixed = LanguageAugment(embeddings, partners, template_mix=1.0, noise=0.0)(index)
    assert torch.allclose(mixed.norm(dim=-1), torch.ones(256))
    # Without noise every augmented embedding lies on a segment toward a same-meaning template:
    # it is closer to one of them than to any instruction that says something else.
    nearest = (mixed @ embeddings.T).argmax(-1)
    assert set(nearest.tolist()) <= set(partners[i].tolist()) and len(set(nearest.tolist())) > 1
    noisy = LanguageAugment(embeddings, None, template_mix=0.0, noise=0.3)(index)
    offset = (noisy - embeddings[i]).norm(dim=-1)
    assert 0.1 < float(offset.mean()) < 0.5 and float(offset.min()) > 0.0
    with pytest.raises(ConfigError, match="template_mix"):
        load_config(CONFIG_DIR / "halfcheetah_ppo.yaml", ["algo=sft", "sft.dataset=x", "sft.template_mix=1.0"])
    with pytest.raises(ConfigError, match="token_dropout"):
        load_config(CONFIG_DIR / "suite.yaml", ["algo=sft", "sft.dataset=x", "sft.token_dropout=0.2"])
    with pytest.raises(ConfigError, match=r"sft\.token_tail_cut=true cuts at the tokens dropout keeps"):
        load_config(CONFIG_DIR / "suite.yaml", ["algo=sft", "sft.dataset=x", "policy.language=tokens",
                                                "sft.token_tail_cut=true"])


def test_init_log_std_resets_the_exploration_noise_of_the_loaded_policy_only(sft_run, tmp_path):
    rl = Trainer(_state_job(tmp_path, "rl", f"init_from={sft_run.run_dir}", "init_log_std=-1.6",
                            "ppo.optim.ref_kl_coef=0.1"))
    sft_weights = load_checkpoint(sft_run.run_dir)["policy"]
    for key, value in rl.policy.state_dict().items():
        if key == "head.log_std":
            assert torch.equal(value, torch.full_like(value, -1.6))
        else:
            assert torch.equal(value, sft_weights[key]), key
    assert torch.equal(rl.algorithm.updater.reference.head.log_std, rl.policy.head.log_std)
    rl.close()
    with pytest.raises(ConfigError, match=r"init_log_std=-1\.6 sets the std of the policy init_from loads"):
        _state_job(tmp_path, "x", "init_log_std=-1.6")

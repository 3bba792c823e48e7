"""The RLVR job: config overrides, outputs, and (slow) that reward really rises."""

import csv
import json

import pytest
import torch

from infra.common.typed_config import ConfigError, apply_overrides
from infra.llm.model import ModelConfig, TinyCausalLM
from infra.llm.rlvr import RLVRConfig, local_services, open_run_log, run_job, write_outputs
from infra.llm.verifiable_tasks import VOCAB_SIZE

torch.set_num_threads(2)

CHAR = ["model.kind=char"]
"""The tiny character model of the CPU demo (the default kind, ``hf``, needs a model folder)."""


def test_overrides_reach_nested_sections_and_reject_bad_input() -> None:
    cfg = apply_overrides(RLVRConfig(), ["iterations=7", "grpo.optim.lr=3e-4", "model.d_model=64", "ray=true", "task=add"])
    assert (cfg.iterations, cfg.grpo.optim.lr, cfg.model.d_model, cfg.ray, cfg.task) == (7, 3e-4, 64, True, "add")
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) \['lrr'\] in section 'grpo'"):
        apply_overrides(RLVRConfig(), ["grpo.lrr=1"])
    with pytest.raises(ConfigError, match="iterations='many' must be an integer"):
        apply_overrides(RLVRConfig(), ["iterations=many"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(RLVRConfig(), ["iterations"])
    with pytest.raises(ValueError, match="multiple of n_heads"):
        apply_overrides(RLVRConfig(), ["model.d_model=30"])
    with pytest.raises(ValueError, match="model has 48 positions"):
        apply_overrides(RLVRConfig(), [*CHAR, "task_size=60"]).check()
    with pytest.raises(ValueError, match="unknown task"):
        apply_overrides(RLVRConfig(), [*CHAR, "task=chess"]).check()
    with pytest.raises(ValueError, match="group_size"):
        apply_overrides(RLVRConfig(), [*CHAR, "grpo.group_size=1"]).check()
    with pytest.raises(ValueError, match=r"model\.path is empty; pass model\.path=DIR"):
        RLVRConfig().check()  # the default kind is a Hugging Face model, which needs its folder
    with pytest.raises(ValueError, match=r"model\.kind='gguf' is unknown"):
        apply_overrides(RLVRConfig(), ["model.kind=gguf"])
    apply_overrides(RLVRConfig(), CHAR).check()


def test_the_llm_and_vla_trainers_read_one_grpo_config_checked_by_the_same_ranges() -> None:
    """One shape (rlcore.update_config.GRPOConfig) for both trainers; the LLM job range-checks it before any
    service starts and refuses, by name, a field its trainer would otherwise ignore."""
    from rlcore.update_config import GRPOConfig
    from vla_rl.config import CONFIG_DIR, load_config

    llm, vla = RLVRConfig().grpo, load_config(CONFIG_DIR / "reach_grpo.yaml").grpo
    assert type(llm) is type(vla) is GRPOConfig and type(llm.optim) is type(vla.optim)
    for bad, message in [("grpo.optim.lr=0", r"grpo\.optim\.lr=0\.0 must be in \(0, 1\]"),
                         ("grpo.optim.clip_coef=1.5", r"grpo\.optim\.clip_coef=1\.5 must be in"),
                         ("grpo.std_eps=0", r"grpo\.std_eps=0\.0 must be greater than 0"),
                         ("grpo.optim.epochs=0", r"grpo\.optim\.epochs=0 must be at least 1"),
                         ("grpo.optim.target_kl=0.01", r"grpo\.optim\.target_kl=0\.01 is not implemented"),
                         ("grpo.optim.anneal_lr=true", r"grpo\.optim\.anneal_lr=True is not implemented.*leave it at False"),
                         ("grpo.optim.clip_coef_high=0.28", r"grpo\.optim\.clip_coef_high=0\.28 is not implemented"),
                         ("grpo.optim.rollout_temperature=1.5", r"grpo\.optim\.rollout_temperature=1\.5 is not implemented"),
                         ("grpo.min_group_success=0.1", r"grpo\.min_group_success/max_group_success/"
                                                        r"min_groups_per_update/anchor_fraction \(dynamic sampling\) "
                                                        r"are not implemented"),
                         ("grpo.min_groups_per_update=4", r"grpo\.min_group_success/max_group_success/"
                                                          r"min_groups_per_update/anchor_fraction \(dynamic sampling\)"),
                         ("grpo.anchor_fraction=0.5", r"anchor_fraction \(dynamic sampling\) are not implemented")]:
        with pytest.raises(ValueError, match=message):
            apply_overrides(RLVRConfig(), [*CHAR, bad]).check()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_rlvr_job_learns_and_writes_its_curve(tmp_path) -> None:
    cfg = RLVRConfig(name="t", iterations=30, eval_every=15, out_dir=str(tmp_path),
                     model=ModelConfig(kind="char", vocab_size=VOCAB_SIZE))
    result = run_job(cfg.name, cfg, local_services(cfg))
    run = open_run_log(cfg)
    for row in result.rows:
        run.log(row)
    summary = write_outputs(run, cfg)
    run.close()
    # The target: mean reward at the end at least 3x its start (windows of 6 iterations).
    assert summary["mean_reward_last_iters"] >= 3 * summary["mean_reward_first_iters"] > 0
    assert summary["eval_greedy_accuracy_end"] > summary["eval_greedy_accuracy_start"]
    with open(tmp_path / "t" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == cfg.iterations + 1 and "mean_reward" in rows[0]
    assert (tmp_path / "t" / "curves.png").stat().st_size > 1000
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["window_iters"] == 6


def test_every_llm_config_validates_in_one_style_and_is_checked_where_it_is_loaded() -> None:
    """``validate()`` on each config dataclass, one-line ``ConfigError`` naming the key; typed_config runs it on
    load, so a bad value in an override or YAML section is refused before ``check()`` touches any file."""
    from infra.common.typed_config import from_dict
    from infra.llm.elastic import PoolConfig
    from infra.llm.pool_shape import PoolShape
    from infra.llm.sim.real_bench import RealBenchConfig
    from infra.llm.sim.report import BenchConfig
    from infra.llm.sim.service_pool import ServicePool
    from infra.llm.trainer_checkpoint import CheckpointSpec

    for cfg, message in [(RLVRConfig(temperature=-1.0), r"temperature=-1\.0 must be a finite number >= 0"),
                         (RLVRConfig(model=ModelConfig(d_model=30)), r"model\.d_model=30 is not a multiple of n_heads=4"),
                         (ModelConfig(kind="gguf"), r"model\.kind='gguf' is unknown"),
                         (ModelConfig(n_heads=0), r"model\.n_heads=0 must be positive"),
                         (CheckpointSpec("relative/dir"), r"CheckpointSpec\.dir='relative/dir' is relative"),
                         (PoolConfig(PoolShape(2, 1), router="random"), r"unknown router 'random'"),
                         (ServicePool(PoolShape(1, 1), capacity=0), r"capacity=0 must be >= 1"),
                         (BenchConfig(jobs=0), r"jobs=0"),
                         (RealBenchConfig(time_scale=0.0), r"time_scale=0\.0 must be > 0")]:
        with pytest.raises(ConfigError, match=message) as err:
            cfg.validate()
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"temperature=-1\.0 must be a finite number >= 0"):
        apply_overrides(RLVRConfig(), ["temperature=-1"])  # at load, before any model folder or reward is read
    with pytest.raises(ConfigError, match=r"shape\.rollout_homes=3 exceeds shape\.rollout_gpus=2"):
        from_dict(PoolConfig, {"shape": {"rollout_gpus": 2, "trainer_gpus": 1, "rollout_homes": 3}})
    with pytest.raises(ConfigError, match=r"model\.d_model=30"):  # built in code: checked where a model is built
        TinyCausalLM(ModelConfig(d_model=30))

"""The SFT -> RL recipe on LIBERO at toy scale (configs/libero_spatial.yaml shrunk: one task, two
environments, 16x16 frames of both cameras, 3-step episodes), then LIBERO's protocol on its checkpoint.

The demonstrations are the Spatial expert's (3 steps are too few to succeed: failures are kept),
written by the recipe as a LeRobot v3 dataset; SFT and PPO each run; both checkpoints are tested
on the fixed and the _lan splits with per-task Wilson intervals; scripts/eval_libero.py writes the
protocol JSON with the simulator caveat. A LIBERO training run crashed and resumed equals the
uninterrupted one (its environments snapshot). The CPU recipe's demonstrations come from LIBERO's region-sampled
train starts with its OSC, and no training config evaluates the fixed states. Needs the LIBERO cache (spatial/0 and its
_lan variant: exported by the fixture if missing).
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch

import sims
from sims.libero.toolchain.install import ensure_lan
from vla_rl.config import CONFIG_DIR
from vla_rl.demos.reader import DemoDataset

STAGE = ["env.task=libero_spatial/0", "env.num_envs=2", "env.image_size=16", "policy.image_size=16",
         "env.max_episode_steps=3", "eval.episodes=2", "eval.num_envs=2", "log.wandb=disabled",
         "log.progress=false", "policy.conv_channels=[8]", "policy.trunk_sizes=[32]", "policy.width=16",
         "policy.critic_hidden_sizes=[32]"]
TINY = ["demos.episodes=2", "demos.num_envs=2", "demos.keep_failures=true", "demos.noise=0",
        *(f"{stage}.{o}" for stage in ("sft", "rl") for o in STAGE),
        "sft.sft.iterations=2", "sft.sft.updates=2", "sft.sft.batch_size=4", "sft.eval.every=2",
        "rl.total_env_steps=8", "rl.ppo.rollout_steps=4", "rl.ppo.optim.num_minibatches=2", "rl.eval.every=1",
        "test.episodes=2", "test.num_envs=2"]


@pytest.fixture(scope="module")
def cached() -> None:
    ensure_lan(["spatial/0"])


def test_libero_recipe_runs_and_reports_the_protocol(cached, tmp_path, script):
    out = tmp_path / "recipe.json"
    args = ["--config", str(CONFIG_DIR / "libero_spatial.yaml"), *TINY, f"out_dir={tmp_path}", "--json", str(out)]
    assert script("sft_rl").main(args) == 0
    report = json.loads(out.read_text())
    root = tmp_path / "libero-spatial-sft-rl"
    demos = DemoDataset(root / "demos")
    assert len(demos) == 2 * 3  # two kept episodes of 3 steps
    batch = demos.batch(torch.arange(len(demos)))
    assert batch["rgb"].shape == (6, 2, 3, 16, 16) and batch["action"].shape == (6, 7) and batch["proprio"].shape == (6, 8)
    assert demos.instructions == ["pick the akita black bowl between the plate and the ramekin and place it on the plate"]
    for stage in ("sft", "rl"):
        assert (root / stage / "checkpoints" / "latest.pt").is_file()
        results = report["results"][stage]
        assert "caveat" in results["protocol"] and results["protocol"]["episodes_per_task"] == 2
        for split in ("fixed", "lan"):
            figure = results[split]
            assert figure["episodes"] == 2 and 0.0 <= figure["ci95"][0] <= figure["success"] <= figure["ci95"][1]
            assert set(figure["tasks"]) == {"spatial/0"} and set(figure["suites"]) == {"spatial"}
        assert results["lan"]["tasks"]["spatial/0"]["instruction"] != results["fixed"]["tasks"]["spatial/0"]["instruction"]
        beside = results["side_by_side"]["tasks"]["spatial/0"]  # lan beside the fixed-state figure
        assert (beside["fixed"], beside["lan"]) == (results["fixed"]["success"], results["lan"]["success"])
    rl_header = (root / "rl" / "metrics.csv").read_text().splitlines()[0]
    assert "eval/validation/success" in rl_header and "eval/lan/success" not in rl_header  # lan stays held out

    # The protocol alone, on the RL checkpoint: JSON with per-task and per-suite rates and the caveat.
    protocol = tmp_path / "protocol.json"
    eval_main = script("eval_libero").main
    assert eval_main(["--checkpoint", str(root / "rl"), "--json", str(protocol), "--episodes-per-task", "2",
                      "--envs-per-task", "2", "--splits", "fixed"]) == 0
    results = json.loads(protocol.read_text())["results"]
    rate = results["splits"]["fixed"]["tasks"]["spatial/0"]
    assert rate["episodes"] == 2 and len(rate["ci95"]) == 2 and results["splits"]["fixed"]["suites"]["spatial"]
    assert "not directly comparable" in results["protocol"]["caveat"]
    assert eval_main(["--checkpoint", str(root / "rl"), "--json", str(protocol), "--episodes-per-task", "3",
                      "--envs-per-task", "2"]) == 2  # 2 environments cannot play 3 states once each


def test_memory_estimate_counts_libero_scenes_and_contexts(cached):
    from vla_rl.config import load_config
    from vla_rl.memory import estimate_run

    memory = sims.suite_of("libero_spatial").memory

    ensure_lan([f"spatial/{i}" for i in range(10)])
    need, evaluation = estimate_run(load_config(CONFIG_DIR / "libero.yaml"))
    # Ten scenes held once (the evaluation envs share them), a GL context per task in the training env and
    # in the evaluation envs: the lower bound is gigabytes, not the gantry's 220 KiB per environment.
    assert need.envs >= 10 * memory.per_task_scene and evaluation < need.total
    assert need.frames >= 2 * 10 * memory.per_task_context and need.total > 10 * 2**30


def _libero_job(out_dir, name: str):
    from vla_rl.config import load_config

    return load_config(CONFIG_DIR / "libero.yaml", [*STAGE, "total_env_steps=24", "ppo.rollout_steps=4",
                                                    "ppo.optim.num_minibatches=2", "checkpoint_every=1", "eval.every=2",
                                                    "log.video=false", f"out_dir={out_dir}", f"name={name}"])


def test_a_resumed_libero_run_equals_the_uninterrupted_one(cached, tmp_path, interrupted_training):
    """Three PPO iterations of 4 steps (episodes of 3: the checkpoint falls mid-episode), crashed after two and
    resumed: the environments continue from the checkpoint's snapshot, so weights, carried frames and the
    last iteration's losses and evaluations equal the uninterrupted run's, and no re-reset warning is given."""
    import warnings

    from vla_rl.trainer import Trainer

    straight = Trainer(_libero_job(tmp_path, "straight"))
    straight.train()
    straight.close()
    first = Trainer(_libero_job(tmp_path, "resumed"))
    interrupted_training(first, after=2)
    first.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = Trainer(_libero_job(tmp_path, "resumed"), resume=True)
        assert resumed.iteration == 2
        resumed.train()
    resumed.close()
    weights_a, weights_b = straight.policy.state_dict(), resumed.policy.state_dict()
    assert [k for k in weights_a if not torch.equal(weights_a[k], weights_b[k])] == []
    assert (straight.collector.obs == resumed.collector.obs).all()  # rgb of both cameras included
    row_a, row_b = straight.log.rows[-1], resumed.log.rows[-1]
    for key in ("policy_loss", "value_loss", "approx_kl", "eval/validation/success", "eval/fixed/return"):
        assert row_a[key] == row_b[key], key
    assert not [w for w in caught if "environment state" in str(w.message)], [str(w.message) for w in caught]


def test_demonstrations_come_from_the_train_starts_in_the_recipes_env(cached, tmp_path, script):
    """The CPU recipe records its demonstrations with its SFT env's controller and starts (not the suite's defaults),
    each episode from a train start (scripts/collect_demos.py --env-settings as the recipe passes them); a relaunch
    refuses demonstrations recorded in another env; a demonstration on a fixed-state split is refused."""
    from infra.common.typed_config import ConfigError
    from sims.libero.regions import load_region_starts, split_pool
    from sims.libero.toolchain.region_starts import ensure_region_starts
    from vla_rl.config import load_config
    from vla_rl.demos.collect import CollectConfig
    from vla_rl.recipe import check_demos, demo_env_settings, load_recipe, stage_configs

    ensure_region_starts(["spatial/0"], 5)
    env = stage_configs(load_recipe(CONFIG_DIR / "libero_spatial_cpu.yaml", []))["sft"].env
    assert demo_env_settings(env) == {"controller": "osc", "starts": "regions"}
    out = tmp_path / "demos"
    script("collect_demos").main(["--task", "libero_spatial/0", "--episodes", "2", "--out", str(out), "--num-envs", "2",
                                  "--image-size", "16", "--cameras", "agentview", "--keep-failures", "--max-steps", "3",
                                  "--num-threads", "1", "--env-settings", "controller=osc", "starts=regions"])
    source = json.loads((out / "meta/info.json").read_text())["source"]
    assert (source["controller"], source["starts"], source["split"]) == ("osc", "regions", "train")
    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    train = split_pool(load_region_starts("spatial/0").count, "train")
    assert len(episodes) == 2 and {e["libero/state_index"] for e in episodes} <= set(train)
    check_demos(out, env)  # a relaunch of the recipe reuses them
    servo = load_config(CONFIG_DIR / "libero.yaml").env  # a recipe whose env changed since: they are stale
    with pytest.raises(ConfigError, match=r"holds demonstrations recorded with controller=osc, the SFT env has "
                                          r"controller=servo: remove that folder"):
        check_demos(out, servo)
    for bad in ({"split": "fixed"}, {"reward": "dense"}):
        with pytest.raises(ValueError, match=rf"env_settings \['{next(iter(bad))}'\]: not settings of a libero env"):
            CollectConfig(task="libero_spatial/0", out=tmp_path / "other", cameras=("agentview",),
                          env_settings=bad).validate()


def test_a_training_config_refuses_the_fixed_state_splits_in_its_evaluation():
    from infra.common.typed_config import ConfigError
    from vla_rl.config import load_config

    for splits in ("[validation,fixed]", "[lan]", "[train,paraphrase]"):
        with pytest.raises(ConfigError, match=r"^eval.splits holds \[.*\]: libero_spatial's test states, never evaluated "
                                              r"during training; remove them"):
            load_config(CONFIG_DIR / "libero.yaml", [f"eval.splits={splits}"])
    assert load_config(CONFIG_DIR / "libero.yaml").eval.splits == ("validation",)

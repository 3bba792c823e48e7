"""The SFT -> RL recipe on LIBERO at toy scale (configs/libero_spatial.yaml shrunk: one task, two
environments, 16x16 frames of both cameras, 3-step episodes), then LIBERO's protocol on its checkpoint.

The demonstrations are the Spatial expert's (3 steps are too few to succeed: failures are kept),
written by the recipe as a LeRobot v3 dataset; SFT and PPO each run, PPO with the anchors' options
(critic warm-up, then clip-higher and a rollout temperature), and GRPO from the same SFT checkpoint with
dynamic sampling; both recipe checkpoints are tested on the fixed and the _lan splits with per-task
Wilson intervals; scripts/eval_libero.py writes the protocol JSON with the simulator caveat; a recipe
that would evaluate the fixed states during training is refused before anything runs. The CPU recipe's
demonstrations come from LIBERO's region-sampled train starts with its OSC. A LIBERO training run crashed and resumed equals the
uninterrupted one (its environments snapshot). Needs the LIBERO cache (spatial/0 and its _lan variant:
exported by the fixture if missing).
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq
import pytest
import torch

import sims
from sims.libero.toolchain.install import ensure_lan
from sims.libero.toolchain.region_starts import ensure_region_starts
from vla_rl.config import CONFIG_DIR
from vla_rl.demos.reader import DemoDataset

STAGE = ["env.task=libero_spatial/0", "env.num_envs=2", "env.frames.width=16", "env.frames.height=16", "policy.image_size=16",
         "env.suite.max_steps=3", "eval.episodes=2", "eval.num_envs=2", "log.wandb=disabled",
         "log.progress=false", "policy.conv_channels=[8]", "policy.trunk_sizes=[32]", "policy.width=16",
         "policy.critic_hidden_sizes=[32]"]
TINY = ["demos.episodes=2", "demos.num_envs=2", "demos.keep_failures=true", "demos.noise=0",
        *(f"{stage}.{o}" for stage in ("sft", "rl") for o in STAGE),
        "sft.sft.iterations=2", "sft.sft.updates=2", "sft.sft.batch_size=4", "sft.eval.every=2",
        "rl.total_env_steps=64", "rl.ppo.rollout_steps=4", "rl.ppo.optim.num_minibatches=2", "rl.eval.every=1",
        "rl.ppo.optim.critic_warmup_iterations=1", "rl.ppo.optim.clip_coef_high=0.28",
        "rl.ppo.optim.rollout_temperature=1.5", "test.episodes=2", "test.num_envs=2"]
GRPO = ["rl.algo=grpo", "rl.grpo.group_size=2", "rl.grpo.min_group_success=0.1", "rl.grpo.max_group_success=0.9",
        "rl.grpo.optim.num_minibatches=1", "rl.grpo.optim.clip_coef_high=0.28", "rl.grpo.optim.rollout_temperature=1.5",
        "rl.grpo.min_groups_per_update=2", "rl.grpo.anchor_fraction=0.5", "rl.grpo.optim.ref_kl_coef=0.05",
        "rl.total_env_steps=16"]


def _rows(run_dir) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.csv").read_text().splitlines()
    names = lines[0].split(",")
    return [{k: float(v) for k, v in zip(names, line.split(",")) if v} for line in lines[1:]]


def _grpo_from_the_sft_checkpoint(out_dir) -> None:
    """GRPO with dynamic sampling (its fill and anchors, a KL toward the SFT policy), clip-higher and a rollout
    temperature from the recipe's SFT checkpoint: the 3-step episodes never succeed, so every group falls below the
    band, is dropped, and no step is taken (anchors join only beside a kept group)."""
    from vla_rl.checkpoint import load_checkpoint
    from vla_rl.recipe import load_recipe, stage_configs
    from vla_rl.trainer import Trainer

    recipe = load_recipe(CONFIG_DIR / "libero_spatial.yaml", [*TINY, *GRPO, f"out_dir={out_dir}"])
    cfg = dataclasses.replace(stage_configs(recipe)["rl"], name="grpo")
    trainer = Trainer(cfg)
    assert trainer.policy.head.temperature == 1.5
    trainer.train()
    trainer.close()
    # Where its episodes started: training on the train split's region starts, evaluation on validation's, none at a
    # fixed state.
    assert (trainer.collector.env.config.split, trainer.collector.env.config.starts) == ("train", "regions")
    assert {which: env.config.split for which, env in trainer.eval_envs.items()} == {"validation": "validation"}
    rows = [r for r in _rows(trainer.run_dir) if "grpo/groups_dropped" in r]
    assert len(rows) == 2 and all(r["episode_success"] == 0.0 for r in rows)  # the premise
    assert all((r["grpo/groups_kept"], r["grpo/groups_dropped"], r["grpo/groups_held"], r["minibatch_steps"])
               == (0.0, 1.0, 0.0, 0.0) for r in rows)
    sft, grpo = load_checkpoint(out_dir / recipe.name / "sft")["policy"], trainer.policy.state_dict()
    sft["head.log_std"] = torch.full_like(sft["head.log_std"], cfg.init_log_std)  # RL's exploration noise, set at load
    moved = [k for k in grpo if not torch.equal(grpo[k], sft[k]) and "norm" not in k]  # statistics still update
    assert moved == []


@pytest.mark.parametrize("stage", ["sft", "rl"])
def test_a_recipe_that_evaluates_the_fixed_states_during_training_is_refused(tmp_path, stage):
    from infra.common.typed_config import ConfigError
    from vla_rl.recipe import load_recipe

    with pytest.raises(ConfigError, match=rf"^recipe stage {stage}: eval\.splits holds \['fixed'\]: libero_spatial/0's "
                                          r"test states, never evaluated during training"):
        load_recipe(CONFIG_DIR / "libero_spatial.yaml", [*TINY, f"out_dir={tmp_path}",
                                                         f"{stage}.eval.splits=[validation,fixed]"])
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.fixture(scope="module")
def cached() -> None:
    ensure_lan(["spatial/0"])
    ensure_region_starts(["spatial/0"], 5)  # the train and validation splits' starts


def test_libero_recipe_runs_and_reports_the_protocol(cached, tmp_path, script):
    out = tmp_path / "recipe.json"
    args = ["--config", str(CONFIG_DIR / "libero_spatial.yaml"), *TINY, f"out_dir={tmp_path}", "--json", str(out)]
    assert script("sft_rl").main(args) == 0
    report = json.loads(out.read_text())
    root = tmp_path / "libero-spatial-sft-rl"
    demos = DemoDataset(root / "demos")
    assert json.loads((root / "demos" / "meta" / "info.json").read_text())["source"]["split"] == "train"
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
    rows = _rows(root / "rl")
    assert [r["critic_warmup"] for r in rows if "critic_warmup" in r] == [1.0, 0.0]  # warm-up, then a policy update
    assert report["config"]["rl"]["ppo"]["optim"]["clip_coef_high"] == 0.28
    _grpo_from_the_sft_checkpoint(tmp_path)

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
    from vla_rl.config.train import estimate_run

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
    for key in ("policy_loss", "value_loss", "approx_kl", "eval/validation/success", "eval/validation/return"):
        assert row_a[key] == row_b[key], key
    assert not [w for w in caught if "environment state" in str(w.message)], [str(w.message) for w in caught]


def test_demonstrations_come_from_the_train_starts_in_the_recipes_env(cached, tmp_path, script):
    """The CPU recipe records its demonstrations with its SFT env's controller and starts (not the suite's defaults),
    each episode from a train start (scripts/collect_demos.py --suite-settings as the recipe passes them); a relaunch
    refuses demonstrations recorded in another env; a demonstration on a fixed-state split is refused."""
    from infra.common.typed_config import ConfigError
    from sims.libero.regions import load_region_starts, split_pool
    from vla_rl.config import load_config
    from vla_rl.demos.collect import CollectConfig
    from vla_rl.recipe import check_demos, load_recipe, stage_configs

    ensure_region_starts(["spatial/0"], 5)
    env = stage_configs(load_recipe(CONFIG_DIR / "libero_spatial_cpu.yaml", []))["sft"].env
    assert (env.suite["controller"], env.suite["starts"]) == ("osc", "regions")
    out = tmp_path / "demos"
    script("collect_demos").main(["--task", "libero_spatial/0", "--episodes", "2", "--out", str(out), "--num-envs", "2",
                                  "--image-size", "16", "--cameras", "agentview", "--keep-failures", "--max-steps", "3",
                                  "--num-threads", "1", "--suite-settings", "controller=osc", "starts=regions"])
    source = json.loads((out / "meta/info.json").read_text())["source"]
    assert (source["controller"], source["starts"], source["split"]) == ("osc", "regions", "train")
    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    train = split_pool(load_region_starts("spatial/0").count, "train")
    assert len(episodes) == 2 and {e["libero/state_index"] for e in episodes} <= set(train)
    check_demos(out, env)  # a relaunch of the recipe reuses them
    lang = load_config(CONFIG_DIR / "libero.yaml", ["env.suite.controller=osc", "env.suite.starts=regions",
                                                    "env.suite.instructions=paraphrase"]).env
    check_demos(out, lang)  # and so does an SFT on paraphrases: experts record each task's own instruction
    servo = load_config(CONFIG_DIR / "libero.yaml", ["env.suite.controller=servo", "env.suite.starts=regions"]).env
    with pytest.raises(ConfigError, match=r"holds demonstrations recorded with controller=osc, the SFT env has "
                                          r"controller=servo: remove that folder"):  # the recipe's env changed since
        check_demos(out, servo)
    for bad in ({"split": "fixed"}, {"reward": "dense"}):
        with pytest.raises(ValueError, match=rf"suite_settings has unknown key\(s\) \['{next(iter(bad))}'\]; the libero "):
            CollectConfig(task="libero_spatial/0", out=tmp_path / "other", cameras=("agentview",),
                          suite_settings=bad).validate()


def test_a_recipe_over_two_suites_reports_each_task_and_suite(cached, tmp_path, script):
    """One policy over tasks of two suites (``libero_spatial/0+libero_object/0``, as over the 40 tasks with
    ``libero_spatial+libero_object+libero_goal+libero_10``): each suite's expert records its task's demonstrations,
    each task keeps its suite's step limit, and the protocol reports each task and each suite."""
    ensure_lan(["object/0"])
    ensure_region_starts(["object/0"], 5)
    task = "libero_spatial/0+libero_object/0"
    out = tmp_path / "recipe.json"
    args = ["--config", str(CONFIG_DIR / "libero_spatial.yaml"), *TINY, "stages=[sft]", f"sft.env.task={task}",
            "sft.env.suite.max_steps=null", "sft.sft.iterations=1", "sft.eval.every=0", f"out_dir={tmp_path}",
            "--json", str(out)]
    assert script("sft_rl").main(args) == 0
    demos = DemoDataset(tmp_path / "libero-spatial-sft-rl" / "demos")
    assert sorted(demos.instructions) == ["pick the akita black bowl between the plate and the ramekin and place it on "
                                          "the plate", "pick the alphabet soup and place it in the basket"]
    results = json.loads(out.read_text())["results"]["sft"]
    for split in ("fixed", "lan"):
        assert set(results[split]["tasks"]) == {"spatial/0", "object/0"}
        assert set(results[split]["suites"]) == {"spatial", "object"}


def test_template_mixing_on_libero_mixes_each_tasks_own_instruction_with_its_training_paraphrases(cached):
    """``sft.template_mix`` on a LIBERO task draws its partners from the suite's training paraphrases (the task's own
    instruction first); with LIBERO's own instructions only there is nothing to mix, and the run is refused."""
    from infra.common.typed_config import ConfigError
    from sims.libero.paraphrase import paraphrases
    from sims.libero.scene import load_task
    from vla_rl.config import load_config
    from vla_rl.sft import template_groups

    mix = ["env.task=libero_spatial/0", "algo=sft", "sft.dataset=demos", "sft.template_mix=1.5"]  # (not read)
    groups = template_groups(load_config(CONFIG_DIR / "libero.yaml", [*mix, "env.suite.instructions=paraphrase"]))
    assert groups == [(load_task("spatial/0").instruction, *paraphrases("spatial/0", "train"))]
    with pytest.raises(ConfigError, match=r"trains each task on one here: set sft.template_mix=0, or give its tasks "
                                          r"several \(env.suite.instructions=paraphrase"):
        template_groups(load_config(CONFIG_DIR / "libero.yaml", mix))

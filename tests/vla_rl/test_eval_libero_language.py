"""LIBERO's instructions at evaluation: scripts/eval.py ``--instruction`` on a LIBERO run (whole sentences
for one task), scripts/eval_libero.py's fixed, _lan and paraphrase splits and a user's instructions
(``--instruction TASK TEXT``) per task, side by side, and scripts/bench_language_dev.py's validation paraphrases; and in
SFT: with env.suite.instructions=paraphrase each frame draws one of its task's training instructions.

One PPO iteration of the VLA on spatial/0 at toy scale (two environments, 16x16 frames, 3-step episodes)
makes the checkpoint; needs the LIBERO cache (spatial/0 and its _lan variant: exported if missing).
"""

from __future__ import annotations

import json

import pytest
import torch

from sims.libero.paraphrase import libero_training_groups, paraphrases
from sims.libero.plugin import check_instructions
from sims.libero.scene import load_lan, load_task
from sims.libero.toolchain.install import ensure_lan
from sims.libero.toolchain.region_starts import ensure_region_starts
from vla_rl.config import CONFIG_DIR, load_config
from vla_rl.sft import ParaphraseResample
from vla_rl.trainer import Trainer

TOY = ["env.task=libero_spatial/0", "env.num_envs=2", "env.frames.width=16", "env.frames.height=16", "policy.image_size=16",
       "env.suite.max_steps=3", "eval.episodes=2", "eval.num_envs=2", "eval.every=0", "log.wandb=disabled",
       "log.progress=false", "log.video=false", "policy.conv_channels=[8]", "policy.trunk_sizes=[32]",
       "policy.width=16", "policy.critic_hidden_sizes=[32]", "total_env_steps=8", "ppo.rollout_steps=4",
       "ppo.optim.num_minibatches=2"]


@pytest.fixture(scope="module")
def libero_run(tmp_path_factory):
    ensure_lan(["spatial/0"])
    ensure_region_starts(["spatial/0"], 5)  # the train and validation splits' starts
    out = tmp_path_factory.mktemp("runs")
    trainer = Trainer(load_config(CONFIG_DIR / "libero.yaml", [*TOY, f"out_dir={out}", "name=lang"]))
    trainer.train()
    trainer.close()
    return out / "lang"


def test_user_instructions_instruct_a_libero_run(libero_run, tmp_path, script):
    said = ["lift the bowl between the plate and the ramekin onto the plate", "plate, bowl: you know what to do"]
    out = tmp_path / "eval.json"
    args = ["--checkpoint", str(libero_run), "--split", "fixed", "--episodes", "4", "--num-envs", "2",
            *(x for t in said for x in ("--instruction", t)), "--json", str(out)]
    assert script("eval").main(args) == 0
    results = json.loads(out.read_text())["results"]
    assert sorted(results["instructions"]) == sorted(said)  # both were said, round robin
    assert list(results["tasks"]) == ["spatial/0"] and results["episodes"] == 4


def test_bad_libero_instructions_are_refused_before_running(libero_run, capsys, script):
    args = ["--checkpoint", str(libero_run), "--split", "fixed", "--instruction", "put the {a} on the plate"]
    assert script("eval").main(args) == 2
    assert "a LIBERO instruction is a whole sentence" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"has 10; pick one with --task \(e.g. --task libero_spatial/0\)$"):
        check_instructions("libero_spatial", None, ["pick up the bowl"])
    with pytest.raises(ValueError, match=r"^task libero_goal/1: not a task of the run's env.task=libero_spatial$"):
        check_instructions("libero_spatial", "libero_goal/1", ["put the bowl on the stove"])
    check_instructions("libero_spatial", "libero_spatial/4", ["pick up the bowl in the top drawer"])


def test_protocol_reports_lan_and_paraphrase_beside_the_fixed_states(libero_run, tmp_path, script):
    out = tmp_path / "protocol.json"
    assert script("eval_libero").main(["--checkpoint", str(libero_run), "--json", str(out), "--episodes-per-task", "2",
                                       "--envs-per-task", "2", "--splits", "fixed", "lan", "paraphrase"]) == 0
    results = json.loads(out.read_text())["results"]
    tasks = {s: results["splits"][s]["tasks"]["spatial/0"] for s in ("fixed", "lan", "paraphrase")}
    assert tasks["fixed"]["instruction"] == load_task("spatial/0").instruction
    assert tasks["lan"]["instruction"] == load_lan(load_task("spatial/0")).instruction
    said = tasks["paraphrase"].get("instructions", [tasks["paraphrase"].get("instruction")])
    assert set(said) <= set(paraphrases("spatial/0", "heldout"))
    row = results["side_by_side"]["tasks"]["spatial/0"]
    assert {k: row[k] for k in ("fixed", "lan", "paraphrase")} == {s: tasks[s]["success"] for s in tasks}
    assert row["lan_minus_fixed"] == round(100 * (row["lan"] - row["fixed"]), 1)
    assert set(results["side_by_side"]["suites"]["spatial"]) >= {"fixed", "lan", "paraphrase", "lan_minus_fixed"}
    protocol = results["protocol"]  # the run's env as it was evaluated: its suite settings, LIBERO's limit beside them
    assert (protocol["suite_settings"]["max_steps"], protocol["suite_settings"]["settle_steps"]) == (3, 10)
    assert protocol["max_steps"] == 220


def test_protocol_plays_a_users_instructions_beside_the_fixed_states(libero_run, tmp_path, script, capsys):
    """eval_libero --instruction TASK TEXT: the task plays the fixed states with the user's sentences (round robin),
    reported per sentence and side by side with the fixed-state figure; a bad one is refused before anything runs."""
    said = ["grab the bowl sitting between the plate and the ramekin and set it on the plate", "bowl onto the plate"]
    out = tmp_path / "user.json"
    main = script("eval_libero").main
    assert main(["--checkpoint", str(libero_run), "--json", str(out), "--episodes-per-task", "2", "--envs-per-task",
                 "2", "--splits", "fixed", *(x for t in said for x in ("--instruction", "libero_spatial/0", t))]) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())["results"]
    user = results["splits"]["instruction"]["tasks"]["spatial/0"]
    assert user["episodes"] == 2 and sorted(user["by_instruction"]) == sorted(said)
    assert [r["episodes"] for r in user["by_instruction"].values()] == [1, 1]  # one environment each
    row = results["side_by_side"]["tasks"]["spatial/0"]
    assert row["instruction"] == user["success"]
    assert row["instruction_minus_fixed"] == round(100 * (row["instruction"] - row["fixed"]), 1)
    assert "instruction" not in results["side_by_side"]["suites"]["spatial"]  # no suite figure over named tasks
    assert all(f"'{t}'" in printed for t in said)
    bad = [(["libero_spatial/0", "put the {a} on the plate"], "a LIBERO instruction is a whole sentence"),
           (["libero_goal/1", "put the bowl on the stove"], "task libero_goal/1: not a task of the run's env.task=libero_spatial/0")]
    for instruction, error in bad:
        assert main(["--checkpoint", str(libero_run), "--json", str(tmp_path / "bad.json"), "--splits", "fixed",
                     "--instruction", *instruction]) == 2
        assert error in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()


def test_language_dev_plays_a_libero_runs_validation_paraphrases(libero_run, tmp_path, script):
    """bench_language_dev on a LIBERO run without --phrasings: each task's validation paraphrases (never trained on,
    in no test set) on validation episodes, where choosing a language setting is allowed."""
    out = tmp_path / "dev.json"
    assert script("bench_language_dev").main(["--checkpoint", str(libero_run), "--episodes", "2",
                                              "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["config"]["phrasings"] == {"libero_spatial/0": list(paraphrases("spatial/0", "validation"))}
    assert report["config"]["split"] == "validation" and report["results"]["tasks"]["libero_spatial/0"]["episodes"] == 2


def test_the_language_benchmark_plays_the_sentence_shapes_set_and_refuses_an_unknown_one(libero_run, tmp_path, script,
                                                                                          capsys):
    """--set structures: the task's paraphrases in sentence shapes no training, validation or test set has (the
    destination first, a request, the locator as a relative clause); an unknown set is refused naming the valid ones."""
    out = tmp_path / "dev.json"
    bench = script("bench_language_dev")
    assert bench.main(["--checkpoint", str(libero_run), "--set", "structures", "--episodes", "2",
                       "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    texts = report["config"]["phrasings"]["libero_spatial/0"]
    assert texts == list(paraphrases("spatial/0", "structures")) and report["config"]["set"] == "structures"
    assert any(" that is between " in t for t in texts) and any(t.startswith("could you ") for t in texts)
    assert report["results"]["tasks"]["libero_spatial/0"]["episodes"] == 2
    assert bench.main(["--checkpoint", str(libero_run), "--set", "heldout", "--episodes", "2"]) == 2
    assert "--set heldout is not a development phrasing set of libero_spatial/0; use one of validation, structures" in (
        capsys.readouterr().err)


def test_sft_draws_every_frame_a_training_instruction_of_its_task():
    """env.suite.instructions=paraphrase: SFT hands each frame its task's own instruction or one of its training
    paraphrases, uniformly (the demonstrations recorded the task's own)."""
    ensure_lan(["spatial/0"])
    groups = libero_training_groups("libero_spatial/0", "paraphrase")
    own = load_task("spatial/0").instruction
    assert groups == [(own, *paraphrases("spatial/0", "train"))]
    table = ["another task's instruction", *groups[0]]
    resample = ParaphraseResample(table, [*groups, ("another task's instruction",)])
    torch.manual_seed(0)
    drawn = resample(torch.full((4900,), table.index(own)))
    counts = torch.bincount(drawn, minlength=len(table))
    assert counts[0] == 0 and (counts[1:] > 50).all() and counts[1:].max() < 160  # 49 members, 100 each expected
    assert (resample(torch.zeros(5, dtype=torch.int64)) == 0).all()


def test_a_libero_sft_run_with_paraphrases_trains_on_them(libero_run, tmp_path):
    """The SFT stage of a LIBERO run with env.suite.instructions=paraphrase: its frames (recorded with the task's own
    instruction) reach the policy with the task's training instructions, several of them, nothing else."""
    from vla_rl.demos.collect import CollectConfig, collect_demos

    demos = tmp_path / "demos"
    collect_demos(CollectConfig(task="libero_spatial/0", episodes=2, num_envs=2, keep_failures=True, image_size=16,
                                cameras=("agentview", "robot0_eye_in_hand"), max_steps=3, out=demos), progress=False)
    cfg = load_config(CONFIG_DIR / "libero.yaml", [*TOY, "algo=sft", f"sft.dataset={demos}", "sft.iterations=1",
                                                   "sft.updates=2", "sft.batch_size=64", "env.suite.instructions=paraphrase",
                                                   f"out_dir={tmp_path}", "name=sft"])
    trainer = Trainer(cfg)
    try:
        frames = trainer.algorithm.collect(None, None, 0, None).batch
        texts = [trainer.collector.instructions[i] for i in frames["obs", "instruction"].tolist()]
        trainer.train()
    finally:
        trainer.close()
    allowed = {load_task("spatial/0").instruction, *paraphrases("spatial/0", "train")}
    assert set(texts) <= allowed and len(set(texts)) > 20

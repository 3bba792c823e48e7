"""scripts/eval.py end to end: splits, custom instructions, per-task and per-instruction figures with intervals."""

from __future__ import annotations

import json

import pytest

from sims import tasks as T
from vla_rl.config import CONFIG_DIR, load_config
from vla_rl.evaluate import wilson_interval
from vla_rl.trainer import Trainer


def _suite_run(out, name: str, *overrides: str):
    """One PPO iteration of the VLA on the six-task suite (what eval.py reads: a checkpoint and its config)."""
    cfg = load_config(CONFIG_DIR / "default.yaml", [
        f"out_dir={out}", f"name={name}", "env.task=suite", "total_env_steps=16", "env.num_envs=2",
        "ppo.rollout_steps=8", "ppo.optim.epochs=1", "ppo.optim.num_minibatches=1", "eval.every=0",
        "log.wandb=disabled", "log.progress=false", "log.video=false", *overrides,
    ])
    trainer = Trainer(cfg)
    trainer.train()
    trainer.close()
    return out / name


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    return _suite_run(tmp_path_factory.mktemp("runs"), "suite")


@pytest.fixture
def eval_main(script):
    return script("eval").main


def _run(main, args: list[str], tmp_path) -> dict:
    out = tmp_path / "eval.json"
    assert main([*args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_composition_split_reports_tasks_instructions_and_intervals(suite_run, tmp_path, eval_main):
    figures = _run(eval_main, ["--checkpoint", str(suite_run), "--split", "composition", "--episodes", "12",
                    "--num-envs", "6", "--seed", "5"], tmp_path)
    config, results = figures["config"], figures["results"]
    assert config["split"] == "composition" and config["seed"] == 5 and config["episodes"] == 12
    assert config["num_envs"] == 6 and figures["machine"]["cores"] >= 1
    allowed = set(T.instruction_table(T.TASK_NAMES, "composition"))
    assert results["instructions"] and set(results["instructions"]) <= allowed
    assert "drawer" not in results["tasks"]  # the drawer names no colour: it has no composition episodes
    assert sum(r["episodes"] for r in results["tasks"].values()) == results["episodes"] == 12
    for r in [results, *results["tasks"].values(), *results["instructions"].values()]:
        low, high = r["ci95"]
        assert 0.0 <= low <= r["success"] <= high <= 1.0


def test_custom_instruction_templates_are_filled_per_episode(suite_run, tmp_path, eval_main):
    templates = ["hover above the {a}", "find the {a}"]
    figures = _run(eval_main, ["--checkpoint", str(suite_run), "--task", "reach", "--episodes", "8", "--num-envs", "4",
                    *(x for t in templates for x in ("--instruction", t))], tmp_path)
    texts = figures["results"]["instructions"]
    assert figures["config"]["templates"] == templates and list(figures["results"]["tasks"]) == ["reach"]
    assert all(t.startswith(("hover above the ", "find the ")) for t in texts)
    assert {t.split(" the ")[0] for t in texts} == {"hover above", "find"}  # both templates were used
    colours = {t.rsplit(" ", 2)[-2] for t in texts}
    assert colours <= set(T.COLOUR_NAMES)  # filled with each episode's own coloured object


def test_bad_template_file_is_a_one_line_error(suite_run, tmp_path, capsys, eval_main):
    path = tmp_path / "templates.txt"
    path.write_text("# my templates\nput the {c} away\n")
    assert eval_main(["--checkpoint", str(suite_run), "--instructions-file", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "{a} and {b}" in err


def test_wilson_interval():
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-3) and high == pytest.approx(0.9433, abs=1e-3)
    assert wilson_interval(0, 0) == (0.0, 1.0) and wilson_interval(0, 50)[0] == 0.0


def test_language_dev_phrasings_are_outside_both_template_sets_and_run_on_validation(suite_run, tmp_path, script):
    import yaml

    main = script("bench_language_dev").main
    phrasings = yaml.safe_load(main.__globals__["DEFAULT_PHRASINGS"].read_text())
    assert set(phrasings) == set(T.TASK_NAMES)
    for task, templates in phrasings.items():
        assert not set(templates) & (set(T.TASKS[task].train) | set(T.TASKS[task].heldout)), task
        assert all(("{b}" in t) == bool(T.TASKS[task].b_choices) for t in templates), task
    small = tmp_path / "dev.yaml"
    small.write_text(yaml.safe_dump({"reach": ["head toward the {a}"], "press": ["tap the {a}", "hit it: {a}"]}))
    out = tmp_path / "dev.json"
    assert main(["--checkpoint", str(suite_run), "--phrasings", str(small), "--episodes", "6", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["config"]["split"] == "validation" and figures["results"]["episodes"] == 12
    assert set(figures["results"]["tasks"]) == {"reach", "press"}
    assert all(r["episodes"] == 6 for r in figures["results"]["tasks"].values())
    bad = tmp_path / "bad.yaml"
    bad.write_text("reach: []\n")
    assert main(["--checkpoint", str(suite_run), "--phrasings", str(bad)]) == 2


def test_sampled_actions_differ_from_the_mode_and_repeat_for_a_seed(suite_run, tmp_path, eval_main):
    args = ["--checkpoint", str(suite_run), "--task", "reach", "--episodes", "4", "--num-envs", "4", "--seed", "3"]
    mode = _run(eval_main, args, tmp_path)
    sampled = [_run(eval_main, [*args, "--sample"], tmp_path) for _ in range(2)]
    assert mode["config"]["actions"] == "mode" and sampled[0]["config"]["actions"] == "sampled"
    assert sampled[0]["results"]["return"] == sampled[1]["results"]["return"]  # seeded: the same draws
    assert sampled[0]["results"]["return"] != mode["results"]["return"]


def test_a_run_trained_on_one_task_by_its_weights_is_tested_on_every_task(tmp_path, eval_main):
    # The run's task weights sample reach alone in training; the test's train split draws the six tasks alike.
    run = _suite_run(tmp_path, "weighted", "env.suite.task_weights={reach: 1, push: 0, lift: 0, stack: 0, press: 0, drawer: 0}")
    figures = _run(eval_main, ["--checkpoint", str(run), "--split", "train", "--episodes", "24", "--num-envs", "6",
                               "--seed", "2"], tmp_path)
    assert len(figures["results"]["tasks"]) >= 4, figures["results"]["tasks"]

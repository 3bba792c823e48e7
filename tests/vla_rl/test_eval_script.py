"""scripts/eval.py end to end: splits, custom instructions, per-task and per-instruction figures with intervals."""

from __future__ import annotations

import json

import pytest

from sims import tasks as T
from vla_rl.config import CONFIG_DIR, load_config
from vla_rl.evaluate import wilson_interval
from vla_rl.trainer import Trainer


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    """One PPO iteration of the VLA on the six-task suite (what eval.py reads: a checkpoint and its config)."""
    out = tmp_path_factory.mktemp("runs")
    cfg = load_config(CONFIG_DIR / "default.yaml", [
        f"out_dir={out}", "name=suite", "env.task=suite", "total_env_steps=16", "env.num_envs=2",
        "ppo.rollout_steps=8", "ppo.optim.epochs=1", "ppo.optim.num_minibatches=1", "eval.every=0",
        "log.wandb=disabled", "log.progress=false", "log.video=false",
    ])
    trainer = Trainer(cfg)
    trainer.train()
    trainer.close()
    return out / "suite"


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

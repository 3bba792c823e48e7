"""scripts/sft_rl.py: demonstrations -> SFT -> RL -> test splits from one command, resumable."""

from __future__ import annotations

import json

import pytest

from sims import tasks as T
from vla_rl import recipe
from vla_rl.config import CONFIG_DIR, ConfigError
from vla_rl.demos.reader import read_tasks
from vla_rl.recipe import load_recipe
from vla_rl.recipe_table import per_task_table, summary

TINY = ["base=reach_state_ppo.yaml", "demos.episodes=60", "demos.num_envs=8", "sft.sft.iterations=10",
        "sft.sft.updates=20", "sft.eval.every=10", "rl.total_env_steps=3200", "rl.eval.every=2",
        "test.episodes=16", "test.num_envs=16", "sft.log.wandb=disabled", "rl.log.wandb=disabled",
        "sft.log.progress=false", "rl.log.progress=false"]


def test_recipe_runs_end_to_end_and_keeps_composition_out_of_training(tmp_path, script, monkeypatch):
    main = script("sft_rl").main
    out = tmp_path / "recipe.json"
    args = ["--config", str(CONFIG_DIR / "reach_sft_rl.yaml"), *TINY, f"out_dir={tmp_path}", "--json", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"machine", "config", "results", "checkpoints", "wall_s"}
    for stage in ("sft", "rl"):
        for split in ("train", "paraphrase", "composition"):
            figure = report["results"][stage][split]
            assert figure["episodes"] == 16 and 0.0 <= figure["ci95"][0] <= figure["success"] <= figure["ci95"][1]
        assert (tmp_path / "reach-sft-rl" / stage / "checkpoints" / "latest.pt").is_file()
    # The composition combinations reach neither the demonstrations nor RL's training environments.
    composition = set(T.instruction_table(("reach",), "composition"))
    demos = read_tasks(tmp_path / "reach-sft-rl" / "demos")
    assert demos and not composition & set(demos)
    rl_rows = (tmp_path / "reach-sft-rl" / "rl" / "metrics.csv").read_text().splitlines()
    assert "eval/composition/success" not in rl_rows[0]  # training never evaluated a test split
    # Relaunching continues (here: reuses) the finished stages and their tests, and reproduces the figures.
    tested = []
    evaluate = recipe._evaluate
    monkeypatch.setattr(recipe, "_evaluate", lambda run_dir, *a: tested.append(run_dir.name) or evaluate(run_dir, *a))
    again = tmp_path / "again.json"
    assert main([*args[:-1], str(again)]) == 0
    assert json.loads(again.read_text())["results"] == report["results"] and tested == []
    # Other test settings test both checkpoints again.
    assert main([*args[:-2], "test.episodes=32", "--json", str(again)]) == 0
    assert tested == ["sft", "rl"] and json.loads(again.read_text())["results"]["rl"]["train"]["episodes"] == 32
    # The report of two "seeds" (the same run twice): a row per task and one for all, SFT beside RL.
    table = per_task_table([report, report]).splitlines()
    assert [row.split(" | ")[0] for row in table[2:]] == ["| reach", "| **all**"]
    sft_paraphrase = 100 * report["results"]["sft"]["paraphrase"]["success"]
    assert table[-1].split(" | ")[3] == f"{sft_paraphrase:.1f} % (worst {sft_paraphrase:.1f} %)"
    stats = summary([report])
    gain = 100 * (report["results"]["rl"]["paraphrase"]["success"] - report["results"]["sft"]["paraphrase"]["success"])
    assert stats["rl_gain_paraphrase_pp"]["median"] == pytest.approx(gain) and stats["seeds"] == [0]


def test_recipe_config_errors_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match=r"test\.splits must not hold validation"):
        load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", ["test.splits=[validation]", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"recipe stage rl: .*ppo\.optim\.lr=-1"):
        load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", ["rl.ppo.optim.lr=-1", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"demos\.episodes=60 is more than demos\.per_task=5 x the 1 task\(s\) of reach"):
        load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", ["demos.per_task=5", "demos.episodes=60", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"demos\.per_task=0"):
        load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", ["demos.per_task=0", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"demos\.task_weights: task weights name \['push'\], not tasks of 'reach'"):
        load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", ["demos.task_weights.push=3", f"out_dir={tmp_path}"])
    # An override changes one task's weight and keeps the config's others (suite_sft_rl.yaml: push 2, stack 2).
    assert load_recipe(CONFIG_DIR / "suite_sft_rl.yaml", ["demos.task_weights.push=3"]).demos.task_weights == {
        "push": 3, "stack": 2}
    with pytest.raises(ConfigError, match=r"sft\.policy\.language='tokens' but rl\.policy\.language='sentence'"):
        load_recipe(CONFIG_DIR / "suite_sft_rl.yaml", ["rl.policy.language=sentence", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"sft\.policy\.head\.chunk=4 but rl\.policy\.head\.chunk=1"):
        load_recipe(CONFIG_DIR / "libero_spatial.yaml", ["rl.policy.head.chunk=1", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"sft\.token_dropout=0\.25 hides instruction tokens"):
        load_recipe(CONFIG_DIR / "suite_sft_rl.yaml", ["sft.policy.language=sentence", "rl.policy.language=sentence",
                                                       f"out_dir={tmp_path}"])
    recipe = load_recipe(CONFIG_DIR / "suite_sft_rl.yaml", [])
    assert recipe.sft["policy"]["language"] == recipe.rl["policy"]["language"] == "tokens"
    sentence = load_recipe(CONFIG_DIR / "suite_sft_rl.yaml", ["sft.policy.language=sentence", "sft.sft.token_dropout=0",
                                                             "rl.policy.language=sentence"])
    assert sentence.sft["policy"]["language"] == sentence.rl["policy"]["language"] == "sentence"
    with pytest.raises(ConfigError, match=r"policy\.language_tokens=2 must be in \[3, 512\]"):
        load_recipe(CONFIG_DIR / "suite_sft_rl.yaml", ["sft.policy.language_tokens=2", f"out_dir={tmp_path}"])
    assert not any(tmp_path.iterdir())


def test_a_preempted_stage_stops_the_recipe_and_the_same_command_continues(tmp_path, script, monkeypatch, capsys):
    from vla_rl.trainer import StopRequest

    def sigterm_at_once(self):
        self.signal = "SIGTERM"  # as if SIGTERM arrived during the first iteration
        return self

    out = tmp_path / "recipe.json"
    args = ["--config", str(CONFIG_DIR / "reach_sft_rl.yaml"), *TINY, f"out_dir={tmp_path}", "--json", str(out)]
    with monkeypatch.context() as patch:
        patch.setattr(StopRequest, "__enter__", sigterm_at_once)
        assert script("sft_rl").main(args) == 0
    assert "stage sft stopped by SIGTERM after iteration 1" in capsys.readouterr().out
    assert not out.exists() and not (tmp_path / "reach-sft-rl" / "rl").exists()
    assert script("sft_rl").main(args) == 0  # resumes the SFT stage, then runs RL and the tests
    assert json.loads(out.read_text())["results"]["rl"]["paraphrase"]["episodes"] == 16


def test_the_demonstrations_curve_runs_sft_alone_once_per_count(tmp_path, script):
    main = script("bench_sft_demos").main
    out, png = tmp_path / "curve.json", tmp_path / "curve.png"
    args = ["--config", str(CONFIG_DIR / "reach_sft_rl.yaml"), *TINY, f"out_dir={tmp_path}", "test.splits=[paraphrase]",
            "--episodes", "20", "40", "--json", str(out), "--png", str(png)]
    assert main(args) == 0
    points = json.loads(out.read_text())["results"]["points"]
    assert [p["episodes"] for p in points] == [20, 40] and png.stat().st_size > 0
    for n, point in zip((20, 40), points):
        root = tmp_path / f"reach-sft-rl-demos-{n}"
        assert len(read_tasks(root / "demos")) > 0 and (root / "sft" / "summary.json").is_file()
        assert not (root / "rl").exists() and set(point["results"]) == {"paraphrase", "train_wall_time_s"}
    info = [json.loads((tmp_path / f"reach-sft-rl-demos-{n}" / "demos" / "meta" / "info.json").read_text()) for n in (20, 40)]
    assert [i["total_episodes"] for i in info] == [20, 40]
    with pytest.raises(ConfigError, match=r"stages=\['rl'\]"):
        load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", ["stages=[rl]"])


def test_a_stage_seed_overrides_the_recipe_seed_for_that_stage_only():
    """``seed=S`` seeds the demonstrations and both stages; ``rl.seed=1`` reseeds RL alone (RL seeds from one SFT)."""
    both = recipe.stage_configs(load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", ["seed=3"]))
    assert (both["sft"].seed, both["rl"].seed) == (3, 3)
    own = recipe.stage_configs(load_recipe(CONFIG_DIR / "reach_sft_rl.yaml", ["seed=3", "rl.seed=1"]))
    assert (own["sft"].seed, own["rl"].seed) == (3, 1)


@pytest.mark.parametrize("name", ["suite_sft_rl.yaml", "reach_sft_rl.yaml", "libero_spatial.yaml", "libero_object.yaml",
                                  "libero_spatial_cpu.yaml"])
def test_every_shipped_recipe_loads(name):
    """``python scripts/sft_rl.py --config configs/NAME`` gets past its checks (an SFT-only recipe's RL stage, which
    never runs, need not match its SFT stage's policy)."""
    recipe = load_recipe(CONFIG_DIR / name, [])
    assert recipe.stages in (("sft", "rl"), ("sft",))

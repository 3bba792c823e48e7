"""The HalfCheetah benchmark's modes run at a tiny size and write finite figures; the documented commands parse."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_halfcheetah  # noqa: E402
from bench_report import write_report  # noqa: E402

DOCS = (ROOT / "docs" / "results.md", ROOT / "docs" / "training.md")
COMMAND = re.compile(r"python scripts/bench_halfcheetah\.py[^`\n#]*")


def _finite(figures: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        assert isinstance(figures[key], float) and math.isfinite(figures[key]), (key, figures)


def _has_sb3() -> bool:
    return importlib.util.find_spec("stable_baselines3") is not None


def _learner_param(name: str):
    """A learner for parametrize; SB3 (the optional bench extra) is skipped where it is not installed."""
    needs_sb3 = pytest.mark.skipif(not _has_sb3(), reason="Stable-Baselines3 (the bench extra) is not installed")
    return pytest.param(name, marks=[needs_sb3] if name == "sb3" else [])


def test_every_documented_command_parses_with_the_one_script():
    text = "\n".join(path.read_text() for path in DOCS)
    assert "python scripts/bench_ppo.py" not in text, "docs still run scripts/bench_ppo.py, now bench_halfcheetah.py"
    commands = COMMAND.findall(text)
    assert len(commands) >= 6, commands  # in-process, --commands, split, merge and the per-seed runs
    for cmd in commands:
        bench_halfcheetah.parse_args(shlex.split(cmd)[2:])


def test_flags_of_one_mode_are_refused_in_the_other(capsys):
    for argv, message in ((["--commands", "--envs", "4"], "--envs applies to in-process runs"),
                          (["--learners", "none"], "--learners none runs nothing"),
                          (["--envs", "3"], "must divide 2048")):
        with pytest.raises(SystemExit):
            bench_halfcheetah.parse_args(argv)
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("learner", [_learner_param("ours"), _learner_param("sb3")])
def test_in_process_learner_reports_finite_figures(tmp_path, learner):
    # 2 envs x 1024 steps: each env finishes one 1000-step episode, so the final return is a real one.
    out = tmp_path / "bench.json"
    argv = ["--learners", learner, "--steps", "2048", "--envs", "2", "--seeds", "0",
            "--out-dir", str(tmp_path), "--json", str(out)]
    assert bench_halfcheetah.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["config"]["mode"] == "in-process" and report["config"]["learners"] == [learner]
    run = report["results"][learner]["seed0"]
    assert run["env_steps"] == 2048
    phases = ("iteration_simulate_s", "iteration_infer_s", "iteration_update_s", "iteration_total_s")
    _finite(run, ("final_return", "wall_s", "steps_per_s", *(phases if learner == "ours" else ())))
    _finite(report["results"][learner], ("final_return_mean", "final_return_std", "wall_s_mean"))


def test_split_alone_times_each_phase(tmp_path):
    out = tmp_path / "split.json"
    argv = ["--learners", "none", "--split-iterations", "1", "--split-config", str(bench_halfcheetah.CONFIG),
            "--out-dir", str(tmp_path), "--json", str(out)]
    assert bench_halfcheetah.main(argv) == 0
    split = json.loads(out.read_text())["results"]["iteration_split"]
    _finite(split, ("simulate_s", "infer_s", "update_s", "total_s", "steps_per_s", "update_fraction"))
    assert split["env_steps_per_iteration"] == 2048 and 0 < split["update_fraction"] < 1


def _seed_report(path: Path, mode: str | None, learner: str, seed: int, ret: float, wall: float) -> Path:
    config = {"mode": mode} if mode else {}
    write_report(path, config, {learner: {f"seed{seed}": {"final_return": ret, "wall_s": wall}}})
    return path


def test_merge_combines_seeds_once_and_of_one_mode(tmp_path):
    reports = [_seed_report(tmp_path / "o0.json", "in-process", "ours", 0, 100.0, 10.0),
               _seed_report(tmp_path / "o1.json", "in-process", "ours", 1, 300.0, 30.0),
               _seed_report(tmp_path / "s0.json", "in-process", "sb3", 0, 50.0, 80.0)]
    out = tmp_path / "merged.json"
    assert bench_halfcheetah.main(["--merge", *map(str, reports), "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    ours = merged["results"]["ours"]
    assert (ours["final_return_mean"], ours["final_return_std"], ours["wall_s_mean"]) == (200.0, 100.0, 20.0)
    assert merged["results"]["wall_speedup_x_vs_sb3"] == 4.0
    assert merged["config"]["mode"] == "in-process" and len(merged["config"]["merged_from"]) == 3
    with pytest.raises(SystemExit, match="ours seed0 is already in an earlier report"):
        bench_halfcheetah.main(["--merge", str(reports[0]), str(reports[0])])
    commands = _seed_report(tmp_path / "c2.json", "commands", "ours", 2, 1.0, 1.0)
    with pytest.raises(SystemExit, match="different modes"):
        bench_halfcheetah.main(["--merge", str(reports[0]), str(commands)])


@pytest.mark.slow  # ~2 min on the shared 2 cores: the shipped train.py command (evaluation, video) and SB3's
def test_commands_run_the_shipped_jobs_pinned_to_cores(tmp_path):
    learners = "ours,sb3" if _has_sb3() else "ours"  # without the bench extra only SB3's command is left out
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
    out = tmp_path / "bench.json"
    # 8,192 steps = 4 iterations of 8 envs x 256: the 1000-step training episodes finish.
    argv = ["--commands", "--learners", learners, "--steps", "8192", "--seeds", "0", "--cores", cores,
            "--out-dir", str(tmp_path), "--json", str(out)]
    assert bench_halfcheetah.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["config"]["mode"] == "commands" and "train.py" in report["config"]["commands"]["ours"]
    ours = report["results"]["ours"]["seed0"]
    assert ours["env_steps"] == 8192 and ours["core"] in {int(c) for c in cores.split(",")}
    _finite(ours, ("wall_s", "final_return", "final_eval_return", "iteration_s", "eval_s", "eval_share",
                   "wall_over_iteration_x"))
    assert 0 < ours["eval_share"] < 1 and ours["wall_over_iteration_x"] > 1
    if "sb3" in report["results"]:
        _finite(report["results"]["sb3"]["seed0"], ("wall_s", "final_return", "train_s"))
        _finite(report["results"], ("wall_speedup_x_vs_sb3",))

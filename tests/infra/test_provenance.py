"""Every result JSON records what made it (issue 46, item 6): the commit and whether the tree was dirty,
the full config, the machine and the load at start and end; written by the benchmark writer and by a
run's ``summary.json``."""

import json
import subprocess
import sys
from pathlib import Path

from infra.common.provenance import ROOT, git_state
from infra.common.runlog import Curves, LogConfig, RunLog

sys.path.insert(0, str(ROOT / "scripts"))
from bench_report import BenchReport, write_report


def check_provenance(report: dict, config: dict) -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert report["git"]["commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    assert report["git"]["dirty"] in ((True, False) if head.returncode == 0 else (None,))
    assert report["config"] == config
    m = report["machine"]
    assert m["cores"] >= 1 and m["cpu_model"] and "gpu" in m and m["packages"]["numpy"]
    for key in ("load_average_at_start", "load_average_at_end"):
        assert len(m[key]) == 3 and all(x >= 0 for x in m[key]), key


def test_benchmark_writer_records_provenance(tmp_path):
    config = {"envs": 4, "task": "reach", "out": "runs/x"}
    write_report(tmp_path / "a.json", {**config, "out": Path("runs/x")}, {"steps_per_s": 1.0}, load_at_start=[0.5] * 3)
    report = json.loads((tmp_path / "a.json").read_text())
    check_provenance(report, config)
    assert report["machine"]["load_average_at_start"] == [0.5] * 3 and report["results"] == {"steps_per_s": 1.0}


def test_run_summary_records_provenance(tmp_path):
    config = {"seed": 3, "env": {"task": "reach", "num_envs": 8}}
    log = RunLog(tmp_path / "run", LogConfig(wandb="disabled", progress=False), 10, config, Curves("iteration", "it", ()))
    log.write_summary({"iterations": 2})
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"] == 2
    check_provenance(summary, config)


def test_dirty_is_a_tracked_change(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    state = git_state(tmp_path)
    assert len(state["commit"]) == 40 and state["dirty"] is False
    (tmp_path / "scratch.txt").write_text("untracked\n")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_state(tmp_path) == {"commit": state["commit"], "dirty": True}
    assert git_state(tmp_path / "scratch.txt") == {"commit": None, "dirty": None}  # not a checkout: unknown


def test_a_failed_part_keeps_the_others_and_any_value_prints(tmp_path, capsys):
    path = tmp_path / "b.json"
    report = BenchReport(path, {"n": 1})
    assert report.part("first", lambda: {"rate_per_s": 12345.678, "note": "warp refused 8 worlds", "sweep": {"a": 1}})
    assert not report.part("second", lambda: 1 / 0)
    assert report.part("third", lambda: {"ratio": 0.5})
    results = json.loads(path.read_text())["results"]
    assert results["rate_per_s"] == 12345.678 and results["note"] == "warp refused 8 worlds" and results["ratio"] == 0.5
    assert results["errors"] == {"second": "ZeroDivisionError: division by zero"} and report.failed
    out = capsys.readouterr().out
    assert "rate_per_s: 12,345.68" in out and "note: warp refused 8 worlds" in out and "sweep:\n  a: 1\n" in out


def test_write_report_defaults_to_the_load_when_the_script_started(tmp_path):
    import bench_report

    report = write_report(tmp_path / "c.json", {}, {})
    assert report["machine"]["load_average_at_start"] == bench_report.LOAD_AT_START

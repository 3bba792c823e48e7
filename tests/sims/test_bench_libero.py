"""scripts/bench_libero.py: the batch side's smoke run writes positive figures; LIBERO's robosuite side runs in
its own virtual environment (made once, reused while its requirements hold); the table in docs/sims.md equals
the committed JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import setup_libero_venv  # noqa: E402
from setup_libero_venv import clean_env, ensure_libero_venv  # noqa: E402

FIGURE = ROOT / "docs" / "figures" / "libero" / "bench_libero.json"
ROW_KEYS = {"env_steps_per_s", "frames_per_s", "cpu_ms_per_env_step"}


def _bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": "egl"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_libero.py"), "--smoke", "--json", str(out),
                           *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _positive(row: dict, keys: set[str]) -> None:
    for key in keys:
        assert isinstance(row[key], float) and row[key] > 0, (key, row)


def test_batch_smoke_writes_positive_figures(tmp_path):
    report = _bench(tmp_path, "--skip-robosuite")
    r = report["results"]
    assert r["task"] == "spatial/0" and r["controller"] == "osc"
    for setting in ("like", "lod"):
        rows = r[f"batch_{setting}"]
        assert [b["num_envs"] for b in rows] == [2] and rows[0]["controller"] == "osc"
        _positive(rows[0], ROW_KEYS | {"no_render_env_steps_per_s", "no_render_cpu_ms_per_env_step"})
        assert rows[0]["frames_per_s"] == pytest.approx(2 * rows[0]["env_steps_per_s"])
    # LIBERO's full meshes with 4x multisampling cost more per frame than the decimated ones without
    assert r["batch_like"][0]["cpu_ms_per_env_step"] > r["batch_lod"][0]["cpu_ms_per_env_step"]
    vd = r["visual_difference"]
    assert 0 < vd["mean_abs_agentview"] < 12 and 0 < vd["mean_abs_wrist"] < 12 and vd["states"] == 4
    assert len(r["load_before"]) == 3 and len(r["load_after"]) == 3 and "machine" in report
    assert "robosuite" not in r and r["comparisons"] == {"like": {}, "lod": {}}


def test_refuses_sizes_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_libero.py"), "--procs", "0",
                           "--skip-robosuite", "--json", str(tmp_path / "b.json")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and "--procs" in proc.stderr and not (tmp_path / "b.json").exists()


@pytest.mark.slow  # makes .venv-libero when absent (conftest); LIBERO's environment builds four times (two at once, one, one without cameras), then the batch side
def test_robosuite_side_and_ratios(tmp_path, libero_python):
    r = _bench(tmp_path, "--libero-python", str(libero_python), "--procs", "2", "--settings", "lod")["results"]
    _positive(r["robosuite"], ROW_KEYS)
    assert r["robosuite"]["versions"]["robosuite"] == "1.4.0" and r["robosuite"]["versions"]["mujoco"] == "2.3.7"
    assert r["robosuite_no_render"]["env_steps_per_s"] > 0 and r["robosuite_no_render"]["cameras"] == []
    par = r["robosuite_parallel"]
    assert par["procs"] == 2 and len(par["per_process_env_steps_per_s"]) == 2 and par["cpu_ms_per_env_step"] > 0
    assert par["env_steps_per_s"] == pytest.approx(sum(par["per_process_env_steps_per_s"]))
    lod, cmp = r["batch_lod"][0], r["comparisons"]["lod"]
    assert cmp["vs_parallel"]["speedup"]["2"] == pytest.approx(lod["env_steps_per_s"] / par["env_steps_per_s"])
    assert cmp["vs_one"]["speedup"]["2"] == pytest.approx(lod["env_steps_per_s"] / r["robosuite"]["env_steps_per_s"])
    assert cmp["vs_parallel"]["cpu_speedup"]["2"] == pytest.approx(par["cpu_ms_per_env_step"] / lod["cpu_ms_per_env_step"])
    assert cmp["no_render_vs_one"]["speedup"]["2"] > 0
    assert cmp["target_speedup"] == 15 and cmp["target_met"] == (cmp["best_speedup"] >= 15)
    assert "batch_like" not in r and "like" not in r["comparisons"]


def test_venv_made_once_and_remade_when_requirements_change(monkeypatch, tmp_path):
    calls: list[str] = []

    def run(cmd: list[str], what: str, timeout: float) -> None:
        calls.append(what.split()[0])
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[-1]) / "bin").mkdir(parents=True)

    requirements = tmp_path / "req.txt"
    requirements.write_text("robosuite==1.4.0\n")
    monkeypatch.setattr(setup_libero_venv, "_run", run)
    monkeypatch.setattr(setup_libero_venv, "REQUIREMENTS", requirements)
    venv = tmp_path / "venv"
    assert ensure_libero_venv(venv) == venv / "bin" / "python"
    assert calls == ["python", "pip", "importing"]
    ensure_libero_venv(venv)
    assert len(calls) == 3, "reused: nothing installed"
    requirements.write_text("robosuite==1.4.0\nmujoco==2.3.7\n")
    ensure_libero_venv(venv)
    assert calls[3:] == ["python", "pip", "importing"]


def test_venv_needs_python_311_or_older(monkeypatch):
    monkeypatch.delenv("LIBERO_VENV_PYTHON", raising=False)
    monkeypatch.setattr(setup_libero_venv.sys, "version_info", (3, 13, 0))
    monkeypatch.setattr(setup_libero_venv.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"Python 3.8-3.11 .*LIBERO_VENV_PYTHON="):
        setup_libero_venv.base_python()
    monkeypatch.setattr(setup_libero_venv.shutil, "which", lambda name: "/usr/bin/python3.11")
    assert setup_libero_venv.base_python() == "/usr/bin/python3.11"


def test_subprocess_env_drops_python_variables(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    assert "PYTHONPATH" not in clean_env() and "PATH" in clean_env()


def test_docs_table_equals_the_committed_json():
    """docs/sims.md's speed table shows docs/figures/libero/bench_libero.json's figures as printed."""
    r = json.loads(FIGURE.read_text())["results"]
    lines = (ROOT / "docs" / "sims.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| simulator | visuals | envs | env-steps/s |"))
    batch = [(s, b) for s in ("like", "lod") for b in r[f"batch_{s}"]]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[start + 2:start + 4 + len(batch)]]
    par, one, one0 = r["robosuite_parallel"], r["robosuite"], r["robosuite_no_render"]
    want = [["robosuite", "full, 4x MSAA", f"{par['procs']} processes", par["env_steps_per_s"], 1.0, "",
             par["cpu_ms_per_env_step"], 1.0, "", ""],
            ["robosuite", "full, 4x MSAA", "1 process", one["env_steps_per_s"], "", 1.0, one["cpu_ms_per_env_step"], "",
             one0["env_steps_per_s"], 1.0]]
    for setting, b in batch:
        n, cmp = str(b["num_envs"]), r["comparisons"][setting]
        want.append(["batch", "full, 4x MSAA" if setting == "like" else "level of detail", n, b["env_steps_per_s"],
                     cmp["vs_parallel"]["speedup"][n], cmp["vs_one"]["speedup"][n], b["cpu_ms_per_env_step"],
                     cmp["vs_parallel"]["cpu_speedup"][n], b["no_render_env_steps_per_s"],
                     cmp["no_render_vs_one"]["speedup"][n]])
    assert len(rows) == len(want)
    for row, expected in zip(rows, want):
        assert row[:3] == expected[:3]
        for shown, value in zip(row[3:], expected[3:]):
            if value == "":
                assert shown == "", (row, expected)
                continue
            digits = len(shown.partition(".")[2])
            assert abs(float(shown.replace(",", "")) - value) <= 0.5 * 10**-digits + 1e-9, (row, expected)
    for setting, target in (("like", 5), ("lod", 15)):
        cmp = r["comparisons"][setting]
        assert cmp["best_speedup"] == max(cmp["vs_parallel"]["speedup"].values())
        assert cmp["target_met"] == (cmp["best_speedup"] >= target)

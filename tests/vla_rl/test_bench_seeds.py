"""scripts/bench_seeds.py: the shipped command per seed, its test evaluation, the spread over seeds, and a
second call that reads the finished seeds back instead of training them again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ("total_env_steps=400", "env.num_envs=4", "ppo.rollout_steps=50", "eval.every=0", "eval.episodes=4",
        "log.wandb=disabled", "log.progress=false", "log.video=false")


def _bench(tmp_path: Path, *seeds: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, str(ROOT / "scripts/bench_seeds.py"), "--config", str(ROOT / "configs/reach_state_ppo.yaml"),
           *TINY, "--episodes", "8", "--out-dir", str(tmp_path / "runs"), "--json", str(tmp_path / "out.json"),
           "--plot", str(tmp_path / "seeds.png"), "--seeds", *seeds]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


def test_seeds_train_evaluate_and_read_back(tmp_path):
    done = _bench(tmp_path, "0", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out.json").read_text())
    rows, spread = report["results"]["seeds"], report["results"]["spread"]
    assert [row["seed"] for row in rows] == [0, 1] and all(row["paraphrase_episodes"] == 8 for row in rows)
    assert all("seed=" in row["command"] and "total_env_steps=400" in row["command"] for row in rows)
    successes = sorted(row["paraphrase_success"] for row in rows)
    assert spread["paraphrase_success"] == {"median": sum(successes) / 2, "min": successes[0],
                                            "max": successes[1], "n": 2}
    assert {"git", "machine", "config"} <= set(report) and (tmp_path / "seeds.png").stat().st_size > 0
    summary = tmp_path / "runs" / "seeds-s0" / "summary.json"
    before = summary.stat().st_mtime_ns
    again = _bench(tmp_path, "0")  # finished: read back, not trained again
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary.stat().st_mtime_ns == before
    assert json.loads((tmp_path / "out.json").read_text())["results"]["seeds"][0] == rows[0]


def test_a_missing_config_is_refused_before_anything_runs(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts/bench_seeds.py"), "--config", str(tmp_path / "no.yaml"),
                           "--out-dir", str(tmp_path / "runs")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "no such file" in done.stderr and not (tmp_path / "runs").exists()

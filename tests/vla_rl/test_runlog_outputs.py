"""What a user opens after a run: metrics.csv, curves.png, videos, summary.json and wandb's copy of the videos."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import imageio.v2 as iio
import pytest

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 3

# State PPO on reach with the camera on (the MLP ignores the frames; the videos come from them):
# three iterations of 4 envs x 25 steps (episodes of 50 end in the second), an evaluation after each,
# wandb offline.
STEPS = 4 * 25
SHORT = [
    f"total_env_steps={ITERATIONS * STEPS}", "env.num_envs=4", "ppo.rollout_steps=25", "env.frames.width=32",
    "env.frames.height=32", "eval.every=1", "eval.episodes=2", "eval.num_envs=2", "log.wandb=offline",
    "log.progress=false", "log.video_every=2", "checkpoint_every=100",
]
# The metrics.csv columns README.md promises: returns, success (train and held-out), losses, KL, timings.
COLUMNS = {
    "iteration", "env_steps", "wall_time", "episode_return", "episode_success", "eval/train/success",
    "eval/validation/success", "eval/return", "policy_loss", "value_loss", "approx_kl", "lr", "steps_per_s",
    "time/iteration", "time/simulate", "time/render", "time/infer", "time/update", "time/eval",
}
# The summary.json keys README.md promises (final evaluation, time-to-90%, env steps, wall time) and its split.
SUMMARY_KEYS = {
    "final_eval", "time_to_90pct_s", "steps_to_90pct", "env_steps", "wall_time_s", "iterations",
    "iteration_time_s", "eval_time_s", "eval_share",
}


def _train_script():
    spec = importlib.util.spec_from_file_location("train_script", ROOT / "scripts" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    argv = ["--config", str(ROOT / "configs" / "reach_state_ppo.yaml"), *SHORT, f"out_dir={out}", "name=outputs"]
    assert _train_script().main(argv) == 0
    return out / "outputs"


@pytest.fixture(scope="module")
def rows(run_dir) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_metrics_csv_has_one_row_per_iteration_with_the_promised_columns(rows):
    assert [int(float(r["iteration"])) for r in rows] == list(range(1, ITERATIONS + 1))
    missing = COLUMNS - set(rows[0])
    assert not missing, f"metrics.csv lacks {sorted(missing)}"
    for row in rows:
        assert float(row["time/eval"]) > 0 and float(row["time/iteration"]) > 0
        assert 0.0 <= float(row["eval/validation/success"]) <= 1.0


def test_curves_png_is_a_png_image(run_dir):
    data = (run_dir / "curves.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    image = iio.imread(run_dir / "curves.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_videos_at_the_first_every_kth_and_last_evaluation_readable(run_dir):
    names = sorted(p.name for p in (run_dir / "videos").glob("*.mp4"))
    # log.video_every=2: evaluations 1 and 3 (also the last); not 2.
    assert names == [f"iter_00000{i}_{s}.mp4" for i in (1, 3) for s in ("train", "validation")]
    for name in names:
        frames = iio.mimread(run_dir / "videos" / name)
        assert len(frames) > 1 and frames[0].shape[-1] == 3 and frames[0].std() > 0
    media = sorted((run_dir / "wandb").glob("*run-*/files/media/videos/video/*.mp4"))
    assert len(media) == len(names), f"wandb logged {len(media)} videos for {len(names)} mp4 files"


def test_summary_json_has_the_promised_keys_and_the_evaluation_share(run_dir, rows):
    summary = json.loads((run_dir / "summary.json").read_text())
    missing = SUMMARY_KEYS - set(summary)
    assert not missing, f"summary.json lacks {sorted(missing)}"
    assert summary["iterations"] == ITERATIONS and summary["env_steps"] == ITERATIONS * STEPS
    assert "eval/validation/success" in summary["final_eval"]
    eval_s = sum(float(r["time/eval"]) for r in rows)
    assert summary["eval_time_s"] == pytest.approx(eval_s)
    assert summary["eval_share"] == pytest.approx(eval_s / summary["wall_time_s"])
    assert 0 < summary["eval_share"] < 1
    assert summary["iteration_time_s"] + summary["eval_time_s"] <= summary["wall_time_s"]


def test_rendering_run_reports_render_time(rows):
    # sims counts its render seconds (env.timings["render"]); the rollout puts them in time/render.
    assert all(float(r["time/render"]) > 0 for r in rows)


def test_the_run_directory_has_the_one_layout_of_both_trainers(run_dir):
    # infra.common.runlog's layout (the LLM job writes the same, tests/infra/test_llm_safety.py), plus
    # this trainer's checkpoints/, its videos/ (it has frames) and wandb/.
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoints", "config.yaml", "curves.png", "metrics.csv", "summary.json", "videos", "wandb"]

"""The one run writer (infra.common.runlog.RunLog): its layout, CSV, curves and resume, for either trainer's curves."""

from pathlib import Path

import imageio.v2 as iio
import numpy as np

from infra.common.runlog import (
    Curves,
    LogConfig,
    Panel,
    RunLog,
    plot_runs,
    read_config,
    read_metrics,
    run_curve,
)

QUIET = LogConfig(wandb="disabled", progress=False, video=False)
ONE_PANEL = Curves(x="iteration", x_label="iteration", panels=(Panel("reward", (("reward", "reward"),)),))
TWO_PANELS = Curves(x="env_steps", x_label="environment steps", unit="step",
                    panels=(Panel("return", (("ret", "return"),)), Panel("success", (("eval/s", "s"),), fraction=True)))


def _rows(n: int) -> list[dict[str, float]]:
    # Columns appear late (eval/s from row 1 on), as the trainers' evaluation metrics do.
    return [{"iteration": i, "env_steps": 10.0 * i, "ret": -i, "reward": i / n} | ({"eval/s": 0.5} if i else {})
            for i in range(n)]


def test_a_run_writes_config_metrics_curves_and_summary_and_no_videos_without_frames(tmp_path: Path) -> None:
    config = {"name": "r", "grpo": {"lr": 1e-3, "cameras": ["front"]}, "stop": None}
    run = RunLog(tmp_path / "r", QUIET, 4, config, ONE_PANEL)
    assert read_config(tmp_path / "r") == config  # written when the run starts, before any row
    for row in _rows(4):
        run.log(row)
    run.plot()
    run.write_summary({"done": True})
    run.close()
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["config.yaml", "curves.png", "metrics.csv", "summary.json"]
    header = (tmp_path / "r" / "metrics.csv").read_text().splitlines()[0]
    assert header == "iteration,env_steps,ret,reward,eval/s"  # one writer: columns in order of appearance
    assert read_metrics(tmp_path / "r") == [{k: float(v) for k, v in r.items()} for r in _rows(4)]
    assert read_config(tmp_path / "missing") is None and read_metrics(tmp_path / "missing") == []


def test_one_plot_routine_draws_each_trainers_panels(tmp_path: Path) -> None:
    widths = {}
    for name, curves in (("llm", ONE_PANEL), ("vla", TWO_PANELS)):
        run = RunLog(tmp_path / name, QUIET, 40, {}, curves)
        for row in _rows(4):
            run.log(row)
        image = iio.imread(run.plot())
        run.close()
        assert image.ndim == 3 and image[..., :3].std() > 0
        widths[name] = image.shape[1]
    assert widths == {"llm": 550, "vla": 1100}  # 5.5 inches per panel at 100 dpi


def test_a_resumed_run_keeps_the_rows_before_its_resume_point(tmp_path: Path) -> None:
    run = RunLog(tmp_path / "r", QUIET, 5, {}, ONE_PANEL)
    for row in _rows(5):
        run.log(row)
    run.close()
    again = RunLog(tmp_path / "r", QUIET, 5, {}, ONE_PANEL)
    again.load_rows(up_to_iteration=2)
    assert [r["iteration"] for r in again.rows] == [0, 1, 2]
    again.log({"iteration": 3, "env_steps": 30.0, "reward": 0.9})
    again.close()
    assert [r["iteration"] for r in read_metrics(tmp_path / "r")] == [0, 1, 2, 3]


def test_videos_go_under_videos_only_when_there_are_frames(tmp_path: Path) -> None:
    cfg = LogConfig(wandb="disabled", progress=False, video=True, video_format="gif")
    run = RunLog(tmp_path / "r", cfg, 1, {}, ONE_PANEL)
    assert run.video([], "empty") is None and not (tmp_path / "r" / "videos").exists()
    frames = [np.full((16, 16, 3), 40 * i, dtype=np.uint8) for i in range(3)]
    path = run.video(frames, "clip")
    run.close()
    assert path == tmp_path / "r" / "videos" / "clip.gif" and len(iio.mimread(path)) == 3


def test_a_video_the_encoder_cannot_write_is_skipped_with_a_line_and_the_run_goes_on(tmp_path: Path, monkeypatch,
                                                                                      capsys) -> None:
    """mp4 forks ffmpeg: a loaded machine refused that fork to a large trainer (ENOMEM) and the run died at an
    evaluation; the video is skipped, nothing half-written is left, and the next one is written."""
    import errno

    cfg = LogConfig(wandb="disabled", progress=False, video=True, video_format="gif")
    run = RunLog(tmp_path / "r", cfg, 1, {}, ONE_PANEL)
    frames = [np.full((16, 16, 3), 40 * i, dtype=np.uint8) for i in range(3)]
    real = iio.mimwrite

    def refused(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(iio, "mimwrite", refused)
    assert run.video(frames, "eval") is None
    assert "video eval.gif not written" in capsys.readouterr().out
    assert list((tmp_path / "r" / "videos").iterdir()) == []
    monkeypatch.setattr(iio, "mimwrite", real)
    assert run.video(frames, "eval").is_file()
    run.close()


def test_runs_side_by_side_running_means_and_evaluations(tmp_path: Path, script) -> None:
    for name in ("a", "b"):
        run = RunLog(tmp_path / name, QUIET, 6, {}, TWO_PANELS)
        for row in _rows(6):
            run.log(row | ({"eval/v": 0.25} if row["iteration"] % 3 == 0 else {}))
        run.close()
    rows = read_metrics(tmp_path / "a")
    xs, ys, sparse = run_curve(rows, "ret", "env_steps", window=2)  # every row: a running mean
    assert not sparse and xs.tolist() == [0, 10, 20, 30, 40, 50] and ys.tolist() == [0, -0.5, -1.5, -2.5, -3.5, -4.5]
    xs, ys, sparse = run_curve(rows, "eval/v", "env_steps", window=2)  # two rows of six: drawn as they are
    assert sparse and xs.tolist() == [0, 30] and ys.tolist() == [0.25, 0.25]
    assert run_curve(rows, "missing", "env_steps")[0].size == 0
    png = plot_runs({"A": tmp_path / "a", "B": tmp_path / "b"}, ["ret", "eval/v"], ["env_steps", "iteration"], 2)
    assert iio.imread(png).shape[:2] == (720, 1100)  # two metrics x two axes
    out = tmp_path / "side.png"
    assert script("plot_runs").main([f"A={tmp_path / 'a'}", "--metrics", "ret", "--png", str(out)]) == 0
    assert iio.imread(out).shape[:2] == (360, 1100)

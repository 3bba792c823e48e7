"""scripts/render_libero.py: the README's LIBERO frames, from the suite's expert on a fixed initial state."""

from __future__ import annotations

import sys
from pathlib import Path

import imageio.v3 as iio
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import render_libero  # noqa: E402

from sims.libero.expert import SETTLE_STEPS  # noqa: E402
from sims.libero.toolchain.install import ensure_lan  # noqa: E402


@pytest.fixture(scope="module")
def cached() -> None:
    ensure_lan(["spatial/0"])


def test_frames_of_both_cameras_at_start_and_end_and_the_video(cached, tmp_path, capsys):
    png, mp4 = tmp_path / "frames.png", tmp_path / "episode.mp4"
    args = ["--task", "spatial/0", "--size", "32", "--max-steps", "3", "--out", str(png), "--video", str(mp4)]
    assert render_libero.main(args) == 0
    grid = iio.imread(png)
    assert grid.shape == (2 * 32, 2 * 32, 3)  # rows: agentview, wrist; columns: start, end
    assert grid[:32].std() > 5 and grid[32:].std() > 5  # both cameras drew the scene, not a blank
    video = iio.imread(mp4)
    assert video.shape[0] == 1 + SETTLE_STEPS + 3 and video.shape[2] == 2 * 32  # the start, LIBERO's wait, 3 steps
    out = capsys.readouterr().out
    assert "pick the akita black bowl" in out and "after 3 steps" in out


def test_bad_task_or_state_is_one_line(cached, tmp_path, capsys):
    assert render_libero.main(["--task", "spatial/12", "--out", str(tmp_path / "x.png")]) == 2
    assert "spatial/12" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        render_libero.main(["--task", "spatial/0", "--state", "50", "--out", str(tmp_path / "x.png")])
    assert "0-49" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())

"""A LIBERO task bundle (:mod:`sims.libero.toolchain.bundle`) unpacked into an empty folder is a cache that builds the
task like the original: the same physics and frames, nothing read from elsewhere or written there; a task
missing from the cache is a one-line error naming the setup command."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest

from sims.libero.scene import VISUAL_FACES, load_task
from sims.libero.sim import LiberoSim, libero_render_config
from sims.libero.suites import cache_dir
from sims.libero.toolchain import bundle
from sims.libero.toolchain.install import ensure_tasks
from sims.libero.toolchain.lod import lod_dir

TASK = "spatial/0"


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _trace(cache: Path) -> tuple[np.ndarray, np.ndarray]:
    """qpos [3, 2, nq] after each of 3 control steps and the 16x16 frames [2, 2, 3, 16, 16] after the last."""
    sim = LiberoSim(load_task(TASK, cache), 2, num_threads=1, render=libero_render_config(16, num_contexts=1))
    try:
        sim.reset(np.array([0, 1]))
        rng = np.random.default_rng(0)
        qpos = []
        for _ in range(3):
            ctrl = sim.current_ctrl()
            ctrl[:, sim.layout.arm_act] += rng.uniform(-0.05, 0.05, (2, 7))
            sim.step(ctrl)
            qpos.append(sim.qpos.copy())
        return np.stack(qpos), sim.render()
    finally:
        sim.close()


def test_unpacked_bundle_builds_the_task_like_the_cache(tmp_path):
    ensure_tasks([TASK])
    archive = tmp_path / "bundle.tar"
    summary = bundle.pack([TASK], archive)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "cache", filter="data")  # refuses absolute paths and ones that leave the folder
    unpacked = tmp_path / "cache"
    assert summary["files"] == len(names) and summary["tasks"] == [TASK] and summary["archive_bytes"] > summary["bytes"]
    lod = lod_dir(Path("."), VISUAL_FACES)
    assert {"spatial/0/model.xml", "spatial/0/task.json", "spatial/0/init_states.npz"} <= set(names)
    assert any(n.startswith(f"{lod}/") and n.endswith(".msh") for n in names)  # decimated copies
    assert any(n.startswith(f"{lod}/") and n.endswith(".full") for n in names)  # meshes within the budget
    assert not any(n.startswith(("toolchain/", "numba-cache/", "lod/faces-1000")) for n in names)
    before = _listing(unpacked)
    qpos, frames = _trace(unpacked)
    # Nothing made on the way: a missing LOD copy or marker would be decimated or counted again here.
    assert _listing(unpacked) == before
    want_qpos, want_frames = _trace(cache_dir())
    assert np.array_equal(qpos, want_qpos) and np.array_equal(frames, want_frames)
    assert frames.std() > 0  # a drawn scene, not a blank frame


def test_missing_task_names_the_setup_command(tmp_path, capsys):
    empty = tmp_path / "empty"
    with pytest.raises(FileNotFoundError) as err:
        bundle.pack(["spatial/0", "object/3"], tmp_path / "b.tar", cache=empty)
    message = str(err.value)
    assert "\n" not in message and str(empty) in message
    assert message.endswith("run python scripts/setup_libero.py --tasks spatial/0 object/3")
    assert not (tmp_path / "b.tar").exists()
    with pytest.raises(ValueError, match="unknown LIBERO suite 'kitchen'"):
        bundle.bundle_files(["kitchen/0"], cache=empty)


def test_command_line_reports_a_missing_task_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VLA_RL_LIBERO_CACHE", str(tmp_path))
    assert bundle.main([str(tmp_path / "b.tar.xz"), "goal/2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tasks goal/2" in err and err.startswith("sims.libero.toolchain.bundle: ")

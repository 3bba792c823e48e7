"""Starts from LIBERO's own placement rules (sims.libero.regions): they differ from every fixed state, the
fixtures move between them, the arm starts with the fixed states' noise, the same seed gives the same start in
another process with other hash seeds and thread counts, and an env with ``starts=regions`` stands its fixtures
where each start put them. The train and
validation splits draw from disjoint starts, the fixed-state splits from none (tests/vla_rl/test_libero_recipe.py:
the demonstrations come from the train split's, in the env the recipe trains in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sims
from sims.libero.regions import FILE, load_region_starts, split_pool
from sims.libero.scene import load_task
from sims.libero.sim import libero_render_config
from sims.libero.suites import cache_dir
from sims.libero.toolchain.install import ensure_toolchain
from sims.libero.toolchain.region_starts import ensure_region_starts

TASK = "spatial/6"  # the bowl beside the cookie box: a cabinet and a stove, both fixtures placed in regions
COUNT = 5  # the fifth is the validation split's


@pytest.fixture(scope="module")
def starts():
    ensure_region_starts([TASK], COUNT)
    return load_region_starts(TASK)


def test_region_starts_differ_from_every_fixed_state_and_move_the_fixtures(starts):
    fixed = load_task(TASK).init_states
    assert starts.states.shape[1] == fixed.shape[1] and starts.count >= COUNT
    arm, fingers = slice(1, 8), slice(8, 10)  # after the time: LIBERO's reset puts the robot at its initial posture
    objects = np.ones(fixed.shape[1], bool)  # plus robosuite's arm noise (std 0.02 rad a joint), as in the fixed states
    objects[:fingers.stop] = False
    posture = fixed[:, arm].mean(0)
    for states in (fixed, starts.states):
        assert 0.01 < (states[:, arm] - posture).std() < 0.03
        assert np.ptp(states[:, fingers], axis=0).max() == 0.0
    gap = np.abs(starts.states[:, None, objects] - fixed[None, :, objects]).max(-1)  # [K, 50]
    assert gap.min() > 1e-3  # no start is a fixed state
    assert set(starts.fixtures) == {"flat_stove_1_main", "wooden_cabinet_1_main"}
    moved = np.abs(starts.fixture_pos[1:] - starts.fixture_pos[:1]).max()
    assert 1e-3 < moved < 0.2  # re-sampled per start, within their regions
    assert len({tuple(s[objects].round(6)) for s in starts.states}) == starts.count  # one start per seed


def test_a_seed_gives_the_same_start_in_another_process(starts, tmp_path):
    """Another process with another hash seed and thread count writes the same first two starts."""
    root = cache_dir()
    (tmp_path / "spatial").mkdir()
    (tmp_path / TASK).mkdir()
    for f in (root / TASK).iterdir():
        if f.name != FILE:
            os.symlink(f, tmp_path / TASK / f.name)
    site = ensure_toolchain(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.getcwd()]), "PYTHONHASHSEED": "12345",
           "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "NUMBA_CACHE_DIR": str(root / "numba-cache")}
    proc = subprocess.run([sys.executable, "-m", "sims.libero.toolchain.region_starts", "--cache", str(tmp_path), "--count", "2", TASK],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = load_region_starts(TASK, tmp_path)
    np.testing.assert_array_equal(again.states, starts.states[:2])
    np.testing.assert_array_equal(again.fixture_pos, starts.fixture_pos[:2])
    np.testing.assert_array_equal(again.fixture_quat, starts.fixture_quat[:2])


def test_env_with_region_starts_places_the_fixtures_and_resumes(starts):
    render = libero_render_config(16, num_contexts=1)
    env = sims.make_vec_env(f"libero_{TASK}", 2, split="train", starts="regions", num_threads=1, render=render)
    env.reset_arrays(seed=3)
    sim = env.sims[0]
    index = env.state_index
    bodies = [sim.model.body(name).id for name in starts.fixtures]
    placed = sim.backend.batch.expanded("body_pos")[:, bodies]
    np.testing.assert_array_equal(placed, starts.fixture_pos[index])
    for i in range(2):  # the bodies stand there in the physics too
        np.testing.assert_allclose(sim.field("xpos")[i, bodies], starts.fixture_pos[index[i]], atol=1e-9)
    snapshot = env.get_state()
    actions = np.random.default_rng(0).uniform(-1, 1, (3, 2, 7)).astype(np.float32)
    straight = [env.step_arrays(a)["observation"] for a in actions]
    fresh = sims.make_vec_env(f"libero_{TASK}", 2, split="train", starts="regions", num_threads=1, render=render)
    fresh.reset_arrays(seed=99)
    fresh.set_state(snapshot)
    resumed = [fresh.step_arrays(a)["observation"] for a in actions]
    for a, b in zip(straight, resumed):
        for key in ("proprio", "state", "rgb"):
            np.testing.assert_array_equal(a[key], b[key])
    env.close()
    fresh.close()


def test_train_and_validation_draw_disjoint_starts_and_the_fixed_splits_none(starts):
    train, validation = split_pool(starts.count, "train"), split_pool(starts.count, "validation")
    assert len(train) and len(validation) and not set(train) & set(validation)
    assert set(train) | set(validation) == set(range(starts.count))
    render = libero_render_config(16, num_contexts=1)
    env = sims.make_vec_env(f"libero_{TASK}", 3, split="validation", starts="regions", num_threads=1, render=render)
    seen = set()
    for seed in range(4):
        env.reset_arrays(seed=seed)
        seen |= set(env.state_index.tolist())
    env.close()
    assert seen <= set(validation)
    for split in ("fixed", "lan", "paraphrase"):
        with pytest.raises(ValueError, match=rf"split='{split}' does not start from region-sampled starts"):
            split_pool(starts.count, split)
    with pytest.raises(ValueError, match=r"4 region-sampled starts leave the validation split none"):
        split_pool(4, "validation")



def test_bench_experts_runs_from_region_starts_and_names_the_command_for_missing_ones(starts, tmp_path):
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "experts.json"
    cmd = [sys.executable, str(root / "scripts" / "bench_experts.py"), "--suite", "libero_spatial", "--tasks", "6",
           "--starts", "regions", "--states", "2", "--threads", "1", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["config"]["starts"] == "regions"
    result = report["results"][TASK]
    assert result["episodes"] == 2 and result["success"] == 1.0, result  # the expert places the bowl from both
    missing = subprocess.run(cmd[:-2], capture_output=True, text=True, cwd=root, timeout=120,
                             env={**env, "VLA_RL_LIBERO_CACHE": str(tmp_path)})
    assert missing.returncode != 0
    assert f"--tasks {TASK} --region-starts 200" in missing.stderr and str(tmp_path / TASK / FILE) in missing.stderr

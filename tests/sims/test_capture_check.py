"""The comparison of captured and eager Warp steps: on Warp's CPU device both paths are eager and
agree exactly, and the check sees a step path that computes otherwise."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("mujoco_warp")

import sims
from sims.capture_check import compare_captured_and_eager
from sims.render import RenderConfig


@pytest.fixture(scope="module")
def env():
    env = sims.make_vec_env("suite", 3, seed=0, backend="warp", warp_device="cpu",
                            render=RenderConfig(width=32, height=32))
    env.reset_arrays(seed=0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        env.step_arrays(torch.rand(3, 4, generator=gen) * 2 - 1)
    yield env
    env.close()


def test_the_same_code_path_matches_and_the_state_is_restored(env):
    backend = env._backend
    ctrl = env._control(torch.full((3, 4), 0.7))
    before = backend.qpos.clone()
    out = compare_captured_and_eager(backend, ctrl)
    assert out["captured"] == {"step": False, "render": False}  # no CUDA graphs on the CPU device
    assert out["match"] and out["qpos_max_abs_diff"] == out["qvel_max_abs_diff"] == out["pixel_max_abs_diff"] == 0.0
    assert torch.equal(backend.qpos, before)


def test_a_step_path_that_differs_from_eager_launches_is_caught(env, monkeypatch):
    backend = env._backend
    ctrl = env._control(torch.full((3, 4), 0.7))
    real_step = backend.step
    monkeypatch.setattr(backend, "step", lambda c: real_step(c * 0.0))  # as a graph replaying stale controls would
    out = compare_captured_and_eager(backend, ctrl)
    assert not out["match"] and out["qpos_max_abs_diff"] > 1e-3, out

"""LIBERO's step on the batch backend: one render per world per step (the ended episodes' last frames kept
unless ``final_frames`` is off), and the host's episode flags (``host_done``) without reading success back
unless it ends episodes: on the warp backend that read is a device sync per control step.

One task (spatial/0), two environments, 16x16 frames with one GL context.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sims
import sims.vec_env as base_vec_env
from sims.libero.sim import libero_render_config
from sims.libero.toolchain.install import ensure_tasks
from sims.libero.toolchain.region_starts import ensure_region_starts
from sims.libero.vec_env import LiberoVectorEnv

RENDER = libero_render_config(16, num_contexts=1)
MOVE = np.array([[0.5, 0, 0, 0, 0, 0, -1], [0, 0.5, 0, 0, 0, 0, -1]], np.float32)


@pytest.fixture(scope="module")
def cached() -> None:
    ensure_tasks(["spatial/0"])
    ensure_region_starts(["spatial/0"], 5)  # the train and validation splits' starts


def _env(**kw: Any) -> LiberoVectorEnv:
    env = sims.make_vec_env("libero_spatial/0", 2, num_threads=1, **kw)
    env.reset_arrays(seed=0)
    return env


def _worlds_drawn(env: LiberoVectorEnv) -> list[int]:
    calls: list[int] = []
    renderer = env.sims[0].renderer
    egl_render = renderer.render

    def render(qpos: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(qpos))
        return egl_render(qpos, *args, **kwargs)
    renderer.render = render
    return calls


def test_a_libero_step_renders_each_world_once_and_keeps_the_last_frames(cached):
    ending, going_on = _env(render=RENDER, max_steps=2), _env(render=RENDER, max_steps=3)
    drawn = _worlds_drawn(ending)
    try:
        for env in (ending, going_on):
            env.step_arrays(MOVE)
        assert drawn == [2]
        drawn.clear()
        out, reference = ending.step_arrays(MOVE), going_on.step_arrays(MOVE)["observation"]
        assert out["truncated"].all() and drawn == [2, 2]  # the last frames, then the new episodes' first
        # The same episodes, one ending at its step limit: its final observation is the other's observation.
        for key, value in reference.items():
            np.testing.assert_array_equal(out["final_observation"][key], value, err_msg=key)
        assert not np.array_equal(out["observation"]["rgb"], reference["rgb"])

        ending.final_frames = False
        drawn.clear()
        for _ in range(2):
            out = ending.step_arrays(MOVE)
        assert out["truncated"].all() and drawn == [2, 2]  # one render per step, resets or not
        assert "rgb" not in out["final_observation"] and "rgb" in out["observation"]
    finally:
        ending.close()
        going_on.close()


@pytest.mark.parametrize("terminate", [False, True])
def test_libero_reads_success_back_only_when_it_ends_episodes(cached, monkeypatch, terminate):
    env = _env(max_steps=2, terminate_on_success=terminate)
    reads: list[Any] = []
    to_numpy = base_vec_env.to_numpy
    monkeypatch.setattr(base_vec_env, "to_numpy", lambda x: reads.append(x) or to_numpy(x))
    for _ in range(4):
        out = env.step_arrays(MOVE)
        assert [f.tolist() for f in env.host_done] == [out["terminated"].tolist(), out["truncated"].tolist()]
    assert out["truncated"].all()  # the step limit comes from the host's own count
    assert len(reads) == (4 if terminate else 0)
    # GRPO's first episodes: nothing restarts, so success is never read back, and an ended episode steps on.
    env.reset_arrays()
    reads.clear()
    episodes = env._episode.copy()
    with env.first_episodes():
        for _ in range(4):
            out = env.step_arrays(MOVE)
            assert env.host_done is None
    assert out["truncated"].all() and env._steps.tolist() == [4, 4] and env._episode.tolist() == episodes.tolist()
    assert reads == [] and env.restarts
    env.close()

"""A step renders each world once: the frames are drawn after the resets, once for every world; the final
observation of an episode that ended keeps its last frames (drawn for the ended worlds alone where the
renderer can draw a subset, the batch backend's EGL) unless ``final_frames`` is off, and then holds no
frame keys. Frames and observations equal those of the step as it was before (every world drawn before the
resets, the restarted ones again after), on the batch backend and on Warp's CPU device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sims.backends import to_numpy
from sims.render import RenderConfig
from sims.vec_env import ACTION_DIM, SimVectorEnv, make_vec_env

N = 4
RENDER = RenderConfig(width=32, height=32, cameras=("front", "wrist"), depth=True, num_contexts=1)
BACKENDS = ["batch", pytest.param("warp", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("mujoco_warp") is None, reason="mujoco_warp not installed"))]


def _env(backend: str) -> SimVectorEnv:
    kw = {"warp_device": "cpu"} if backend == "warp" else {"num_threads": 1}
    env = make_vec_env("suite", N, seed=3, render=RENDER, backend=backend, terminate_on_success=False, **kw)
    env.reset_arrays(seed=3)
    return env


def _worlds_drawn(env: SimVectorEnv) -> list[int]:
    """The renderer's calls from now on, as the number of worlds each drew (the device renderer: all of them)."""
    calls: list[int] = []
    if env._backend.renders:
        device_render = env._backend.render

        def render(*args: Any, **kwargs: Any) -> Any:
            calls.append(env.num_envs)
            return device_render(*args, **kwargs)
        env._backend.render = render
    else:
        egl_render = env._renderer.render

        def render(qpos: np.ndarray, *args: Any, **kwargs: Any) -> Any:
            calls.append(len(qpos))
            return egl_render(qpos, *args, **kwargs)
        env._renderer.render = render
    return calls


def _old_step(env: SimVectorEnv, action: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The step before one render per step (episodes end at the step limit here): the observation and final
    observation with every world drawn before the resets and the restarted ones again after them."""
    env._backend.step(env._control(env._check_action(action)))
    env._steps += 1
    final = {k: to_numpy(v).copy() for k, v in env._observe()[0].items()}
    ids = np.flatnonzero(env._steps >= env._max_steps[env._task])
    env._start_episodes(ids)
    obs = {k: v.copy() for k, v in final.items()}
    for key, value in env._observe(ids)[0].items():
        obs[key][ids] = to_numpy(value)
    return obs, final


def _end_at_next_step(env: SimVectorEnv, ids: list[int]) -> None:
    env._steps[ids] = env._max_steps[env._task[ids]] - 1


def _assert_equal(got: dict[str, Any], want: dict[str, np.ndarray], what: str) -> None:
    assert set(got) == set(want), what
    for key, value in want.items():
        np.testing.assert_array_equal(to_numpy(got[key]), value, err_msg=f"{what}: {key}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_with_resets_renders_each_world_once_and_keeps_the_frames(backend: str) -> None:
    new, old = _env(backend), _env(backend)
    actions = np.random.default_rng(0).uniform(-1, 1, (3, N, ACTION_DIM)).astype(np.float32)
    drawn = _worlds_drawn(new)
    try:
        out = new.step_arrays(actions[0])  # nothing ends: one render of every world
        _assert_equal(out["observation"], _old_step(old, actions[0])[0], "a step without resets")
        assert out["final_observation"] is out["observation"] and drawn == [N]

        for env in (new, old):
            _end_at_next_step(env, [1, 2])
        drawn.clear()
        out = new.step_arrays(actions[1])  # final frames kept (the default)
        obs, final = _old_step(old, actions[1])
        assert out["truncated"].tolist() == [False, True, True, False]
        _assert_equal(out["observation"], obs, "observation")
        _assert_equal(out["final_observation"], final, "final observation, frames kept")
        assert not np.array_equal(final["rgb"][1], obs["rgb"][1])  # a reset world's last frame is not its first
        # The ended worlds' last frames, then every world once; the device renderer draws all worlds each time.
        assert drawn == ([N, N] if backend == "warp" else [2, N])

        new.final_frames = False  # what a critic that reads no pixels asks for
        for env in (new, old):
            _end_at_next_step(env, [0, 2])
        drawn.clear()
        out = new.step_arrays(actions[2])
        obs, final = _old_step(old, actions[2])
        assert drawn == [N]
        _assert_equal(out["observation"], obs, "observation")
        assert not set(SimVectorEnv.FRAME_KEYS) & set(out["final_observation"])  # not rendered, so absent
        _assert_equal(out["final_observation"], {k: v for k, v in final.items() if k not in SimVectorEnv.FRAME_KEYS},
                      "final observation without frames")
        drawn.clear()
        out = new.step_arrays(actions[0])  # nothing ends: the final observation still holds no frames
        _assert_equal(out["observation"], _old_step(old, actions[0])[0], "a step without resets")
        assert drawn == [N] and not set(SimVectorEnv.FRAME_KEYS) & set(out["final_observation"])
    finally:
        new.close()
        old.close()

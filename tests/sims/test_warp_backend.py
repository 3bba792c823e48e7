"""Warp backend on Warp's CPU device: agrees with ``batch``, solves the tasks as often, renders the
same frames, is deterministic, refuses bad actions, snapshots exactly, hands torch its arrays.

mujoco_warp compiles its kernels once per machine (about a minute on 2 cores, cached by Warp under
``~/.cache/warp`` or ``$WARP_CACHE_PATH``; a few seconds to load after that); every test here
shares the one compile of the process.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco_warp")

import sims
from sims.backends import to_numpy
from sims.experts import run_expert
from sims.render import RenderConfig
from sims.vec_env import ACTION_DIM, make_vec_env

NUM_ENVS, STEPS = 8, 10
# Tolerances over 10 control steps (40 substeps) of the suite, float32 (Warp) against float64
# (MuJoCo C): measured 1.2e-7 for proprio (velocities included) and 3e-8 m for the state.
STATE_TOL = 1e-3
PROPRIO_TOL = 1e-3
REWARD_TOL = 1e-3
FRAME_MAD_TOL = 12.0  # mean absolute difference to EGL, levels of 255 (measured 4.4 front, 4.3 wrist)
RENDER = RenderConfig(width=64, height=64, cameras=("front", "wrist"), depth=True, num_contexts=1)


def _warp(task: str, n: int, **kwargs):
    return make_vec_env(task, n, backend="warp", warp_device="cpu", **kwargs)


def _trace(env, actions: np.ndarray) -> list[dict[str, np.ndarray]]:
    out = [{k: to_numpy(v) for k, v in env.reset_arrays().items()}]
    for a in actions:
        step = env.step_arrays(a)
        out.append({**{k: to_numpy(v) for k, v in step["observation"].items()}, "reward": to_numpy(step["reward"])})
    # One more step at the episodes' step limits: every environment truncates and autoresets.
    env._steps[:] = env._max_steps[env._task] - 1
    last = env.step_arrays(actions[0])
    out.append({**{k: to_numpy(v) for k, v in last["observation"].items()}, "truncated": to_numpy(last["truncated"])})
    return out


@pytest.fixture(scope="module")
def runs() -> dict[str, list[dict[str, np.ndarray]]]:
    actions = np.random.default_rng(0).uniform(-1, 1, (STEPS, NUM_ENVS, ACTION_DIM)).astype(np.float32)
    batch = make_vec_env("suite", NUM_ENVS, seed=9, num_threads=1, render=RENDER)
    warp = _warp("suite", NUM_ENVS, seed=9, render=RENDER)
    out = {"batch": _trace(batch, actions), "warp": _trace(warp, actions)}
    batch.close()
    return out


def test_warp_agrees_with_batch_over_ten_steps(runs) -> None:
    for t, (ref, got) in enumerate(zip(runs["batch"][:-1], runs["warp"][:-1])):
        for key in ("instruction", "task"):
            np.testing.assert_array_equal(got[key], ref[key], err_msg=f"{key}, step {t}")
        np.testing.assert_allclose(got["state"], ref["state"], atol=STATE_TOL, err_msg=f"state, step {t}")
        np.testing.assert_allclose(got["proprio"], ref["proprio"], atol=PROPRIO_TOL, err_msg=f"proprio, step {t}")
        np.testing.assert_allclose(got["goal_pixel"], ref["goal_pixel"], atol=1e-3, err_msg=f"goal_pixel, step {t}")
        if t:
            np.testing.assert_allclose(got["reward"], ref["reward"], atol=REWARD_TOL, err_msg=f"reward, step {t}")


def test_warp_autoresets_like_batch(runs) -> None:
    ref, got = runs["batch"][-1], runs["warp"][-1]
    assert ref["truncated"].all() and got["truncated"].all()
    for key in ("instruction", "task"):
        np.testing.assert_array_equal(got[key], ref[key])
    np.testing.assert_allclose(got["state"], ref["state"], atol=1e-6)


def test_warp_frames_match_egl(runs) -> None:
    for t, (ref, got) in enumerate(zip(runs["batch"], runs["warp"])):
        assert got["rgb"].shape == ref["rgb"].shape == (NUM_ENVS, 2, 3, 64, 64) and got["rgb"].dtype == np.uint8
        mad = np.abs(got["rgb"].astype(np.int16) - ref["rgb"]).mean(axis=(0, 2, 3, 4))
        assert (mad <= FRAME_MAD_TOL).all(), f"step {t}: mean absolute difference per camera {mad}"
        # Camera-axis depth in metres, like EGL's, away from silhouette edges.
        assert np.median(np.abs(got["depth"] - ref["depth"])) < 1e-3


def test_warp_is_deterministic_for_a_seed() -> None:
    actions = np.random.default_rng(1).uniform(-1, 1, (12, 4, ACTION_DIM)).astype(np.float32)
    a, b = (_trace(_warp("suite", 4, seed=5), actions) for _ in range(2))
    for x, y in zip(a, b):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    other = to_numpy(_warp("suite", 4, seed=6).reset_arrays()["state"])
    assert not np.array_equal(other, a[0]["state"])


def test_warp_refuses_bad_actions_and_leaves_every_env_untouched() -> None:
    env = _warp("push", 3, seed=1)
    env.reset_td()
    env.step_td(torch.zeros(3, ACTION_DIM))
    qpos, steps = env._backend.qpos.clone(), env._steps.copy()
    with pytest.raises(ValueError, match=r"expected \(3, 4\)"):
        env.step_td(torch.zeros(3, 3))
    bad = torch.zeros(3, ACTION_DIM)
    bad[1, 2] = torch.nan
    with pytest.raises(ValueError, match=r"NaN or inf for environments \[1\]"):
        env.step_td(bad)
    bad[1, 2] = torch.inf
    with pytest.raises(ValueError, match="NaN or inf"):
        env.step(bad.numpy())  # the gymnasium path, numpy in
    assert torch.equal(env._backend.qpos, qpos)
    np.testing.assert_array_equal(env._steps, steps)


def test_warp_tensordict_view_stays_on_the_device_without_copies() -> None:
    env = _warp("suite", 4, seed=2, render=RenderConfig(width=32, height=32))
    td = env.reset_td(seed=2)
    out = env.step_td(torch.zeros(4, ACTION_DIM))
    assert env.device == torch.device("cpu") and out.device == env.device
    obs = out["observation"]
    assert obs["rgb"].dtype == torch.uint8 and obs["rgb"].shape == (4, 1, 3, 32, 32)
    assert obs["proprio"].dtype == torch.float32 and obs["state"].shape == (4, sims.tasks.STATE_DIM)
    assert out["reward"].dtype == torch.float32 and out["success"].dtype == torch.bool
    assert td["instruction"].dtype == torch.int64
    # The backend's state tensors are the Warp arrays themselves.
    backend = env._backend
    assert backend.qpos.data_ptr() == backend.d.qpos.ptr and backend.mocap_pos.data_ptr() == backend.d.mocap_pos.ptr


def test_warp_snapshot_continues_bit_for_bit() -> None:
    env = _warp("suite", 4, seed=3, render=RenderConfig(width=32, height=32))
    env.reset_arrays(seed=3)
    actions = np.random.default_rng(2).uniform(-1, 1, (40, 4, ACTION_DIM)).astype(np.float32)
    actions[:, :2] *= 0.05  # some trees fall asleep
    for a in actions[:25]:
        env.step_arrays(a)
    snapshot = env.get_state()
    expected = [env.step_arrays(a)["observation"] for a in actions[25:]]
    restored = _warp("suite", 4, seed=3, render=RenderConfig(width=32, height=32))
    restored.set_state(snapshot)
    for a, want in zip(actions[25:], expected):
        have = restored.step_arrays(a)["observation"]
        for key in want:
            assert torch.equal(want[key], have[key]), key
    with pytest.raises(ValueError, match="snapshot"):
        _warp("suite", 2, seed=3).set_state(snapshot)


def test_warp_single_env_passes_check_env() -> None:
    from gymnasium.utils.env_checker import check_env

    env = sims.SingleEnv("suite", backend="warp")
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert isinstance(obs["state"], np.ndarray)  # numpy at the gymnasium edge, whatever the device
    env.close()


def test_removed_and_unknown_backends_name_the_fix() -> None:
    with pytest.raises(ValueError, match="mjx-warp' was removed: use backend='warp'"):
        make_vec_env("reach", 2, backend="mjx-warp")
    with pytest.raises(ValueError, match="not a Warp device here"):
        _warp_device("cuda:7")


SUITE_NV = 43  # dofs of the suite scene (asserted below)


def test_buffer_plan_sizes_8192_worlds_without_allocating() -> None:
    from sims.warp_backend import INT32_MAX, plan_buffers

    assert sims.scene.build_model()[0].nv == SUITE_NV
    # The shipped setting (deterministic on the sparse Jacobian) at 1,024 worlds: the sort workspace
    # Warp asked for on the H200, 7,627,550,207 bytes, from 188,743,680 records.
    shipped = plan_buffers(SUITE_NV, 1024, deterministic=True, sparse=True)
    assert shipped.det_records == 1024 * 32 * 192 * 30 == 188_743_680
    assert abs(shipped.det_workspace_bytes - 7_627_550_207) / 7_627_550_207 < 1e-3
    with pytest.raises(ValueError, match=r"env.suite.warp_deterministic=false .* at most 288 worlds"):
        shipped.check()
    # Fast mode (the default) at 8,192 worlds: no records, contacts and rows well inside Warp's limits.
    fast = plan_buffers(SUITE_NV, 8192)
    fast.check()
    assert (fast.det_records, fast.contacts, fast.constraint_rows) == (0, 8192 * 48, 8192 * 192)
    # Deterministic on the dense Jacobian: 15x fewer records; 1,024 worlds fit, 8,192 do not.
    plan_buffers(SUITE_NV, 1024, deterministic=True).check()
    dense = plan_buffers(SUITE_NV, 8192, deterministic=True)
    assert dense.det_records == 8192 * 12288 and dense.det_workspace_bytes > INT32_MAX
    with pytest.raises(ValueError, match=r"^deterministic Warp at 8192 worlds .* at most 4323 worlds$"):
        dense.check()
    with pytest.raises(ValueError, match="contact slots"):
        plan_buffers(SUITE_NV, 2**26).check()


def test_warp_refuses_oversized_deterministic_worlds_before_allocating(monkeypatch) -> None:
    import mujoco_warp

    def allocate(*args, **kwargs):
        raise AssertionError("mujoco_warp allocated before the size check")

    monkeypatch.setattr(mujoco_warp, "put_model", allocate)
    monkeypatch.setattr(mujoco_warp, "make_data", allocate)
    with pytest.raises(ValueError, match=r"^deterministic Warp at 8192 worlds"):
        make_vec_env("suite", 8192, backend="warp", warp_device="cpu", warp_deterministic=True)


class _FailingCapture:
    """``wp.ScopedCapture`` failing as it did on the H200 with the sparse deterministic records."""

    def __enter__(self):
        raise ValueError("Array shapes must not exceed the maximum representable value of a signed 32-bit "
                         "integer, got 7627550207 in dimension 0")

    def __exit__(self, *exc) -> bool:
        return False


def test_failed_graph_capture_is_an_error_naming_the_fix(monkeypatch) -> None:
    import warp

    env = _warp("reach", 2, seed=4)
    env.reset_arrays()
    backend = env._backend
    assert backend.graphs_captured == {"step": False, "render": False} and not backend.deterministic
    backend._capture = True  # what CUDA does (Warp's CPU device has no graphs to capture)
    monkeypatch.setattr(warp, "ScopedCapture", _FailingCapture)
    qpos = backend.qpos.clone()
    with pytest.raises(RuntimeError, match=r"^CUDA graph capture of mujoco_warp failed \(ValueError: Array shapes"
                                           r".*; set env.suite.warp_uncaptured=true to step without graphs"):
        env.step_arrays(np.zeros((2, ACTION_DIM), np.float32))
    assert not torch.equal(backend.qpos, qpos) and not backend.graphs_captured["step"]  # eager step ran


def test_deterministic_mode_runs_the_dense_jacobian_and_agrees() -> None:
    actions = np.random.default_rng(3).uniform(-1, 1, (4, 2, ACTION_DIM)).astype(np.float32)
    det = _warp("suite", 2, seed=7, warp_deterministic=True)
    assert det._backend.deterministic and not det._backend.m.is_sparse
    assert det.model.opt.jacobian != 0  # the env's own model keeps its Jacobian setting
    fast, slow = _trace(_warp("suite", 2, seed=7), actions), _trace(det, actions)
    for x, y in zip(fast, slow):
        np.testing.assert_allclose(y["state"], x["state"], atol=STATE_TOL)


def _warp_device(name: str):
    return make_vec_env("reach", 2, backend="warp", warp_device=name)


def _wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def _expert_parity(episodes: int) -> None:
    """Scripted experts on the same seeded episodes: warp's success rate inside batch's 95 % interval."""
    for task in sims.TASK_NAMES:
        ref = run_expert(make_vec_env(task, episodes, seed=100, num_threads=1))[:, 0]
        got = run_expert(_warp(task, episodes, seed=100))[:, 0]
        lo, hi = _wilson(int(ref.sum()), episodes)
        assert lo <= got.mean() <= hi, f"{task}: warp {got.mean():.3f}, batch {ref.mean():.3f} [{lo:.3f}, {hi:.3f}]"


def test_experts_succeed_on_warp_as_on_batch() -> None:
    _expert_parity(16)


@pytest.mark.slow
def test_experts_succeed_on_warp_as_on_batch_over_256_episodes() -> None:
    _expert_parity(256)


def test_materials_are_lit_and_textured_as_opengl_draws_them() -> None:
    """gl_materials: shininess 0 keeps OpenGL's full specular (mujoco_warp drops the term at exponent
    0), a textured material's specular is scaled by its texture's mean colour (OpenGL multiplies the
    specular by the texture), an untextured one is left alone; prefilter_texture box-filters a
    texture to the side asked for, keeping its mean, as float RGBA."""
    import mujoco

    from sims.warp_backend import MIN_SHININESS, gl_materials, prefilter_texture

    checker = (np.indices((256, 128)).sum(0) % 2 * 200).astype(np.uint8)  # mean 100 of 255
    pixels = np.repeat(checker[..., None], 3, axis=2)
    small = prefilter_texture(pixels, 16)
    assert small.shape == (16, 8, 4) and small.dtype == np.float32
    np.testing.assert_allclose(small[..., :3], 100 / 255, atol=1e-6)  # the mipmap level's average
    np.testing.assert_allclose(small[..., 3], 1.0)
    assert prefilter_texture(pixels[:8, :8], 16).shape == (8, 8, 4)  # small textures stay as they are

    model = mujoco.MjModel.from_xml_string("""<mujoco><asset>
      <texture name="wood" type="2d" builtin="checker" width="64" height="64" rgb1="0 0 0" rgb2="1 1 1"/>
      <material name="textured" texture="wood" specular="0.2" shininess="0"/>
      <material name="plain" specular="0.5" shininess="0.3"/>
    </asset><worldbody><geom type="box" size="1 1 1" material="textured"/></worldbody></mujoco>""")
    shininess, specular = gl_materials(model, np.array([small[..., :3].mean()]))
    np.testing.assert_allclose(shininess, [MIN_SHININESS, 0.3], rtol=1e-6)
    np.testing.assert_allclose(specular, [0.2 * 100 / 255, 0.5], rtol=1e-5)
    np.testing.assert_allclose(gl_materials(model, None)[1], [0.2, 0.5], rtol=1e-6)  # no textures drawn

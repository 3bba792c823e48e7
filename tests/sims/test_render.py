"""Rendering: frames show each object in its episode colour where it is, tiles land in the right env.

The colour and goal-pixel tests run against both renderers: EGL (``batch``) and mujoco_warp's ray
tracer (``warp``, on Warp's CPU device).
"""

from __future__ import annotations

import importlib.util

import mujoco
import numpy as np
import pytest

from sims import scene as S
from sims import tasks as T
from sims.backends import to_numpy
from sims.render import RenderConfig
from sims.vec_env import make_vec_env

SIZE = 96
RENDERERS = ["batch", pytest.param("warp", marks=pytest.mark.skipif(
    importlib.util.find_spec("mujoco_warp") is None, reason="mujoco_warp is not installed"))]


def _project(model: mujoco.MjModel, data: mujoco.MjData, cam: int, point: np.ndarray) -> tuple[int, int, float]:
    """Pixel (row, col) and camera-axis depth of a world point in camera ``cam`` (SIZE x SIZE)."""
    rel = data.cam_xmat[cam].reshape(3, 3).T @ (point - data.cam_xpos[cam])
    f = 0.5 * SIZE / np.tan(np.deg2rad(model.cam_fovy[cam]) / 2)
    col = 0.5 * SIZE + f * rel[0] / -rel[2]
    row = 0.5 * SIZE - f * rel[1] / -rel[2]
    return int(row), int(col), float(-rel[2])


def _nearest_colour(pixel: np.ndarray) -> int:
    """Palette index whose chromaticity is nearest the pixel's (shading changes brightness only)."""
    chroma = pixel / max(pixel.sum(), 1.0)
    palette = T.PALETTE_RGBA[:, :3] / T.PALETTE_RGBA[:, :3].sum(1, keepdims=True)
    return int(np.argmin(np.linalg.norm(palette - chroma, axis=1)))


@pytest.mark.parametrize("backend", RENDERERS)
def test_frames_show_objects_in_their_colours(backend: str) -> None:
    config = RenderConfig(width=SIZE, height=SIZE, cameras=("front",), depth=True, num_contexts=2,
                          tile_frames=3)
    env = make_vec_env("suite", 8, seed=21, num_threads=1, render=config, backend=backend, warp_device="cpu")
    obs, _ = env.reset()
    assert obs["rgb"].shape == (8, 1, 3, SIZE, SIZE) and obs["rgb"].dtype == np.uint8
    assert obs["depth"].shape == (8, 1, SIZE, SIZE)
    model, cam = env.model, env.model.camera("front").id
    data = mujoco.MjData(model)
    checked = 0
    for i in range(8):
        data.qpos[:] = to_numpy(env._backend.qpos)[i]
        data.mocap_pos[:] = to_numpy(env._backend.mocap_pos)[i]
        mujoco.mj_kinematics(model, data)
        mujoco.mj_camlight(model, data)
        for geom, colour in zip(env.layout.colour_geoms, env._colours[i]):
            top = data.geom_xpos[geom] + np.array([0.0, 0.0, model.geom_size[geom][2] * 0.5])
            if model.geom_type[geom] == mujoco.mjtGeom.mjGEOM_SPHERE:
                # Above the centre: the ray tracer lights per pixel and draws the headlight's specular
                # highlight where the sphere faces the camera (EGL lights per vertex and loses it).
                top = data.geom_xpos[geom] + np.array([0.0, 0.0, model.geom_size[geom][0] * 0.8])
            row, col, dist = _project(model, data, cam, top)
            depth = obs["depth"][i, 0, row, col]
            if abs(depth - dist) > 0.03:  # hidden behind the arm or another object
                continue
            pixel = obs["rgb"][i, 0, :, row, col].astype(float)
            assert _nearest_colour(pixel) == colour, (i, model.geom(geom).name, pixel, T.COLOUR_NAMES[colour])
            checked += 1
    assert checked >= 40  # most of the 72 coloured entities are in view
    # Different envs (tiles of different workers) show different scenes.
    assert not np.array_equal(obs["rgb"][0], obs["rgb"][5])
    env.close()


@pytest.mark.parametrize("cameras", [("front", "wrist")])
def test_multi_camera_frames_follow_the_arm(cameras: tuple[str, ...]) -> None:
    env = make_vec_env("reach", 2, seed=0, num_threads=1,
                       render=RenderConfig(width=32, height=32, cameras=cameras, num_contexts=1))
    obs, _ = env.reset()
    assert obs["rgb"].shape == (2, 2, 3, 32, 32)
    for _ in range(4):
        moved = env.step(np.tile([[1.0, 0.0, 0.0, -1.0]], (2, 1)).astype(np.float32))[0]
    front_change = np.abs(moved["rgb"][:, 0].astype(int) - obs["rgb"][:, 0]).mean()
    wrist_change = np.abs(moved["rgb"][:, 1].astype(int) - obs["rgb"][:, 1]).mean()
    assert front_change > 0 and wrist_change > front_change  # the wrist camera rides on the hand
    env.close()


def test_bad_render_config_is_refused() -> None:
    RenderConfig(cameras=("top",)).validate()  # no camera names given: the fields alone
    with pytest.raises(ValueError, match=r"^cameras=\['top'\]: unknown camera\(s\) \['top'\]; valid: front, wrist$"):
        RenderConfig(cameras=("top",)).validate(S.CAMERAS)
    with pytest.raises(ValueError, match=r"^cameras=\['front', 'front'\] must name distinct cameras \(at least one\)$"):
        RenderConfig(cameras=("front", "front")).validate()
    with pytest.raises(ValueError, match=r"^width=4: a frame's width and height must be in \[8, 1024\]$"):
        RenderConfig(width=4).validate()


@pytest.mark.parametrize("backend", RENDERERS)
def test_goal_pixel_locates_the_tip_goal_in_every_camera(backend: str) -> None:
    """``goal_pixel`` is where the tip goal projects, in the front and the moving wrist camera,
    and in the front camera the instructed reach object's colour is right below it."""
    config = RenderConfig(width=SIZE, height=SIZE, cameras=("front", "wrist"), num_contexts=1)
    env = make_vec_env("reach", 6, seed=4, num_threads=1, render=config, backend=backend, warp_device="cpu")
    env.reset_arrays()
    obs = env.step_arrays(np.random.default_rng(0).uniform(-1, 1, (6, 4)).astype(np.float32))["observation"]
    obs = {k: to_numpy(v) for k, v in obs.items()}
    assert obs["goal_pixel"].shape == (6, 2, 2) and obs["goal_pixel"].dtype == np.float32
    data = mujoco.MjData(env.model)
    for i in range(6):
        data.qpos[:] = to_numpy(env._backend.qpos)[i]
        data.mocap_pos[:] = to_numpy(env._backend.mocap_pos)[i]
        mujoco.mj_kinematics(env.model, data)
        mujoco.mj_camlight(env.model, data)
        goal = obs["state"][i, T.STATE_TIP_GOAL] + obs["state"][i, T.STATE_TIP]
        for k, name in enumerate(("front", "wrist")):
            row, col, depth = _project(env.model, data, env.model.camera(name).id, goal)
            if depth <= 0:
                assert np.isnan(obs["goal_pixel"][i, k]).all()
                continue
            u, v = obs["goal_pixel"][i, k]
            assert abs((u + 1) / 2 * SIZE - col) <= 1.0 and abs((v + 1) / 2 * SIZE - row) <= 1.0
        obj_row, obj_col, _ = _project(env.model, data, env.model.camera("front").id,
                                       goal - np.array([0.0, 0.0, T.REACH_HOVER]))
        pixel = obs["rgb"][i, 0, :, obj_row, obj_col].astype(float)
        assert T.COLOUR_NAMES[_nearest_colour(pixel)] in env.instructions[obs["instruction"][i]]


@pytest.mark.parametrize("backend", RENDERERS)
def test_object_goal_pixel_shows_where_push_takes_the_block(backend: str) -> None:
    """In push, ``object_goal_pixel`` is where the named block should go: the pixel under it in the
    front camera has the colour the instruction gives the target pad (the second entity)."""
    config = RenderConfig(width=SIZE, height=SIZE, cameras=("front",), num_contexts=1)
    env = make_vec_env("push", 8, seed=2, num_threads=1, render=config, backend=backend, warp_device="cpu")
    obs = {k: to_numpy(v) for k, v in env.reset_arrays().items()}
    assert obs["object_goal_pixel"].shape == (8, 1, 2) and obs["object_goal_pixel"].dtype == np.float32
    assert not np.allclose(obs["object_goal_pixel"], obs["goal_pixel"])
    for i in range(8):
        u, v = obs["object_goal_pixel"][i, 0]
        col, row = int((u + 1) / 2 * SIZE), int((v + 1) / 2 * SIZE)
        pixel = obs["rgb"][i, 0, :, row, col].astype(float)
        words = env.instructions[obs["instruction"][i]].split()
        assert T.COLOUR_NAMES[_nearest_colour(pixel)] == words[words.index("target") - 1]


def test_frames_do_not_depend_on_how_the_environments_are_split() -> None:
    # A fleet splits one set of environments into shards (env_offset); each environment must see
    # exactly the frames it would see in the whole set, or sharded training diverges from one process.
    render = RenderConfig(height=64, width=64)
    whole = make_vec_env("reach", 32, seed=3, render=render)
    parts = [
        make_vec_env("reach", n, seed=3, render=render, env_offset=offset) for offset, n in ((0, 13), (13, 19))
    ]
    obs = whole.reset(seed=3)[0]
    split = [p.reset(seed=3)[0] for p in parts]
    actions = np.random.default_rng(0).uniform(-1, 1, (3, 32, 4)).astype(np.float32)
    for a in actions:
        for key in ("rgb", "goal_pixel"):
            np.testing.assert_array_equal(np.concatenate([s[key] for s in split]), obs[key], err_msg=key)
        obs = whole.step(a)[0]
        split = [parts[0].step(a[:13])[0], parts[1].step(a[13:])[0]]
    for env in (whole, *parts):
        env.close()


def test_nvidia_egl_steers_to_the_warp_renderer(monkeypatch) -> None:
    import warnings

    import sims.render as R

    model = S.build_model()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Mesa here: no advice
        assert "NVIDIA" not in R.BatchRenderer(model, RenderConfig(num_contexts=1)).gl_vendor
    monkeypatch.setattr(R, "_gl_vendor", lambda: "NVIDIA Corporation")
    with pytest.warns(RuntimeWarning, match=r"NVIDIA's driver \(NVIDIA Corporation\) draws about 377 frames/s.*"
                                            r"env.backend=warp"):
        renderer = R.BatchRenderer(model, RenderConfig(num_contexts=1))
    assert renderer.gl_vendor == "NVIDIA Corporation"


def test_tiles_beyond_the_models_offscreen_size_are_drawn() -> None:
    """A model whose offscreen buffer (``offwidth``/``offheight``, LIBERO's 640x480) is smaller than
    the renderer's tiles: every environment of one state still gets the same frame."""
    from sims.render import BatchRenderer

    xml = """<mujoco><visual><global offwidth="64" offheight="64"/></visual><worldbody>
      <light pos="0 0 3"/><camera name="front" pos="0 -1 0.3" xyaxes="1 0 0 0 0.3 1"/>
      <geom type="box" size="0.2 0.2 0.2" rgba="0.9 0.2 0.1 1"/></worldbody></mujoco>"""
    model = mujoco.MjModel.from_xml_string(xml)

    class _Layout:
        colour_geoms = np.zeros(0, np.int64)

    renderer = BatchRenderer(model, RenderConfig(width=32, height=32, cameras=("front",), num_contexts=1,
                                                 tile_frames=8))
    try:
        n = 8  # tiles 0..7 span 256 pixels of a 64-pixel-wide model buffer
        rgb = renderer.render(np.zeros((n, 0)), np.zeros((n, 0, 3)), np.zeros((n, 0, 4)), _Layout())["rgb"]
    finally:
        renderer.close()
    assert rgb[0, 0, 0].max() > 100  # the red box is in the frame (channel 0: red)
    assert (rgb == rgb[:1]).all(), "frames of identical states differ: tiles outside the offscreen buffer"


def test_outside_view_culls_only_spheres_wholly_outside() -> None:
    """The camera at the origin looks along -z with a 90 degree vertical field (aspect 1)."""
    from sims.render import outside_view

    centres = np.array([[0, 0, -2.0], [0, 0, 2.0], [0, 0, 0.5], [3.0, 0, -1.0], [1.5, 0, -1.0], [0, -5.0, -1.0],
                        [0, 0, 5.0]])
    radii = np.array([0.1, 0.1, 1.0, 0.1, 0.4, 0.1, 0.0])
    out = outside_view(np.zeros(3), np.eye(3).ravel(), 90.0, 1.0, centres, radii)
    # ahead; behind; straddling the camera; beside; touching the side plane (0.5 / sqrt 2 < 0.4); below;
    # radius 0 (a plane) is never culled
    assert out.tolist() == [False, True, False, True, False, True, False]

"""LIBERO's visual level of detail (:mod:`sims.libero.toolchain.lod`): decimated visual meshes leave the
physics bit-identical, change the 128x128 frames by about a level, and are cached per budget."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from sims.libero.scene import VISUAL_FACES, load_task
from sims.libero.sim import LiberoSim, libero_render_config
from sims.libero.toolchain.install import ensure_tasks
from sims.libero.toolchain.lod import apply_visual_lod, decimate, lod_dir, lod_file, read_mesh, write_msh

TASK = "spatial/0"
# Measured at the default budget (2,000 triangles) on spatial/0, initial states 0-15: 1.1 (agentview)
# and 0.8 (wrist) mean absolute levels; the bound leaves room for other states and Mesa versions.
MAX_MEAN_LEVELS = 3.0


@pytest.fixture(scope="module")
def sims() -> dict[str, LiberoSim]:
    """spatial/0 with LIBERO's full meshes and with the default budget: 2 envs, both cameras."""
    ensure_tasks([TASK])
    task = load_task(TASK)
    out = {name: LiberoSim(task, 2, num_threads=1, render=libero_render_config(128, num_contexts=1), visual_faces=faces)
           for name, faces in (("full", None), ("lod", VISUAL_FACES))}
    yield out
    for sim in out.values():
        sim.close()


def _drawn_faces(model: mujoco.MjModel) -> int:
    """Triangles of the mesh geoms the cameras draw (groups 0-2)."""
    mesh = (model.geom_type == mujoco.mjtGeom.mjGEOM_MESH) & (model.geom_group < 3)
    return int(model.mesh_facenum[model.geom_dataid[mesh]].sum())


def test_lod_keeps_the_physics_bit_identical(sims):
    full, lod = sims["full"], sims["lod"]
    assert _drawn_faces(lod.model) < _drawn_faces(full.model) / 2  # 293k -> 64k here
    colliders = lod.model.geom_group == 3
    assert np.array_equal(lod.model.geom_dataid[colliders], full.model.geom_dataid[colliders])
    for name in ("body_mass", "body_inertia", "body_ipos", "body_iquat"):
        assert np.array_equal(getattr(lod.model, name), getattr(full.model, name)), name
    for name in ("geom_size", "geom_pos", "geom_quat", "geom_aabb"):
        assert np.array_equal(getattr(lod.model, name)[colliders], getattr(full.model, name)[colliders]), name
    rng = np.random.default_rng(0)
    for sim in (full, lod):
        sim.reset(np.array([0, 1]))
    for _ in range(5):
        ctrl = full.current_ctrl()
        ctrl[:, full.layout.arm_act] += rng.uniform(-0.05, 0.05, (2, 7))
        full.step(ctrl)
        lod.step(ctrl)
    assert np.array_equal(full.qpos, lod.qpos) and np.array_equal(full.qvel, lod.qvel)


def test_lod_frames_stay_within_a_few_levels(sims):
    frames = {}
    for name, sim in sims.items():
        sim.reset(np.array([0, 5]))
        frames[name] = sim.render().astype(np.int16)
    diff = np.abs(frames["full"] - frames["lod"])
    per_camera = diff.mean(axis=(0, 2, 3, 4))
    assert (per_camera < MAX_MEAN_LEVELS).all(), per_camera
    assert per_camera.max() > 0.0  # the meshes did change


def _sphere(n: int) -> dict[str, np.ndarray]:
    """A UV sphere of about 2 n^2 triangles, three vertices each, UV = (longitude, latitude)."""
    lon, lat = np.linspace(0, 2 * np.pi, n + 1), np.linspace(0.01, np.pi - 0.01, n + 1)
    grid = np.stack(np.meshgrid(lon, lat, indexing="ij"), -1)
    def xyz(p: np.ndarray) -> np.ndarray:
        return np.stack([np.sin(p[..., 1]) * np.cos(p[..., 0]), np.sin(p[..., 1]) * np.sin(p[..., 0]),
                         np.cos(p[..., 1])], -1)
    a, b, c, d = grid[:-1, :-1], grid[1:, :-1], grid[1:, 1:], grid[:-1, 1:]
    params = np.concatenate([np.stack([a, b, c], 2), np.stack([a, c, d], 2)]).reshape(-1, 3, 2)
    corners = xyz(params)
    uv = params / np.array([2 * np.pi, np.pi])
    return {"corners": corners, "normals": corners, "uv": uv}


def test_decimated_mesh_keeps_its_shape_uvs_and_cache_key(tmp_path):
    assets = tmp_path / "assets"
    source = assets / "obj" / "sphere.msh"
    source.parent.mkdir(parents=True)
    write_msh(source, _sphere(40))  # 3,200 triangles
    mesh = read_mesh(source)
    assert len(mesh["corners"]) == 3200 and np.allclose(np.linalg.norm(mesh["corners"], axis=-1), 1.0, atol=1e-5)
    small = decimate(mesh, 400)
    assert 300 <= len(small["corners"]) <= 400
    assert np.abs(np.linalg.norm(small["corners"], axis=-1) - 1.0).max() < 0.05  # still the unit sphere
    # each corner's transferred UV is the source's mapping at that point (longitude, latitude)
    lat = np.arccos(np.clip(small["corners"][..., 2], -1, 1)) / np.pi
    assert np.abs(small["uv"][..., 1] - lat).mean() < 0.02
    assert np.allclose(np.linalg.norm(small["normals"], axis=-1), 1.0)
    # the budget is part of the cache path; a source under budget leaves a marker, no copy
    paths = {faces: lod_file(source, assets, faces, tmp_path) for faces in (400, 800, 5000)}
    assert paths[5000] is None and (lod_dir(tmp_path, 5000) / "obj" / "sphere.msh.full").is_file()
    assert paths[400].parent.parent == lod_dir(tmp_path, 400) and paths[800].parent.parent == lod_dir(tmp_path, 800)
    assert len(read_mesh(paths[400])["corners"]) <= 400 < len(read_mesh(paths[800])["corners"]) <= 800
    with pytest.raises(ValueError, match="at least 4 triangles"):
        apply_visual_lod(mujoco.MjSpec(), tmp_path, tmp_path, 2)


def test_culling_geoms_outside_the_view_leaves_frames_unchanged(sims):
    """The renderer hides each frame's mesh geoms outside its camera (most of the Panda in the wrist
    view): the frames are the same pixel for pixel as with every geom drawn."""
    sim = sims["lod"]
    sim.reset(np.array([0, 5]))
    culled = sim.render()
    worker = sim.renderer._workers[0]
    geoms, groups = worker.cull_geoms, worker.cull_groups
    assert (worker.model.geom_group[geoms] != groups).sum() > 10  # the last frame (a wrist view) hid geoms
    try:
        worker.cull_geoms = geoms[:0]
        worker.model.geom_group[geoms] = groups
        assert np.array_equal(sim.render(), culled)
    finally:
        worker.cull_geoms = geoms

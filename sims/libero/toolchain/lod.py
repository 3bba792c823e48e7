"""Visual level of detail for LIBERO scenes: decimated copies of the heavy visual-only meshes.

A LIBERO scene draws 0.6-1.1M mesh vertices, most of them in a few scanned objects (each black
bowl 42.5k triangles) and the Panda's visual links (12-15k each); on a CPU rasteriser the frame
cost follows the triangle count. :func:`apply_visual_lod` points every mesh that only visual geoms
use (none collides, none in the inertia group) and that has more than ``max_faces`` triangles at a
quadric-decimated copy (``fast-simplification``) of at most ``max_faces`` triangles (where the
decimator can get there: see :func:`decimate`). Collision meshes and every other model field that
physics reads are untouched, so the physics is the same bit for bit (tested).

Texture coordinates and normals survive the decimation by transfer, not by welding: the mesh is
welded by position alone (so UV seams do not become holes), decimated, and each corner of each
new triangle takes the UV and normal that the original triangle nearest to the new triangle's
centroid has at that corner's position (barycentric in the original triangle's plane). The
copies are MuJoCo's binary ``.msh`` files (three vertices per triangle, like LIBERO's own scanned
meshes), cached under ``<cache>/lod/faces-<max_faces>-v<LOD_VERSION>/`` by the source file's path
below ``<cache>/assets`` (the export writes those copies once and never replaces them, so the
path identifies the source); a source under the budget leaves a ``.full`` marker so the next
build need not count its triangles.
"""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np

from infra.common.files import write_atomic

#: Bumped when the decimation's output changes: the cache folder's name carries it.
LOD_VERSION = 2
_PASSES = 6  # decimation passes at most (the mount's pedestal, budget 2,000: 32,952 -> 5,828 -> ... -> 2,269)
MSH_TYPE = "model/vnd.mujoco.msh"


def lod_dir(cache: Path, max_faces: int) -> Path:
    """The folder of the decimated copies for budget ``max_faces`` (the budget is the cache key)."""
    return cache / "lod" / f"faces-{max_faces}-v{LOD_VERSION}"


def _quat_rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate vectors ``v`` [n, 3] by the unit quaternion ``q`` (w, x, y, z)."""
    w, u = q[0], q[1:]
    t = 2.0 * np.cross(u, v)
    return v + w * t + np.cross(u, t)


def read_mesh(path: Path) -> dict[str, np.ndarray]:
    """A mesh file as MuJoCo reads it, in the file's own frame (no scale).

    Returns ``corners`` float64 [F, 3, 3] (each triangle's vertex positions), ``normals`` [F, 3, 3]
    and, if the mesh has texture coordinates, ``uv`` [F, 3, 2].
    """
    spec = mujoco.MjSpec()
    spec.add_mesh(name="m", file=str(path))
    m = spec.compile()
    vert = _quat_rotate(m.mesh_quat[0], m.mesh_vert.astype(np.float64)) + m.mesh_pos[0]  # undo MuJoCo's recentring
    normal = _quat_rotate(m.mesh_quat[0], m.mesh_normal.astype(np.float64))
    out = {"corners": vert[m.mesh_face], "normals": normal[m.mesh_facenormal]}
    if m.mesh_texcoordnum[0] > 0:
        out["uv"] = m.mesh_texcoord.astype(np.float64)[m.mesh_facetexcoord]
    return out


def _barycentric(tri: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Barycentric coordinates [n, 3] of points ``p`` [n, 3] projected on triangles ``tri`` [n, 3, 3]."""
    e1, e2, d = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], p - tri[:, 0]
    d11, d12, d22 = (e1 * e1).sum(1), (e1 * e2).sum(1), (e2 * e2).sum(1)
    dp1, dp2 = (d * e1).sum(1), (d * e2).sum(1)
    den = d11 * d22 - d12 * d12
    den = np.where(np.abs(den) > 1e-30, den, 1e-30)  # degenerate source triangles: their first corner
    b1, b2 = (d22 * dp1 - d12 * dp2) / den, (d11 * dp2 - d12 * dp1) / den
    return np.stack([1.0 - b1 - b2, b1, b2], axis=1)


def _face_normals(tri: np.ndarray) -> np.ndarray:
    """Unit geometric normals [n, 3] of triangles [n, 3, 3] (zero for degenerate ones)."""
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    return n / np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-30)


def _source_faces(corners: np.ndarray, new_corners: np.ndarray, tree: object, k: int = 16) -> np.ndarray:
    """For each new triangle, the nearest original triangle (by centroid) facing the same way [F'].

    Facing matters on thin shells (a plate's top and bottom lie a millimetre apart): the nearest
    centroid alone can be the far side's, whose UVs and normals would paint the top black.
    """
    dist, idx = tree.query(new_corners.mean(1), k=min(k, len(corners)))
    dist, idx = dist.reshape(len(new_corners), -1), idx.reshape(len(new_corners), -1)
    facing = np.einsum("nd,nkd->nk", _face_normals(new_corners), _face_normals(corners)[idx]) > 0.0
    score = np.where(facing, dist, np.inf)
    best = np.argmin(score, axis=1)
    best = np.where(np.isinf(score.min(1)), 0, best)  # no candidate facing the same way: the nearest
    return idx[np.arange(len(idx)), best]


def decimate(mesh: dict[str, np.ndarray], max_faces: int) -> dict[str, np.ndarray]:
    """Quadric-decimate ``mesh`` (:func:`read_mesh`'s arrays) to at most ``max_faces`` triangles.

    Returns the same keys, UVs and normals transferred (module docstring). F <= ``max_faces``
    unless the mesh is many small parts that stop the decimator above it (LIBERO-10's room
    backgrounds: 60k -> 20k triangles at a budget of 2,000).
    """
    import fast_simplification
    from scipy.spatial import cKDTree

    corners = mesh["corners"]
    points, inverse = np.unique(corners.reshape(-1, 3), axis=0, return_inverse=True)
    faces = inverse.reshape(-1, 3).astype(np.int32)
    faces = faces[(faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 0] != faces[:, 2])]
    new_points, new_faces = points, faces
    for _ in range(_PASSES):  # a pass stops early on meshes of many parts; the next one goes on
        before = len(new_faces)
        new_points, new_faces = fast_simplification.simplify(new_points, new_faces.astype(np.int32),
                                                             target_count=max_faces)
        if len(new_faces) <= max_faces or len(new_faces) > 0.95 * before:
            break
    new_corners = new_points[new_faces]  # [F', 3, 3]
    nearest = _source_faces(corners, new_corners, cKDTree(corners.mean(1)))
    src = corners[nearest]
    bary = _barycentric(np.repeat(src, 3, axis=0), new_corners.reshape(-1, 3))  # [3F', 3]
    out = {"corners": new_corners}
    normals = np.einsum("nk,nkd->nd", bary, np.repeat(mesh["normals"][nearest], 3, axis=0))
    normals /= np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-12)
    out["normals"] = normals.reshape(-1, 3, 3)
    if "uv" in mesh:
        out["uv"] = np.einsum("nk,nkd->nd", bary, np.repeat(mesh["uv"][nearest], 3, axis=0)).reshape(-1, 3, 2)
    return out


def write_msh(path: Path, mesh: dict[str, np.ndarray]) -> None:
    """Write ``mesh`` as MuJoCo's binary ``.msh`` (three vertices per triangle), atomically."""
    n = 3 * len(mesh["corners"])
    uv = mesh.get("uv")
    header = np.array([n, n, 0 if uv is None else n, n // 3], np.int32)
    parts = [header.tobytes(), mesh["corners"].astype(np.float32).tobytes(), mesh["normals"].astype(np.float32).tobytes()]
    if uv is not None:
        parts.append(uv.astype(np.float32).tobytes())
    parts.append(np.arange(n, dtype=np.int32).tobytes())
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, b"".join(parts))  # concurrent builders write the same bytes; a reader never sees half a file


def lod_copy_path(source: Path, assets: Path, max_faces: int, cache: Path) -> Path:
    """Where the decimated copy of ``source`` (a mesh file under ``assets``) lives; the same path with
    the suffix ``.full`` is the marker of a source within the budget."""
    rel = source.resolve().relative_to(assets.resolve())
    return lod_dir(cache, max_faces) / rel.with_name(rel.name + ".msh")


def lod_file(source: Path, assets: Path, max_faces: int, cache: Path) -> Path | None:
    """The decimated copy of ``source`` (a mesh file under ``assets``), made if missing, or None if
    ``source`` has at most ``max_faces`` triangles."""
    out = lod_copy_path(source, assets, max_faces, cache)
    full = out.with_suffix(".full")
    if out.is_file():
        return out
    if full.is_file():
        return None
    mesh = read_mesh(source)
    if len(mesh["corners"]) <= max_faces:
        full.parent.mkdir(parents=True, exist_ok=True)
        full.touch()
        return None
    write_msh(out, decimate(mesh, max_faces))
    return out


def visual_only_meshes(spec: mujoco.MjSpec) -> set[str]:
    """Names of the meshes that only non-colliding geoms outside the inertia group draw."""
    lo, hi = spec.compiler.inertiagrouprange
    used: dict[str, bool] = {}
    for geom in spec.geoms:
        if geom.type != mujoco.mjtGeom.mjGEOM_MESH:
            continue
        visual = geom.contype == 0 and geom.conaffinity == 0 and not lo <= geom.group <= hi
        used[geom.meshname] = used.get(geom.meshname, True) and visual
    return {name for name, visual in used.items() if visual}


def apply_visual_lod(spec: mujoco.MjSpec, model_dir: Path, cache: Path, max_faces: int) -> int:
    """Point the spec's heavy visual-only meshes at decimated copies; returns how many it replaced.

    ``model_dir``: the folder the spec's relative mesh paths start from; ``cache``: the LIBERO
    cache (meshes live in ``<cache>/assets``).

    Raises:
        ValueError: ``max_faces`` below 4.
    """
    if max_faces < 4:
        raise ValueError(f"visual_faces={max_faces}: give at least 4 triangles per mesh, or None for full meshes")
    visual = visual_only_meshes(spec)
    replaced = 0
    for mesh in spec.meshes:
        if mesh.name not in visual or not mesh.file:
            continue
        path = lod_file((model_dir / mesh.file).resolve(), cache / "assets", max_faces, cache)
        if path is not None:
            mesh.file, mesh.content_type = str(path), MSH_TYPE
            replaced += 1
    return replaced

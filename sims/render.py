"""Batched in-loop rendering on the CPU: MuJoCo's OpenGL renderer on EGL, fast settings, tiled.

Speed comes from (measured in docs/sims.md):

- the scene: few geoms (the per-draw cost dominates at 64x64 on Mesa's llvmpipe), a table plane
  drawn as one quad, coarse tessellation of round primitives, no sites;
- fast visual settings: no multisampling (``offsamples=0``, or ``RenderConfig.samples=0``), no shadows, reflections, skybox,
  fog or haze;
- a pool of GL contexts, one per worker thread (MuJoCo's calls release the GIL), each rendering
  a contiguous slice of the environments, with ``LP_NUM_THREADS=0`` (no rasteriser helper
  threads, set by ``import sims`` unless already set);
- culling: each frame hides the mesh geoms whose bounding sphere lies wholly outside its camera's
  view (:func:`outside_view`; conservative, so frames are unchanged: a LIBERO wrist view draws a
  third of the scene's mesh triangles);
- tiling: a worker renders ``tile_frames`` frames into tiles of one offscreen buffer and reads
  them back at once (no measurable gain on llvmpipe at 64x64; fewer GPU syncs with a driver).
  A frame's tile is fixed by its environment's global index, not by its place in the batch: the
  rasteriser rounds a few edge pixels differently at different viewport offsets, and a fixed
  tile makes an environment's frames the same however a fleet splits the environments. Each
  context's offscreen buffer is made large enough for its tiles (a model's ``offwidth`` /
  ``offheight`` may be smaller: LIBERO's are 640x480).

Frames come out as uint8 [N, cams, 3, H, W] (and linear depth in metres [N, cams, H, W]). Given
world points, the renderer also returns where they appear in each camera
(:func:`project_points`), from the same camera poses it draws with.
"""

from __future__ import annotations

import copy
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import mujoco
import numpy as np

from sims import scene as S

_CULLED_GROUP = 5  # geoms outside a frame's view go here for that frame; the renderer's option hides it
_FAST_OFF_FLAGS = (
    mujoco.mjtRndFlag.mjRND_SHADOW,
    mujoco.mjtRndFlag.mjRND_REFLECTION,
    mujoco.mjtRndFlag.mjRND_SKYBOX,
    mujoco.mjtRndFlag.mjRND_FOG,
    mujoco.mjtRndFlag.mjRND_HAZE,
)


@dataclass(frozen=True)
class RenderConfig:
    """What and how to render: the frames of a vector env (``VecEnvConfig.render``) and of the trainer's
    ``env.frames`` section, whose keys are these fields (``env.frames.cameras=[front,wrist]``).

    Attributes:
        width, height: frame size in pixels, 8 to 1024 each.
        cameras: camera names of the model, in this order (the gantry scene's are ``sims.scene.CAMERAS``:
            "front", "wrist"; a LIBERO scene's "agentview", "robot0_eye_in_hand"); ``rgb`` is
            ``[N, cams, 3, H, W]``.
        depth: also return linear depth in metres (``depth`` float ``[N, cams, H, W]``).
        textures: the Warp ray tracer samples the model's textures (LIBERO's scenes are textured, and its
            env always turns this on; the gantry scene has none). MuJoCo's OpenGL renderer always draws them.
        num_contexts: GL contexts (worker threads); None: one per CPU core (a trainer's env: one per
            thread it is given).
        tile_frames: frames per readback (tiles of one offscreen buffer), at most what fits in 1024x1024.
        samples: multisampling (MSAA) samples per pixel; None keeps the model's
            ``visual/quality/offsamples`` (MuJoCo's default: 4; the fast gantry scene: 0; a LIBERO env
            takes None as 0, see :class:`sims.libero.vec_env.LiberoEnvConfig`).
    """

    width: int = 64
    height: int = 64
    cameras: tuple[str, ...] = ("front",)
    depth: bool = False
    num_contexts: int | None = None
    tile_frames: int = 16
    textures: bool = False
    samples: int | None = None

    def validate(self, cameras: tuple[str, ...] | None = None) -> None:
        """Raise ValueError naming a bad field and the valid values; with ``cameras`` (the model's or the
        suite's camera names), also a camera that is not one of them."""
        if not self.cameras or len(set(self.cameras)) < len(self.cameras):
            raise ValueError(f"cameras={list(self.cameras)} must name distinct cameras (at least one)"
                             + (f"; valid: {', '.join(cameras)}" if cameras is not None else ""))
        unknown = [c for c in self.cameras if cameras is not None and c not in cameras]
        if unknown:
            raise ValueError(f"cameras={list(self.cameras)}: unknown camera(s) {unknown}; valid: {', '.join(cameras)}")
        for name in ("width", "height"):
            if not 8 <= getattr(self, name) <= 1024:
                raise ValueError(f"{name}={getattr(self, name)}: a frame's width and height must be in [8, 1024]")
        if self.tile_frames < 1:
            raise ValueError(f"tile_frames={self.tile_frames} must be at least 1")
        if self.num_contexts is not None and self.num_contexts < 1:
            raise ValueError(f"num_contexts={self.num_contexts} must be at least 1, or None (one per CPU core)")
        if self.samples is not None and not 0 <= self.samples <= 16:
            raise ValueError(f"samples={self.samples}; multisampling takes 0 (off) to 16 samples, or None (the model's)")


def camera_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """The names of the model's cameras, in id order."""
    return tuple(model.camera(i).name for i in range(model.ncam))


def project_points(cam_pos: np.ndarray, cam_mat: np.ndarray, fovy_deg: float, aspect: float,
                   points: np.ndarray) -> np.ndarray:
    """Normalised image coordinates of world ``points`` [P, 3] in a pinhole camera, [P, 2].

    ``cam_pos`` [3] and ``cam_mat`` [9] are MuJoCo's ``cam_xpos``/``cam_xmat`` (the camera looks
    along its -z axis, y up); ``aspect`` is width / height. The result is (x right, y down) with
    the image spanning ``[-1, 1]`` on both axes; points behind the camera come out as NaN.
    """
    local = (points - cam_pos) @ cam_mat.reshape(3, 3)  # world -> camera frame
    depth = -local[:, 2]
    tan_half = np.tan(np.deg2rad(fovy_deg) / 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        uv = np.stack([local[:, 0] / (depth * tan_half * aspect), -local[:, 1] / (depth * tan_half)], axis=-1)
    uv[depth <= 0] = np.nan
    return uv


def outside_view(cam_pos: np.ndarray, cam_mat: np.ndarray, fovy_deg: float, aspect: float, centres: np.ndarray,
                 radii: np.ndarray) -> np.ndarray:
    """Which bounding spheres (``centres`` [G, 3], ``radii`` [G]) lie wholly outside a pinhole
    camera's view (MuJoCo's ``cam_xpos`` [3] / ``cam_xmat`` [9], looking along -z), bool [G].

    Conservative: a sphere that touches the view pyramid (or straddles the camera) is inside, so
    hiding the outside ones leaves the frame unchanged. A radius of 0 (planes) never culls.
    """
    local = (centres - cam_pos) @ cam_mat.reshape(3, 3)
    depth = -local[:, 2]
    tan_y = np.tan(np.deg2rad(fovy_deg) / 2.0)
    tan_x = tan_y * aspect
    # distance from a side plane of the pyramid: (|x| - depth tan) cos = (|x| - depth tan) / sqrt(1 + tan^2)
    beyond_x = (np.abs(local[:, 0]) - depth * tan_x) > radii * np.sqrt(1.0 + tan_x * tan_x)
    beyond_y = (np.abs(local[:, 1]) - depth * tan_y) > radii * np.sqrt(1.0 + tan_y * tan_y)
    return (radii > 0) & ((depth < -radii) | beyond_x | beyond_y)


#: What the batch renderer does on NVIDIA's EGL driver (measured on an H200, 64x64 RGB): about 377
#: frames/s, where Mesa's llvmpipe on 2 CPU cores does 16k; the Warp backend's ray tracer renders
#: 425k env steps/s with frames at 8,192 worlds on the same GPU.
NVIDIA_EGL_WARNING = (
    "MuJoCo's EGL renderer on NVIDIA's driver ({vendor}) draws about 377 frames/s (Mesa on 2 CPU cores: "
    "16k); on a GPU render with env.backend=warp (sims: backend='warp'), which ray-traces every world at once")


def _gl_vendor() -> str:
    """The current GL context's vendor string (``GL_VENDOR``), or "" if it cannot be read."""
    try:
        from OpenGL import GL

        return (GL.glGetString(GL.GL_VENDOR) or b"").decode(errors="replace")
    except Exception:  # no PyOpenGL or no entry point: the check is advice, rendering still works
        return ""


class _Worker:
    """One GL context with its own model copy (for per-episode colours), data and scene."""

    def __init__(self, model: mujoco.MjModel, config: RenderConfig):
        from mujoco.gl_context import GLContext

        self.model = copy.copy(model)
        self.data = mujoco.MjData(self.model)
        self.config = config
        self.cols = max(1, min(1024 // config.width, config.tile_frames))
        self.rows = max(1, min(1024 // config.height, -(-config.tile_frames // self.cols)))
        # MjrContext sizes its offscreen buffer from the model (LIBERO's: 640x480); tiles beyond it
        # would be drawn outside the buffer and read back as garbage.
        glob = self.model.vis.global_
        glob.offwidth = max(glob.offwidth, self.cols * config.width)
        glob.offheight = max(glob.offheight, self.rows * config.height)
        if config.samples is not None:
            self.model.vis.quality.offsamples = config.samples
        self.model.vis.quality.shadowsize = 0  # shadows are never drawn (_FAST_OFF_FLAGS): LIBERO's 4096^2 map is 64 MB
        self.gl = GLContext(self.cols * config.width, self.rows * config.height)
        self.gl.make_current()
        self.vendor = _gl_vendor()
        self.context = mujoco.MjrContext(self.model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        self.scene = mujoco.MjvScene(self.model, maxgeom=self.model.ngeom + 10)
        for flag in _FAST_OFF_FLAGS:
            self.scene.flags[flag] = 0
        self.option = mujoco.MjvOption()
        self.option.sitegroup[:] = 0  # sites are markers for code, not for cameras
        self.option.geomgroup[_CULLED_GROUP] = 0
        drawn = np.flatnonzero((self.model.geom_type == mujoco.mjtGeom.mjGEOM_MESH)
                               & np.isin(self.model.geom_group, np.flatnonzero(self.option.geomgroup)))
        #: Mesh geoms the cameras draw: each frame hides those outside its camera's view (:func:`outside_view`).
        self.cull_geoms = drawn
        self.cull_groups = self.model.geom_group[drawn].copy()
        self.cameras = []
        self.aspect = config.width / config.height
        for name in config.cameras:
            cam = mujoco.MjvCamera()
            cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
            cam.fixedcamid = self.model.camera(name).id
            self.cameras.append(cam)
        h, w = self.rows * config.height, self.cols * config.width
        self.rgb = np.empty((h, w, 3), np.uint8)
        self.depth = np.empty((h, w), np.float32) if config.depth else None
        extent = self.model.stat.extent
        self.znear = self.model.vis.map.znear * extent
        self.zfar = self.model.vis.map.zfar * extent

    def _chunks(self, env_ids: np.ndarray) -> list[list[tuple[int, int, int]]]:
        """Frames ``(row in the batch, camera, tile)`` grouped into readbacks, each tile used once per
        readback; the tile of environment ``e``'s camera ``c`` is ``(e * cams + c) % tiles``."""
        cams, tiles = len(self.cameras), self.rows * self.cols
        chunks: list[list[tuple[int, int, int]]] = [[]]
        used: set[int] = set()
        for i, e in enumerate(env_ids.tolist()):
            for c in range(cams):
                t = (e * cams + c) % tiles
                if t in used:
                    chunks.append([])
                    used.clear()
                chunks[-1].append((i, c, t))
                used.add(t)
        return chunks

    def render(self, qpos: np.ndarray, mocap_pos: np.ndarray, rgba: np.ndarray, colour_geoms: np.ndarray,
               env_ids: np.ndarray, out_rgb: np.ndarray, out_depth: np.ndarray | None,
               points: np.ndarray | None = None, out_pixels: np.ndarray | None = None,
               body_poses: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """Render envs given by qpos [n, nq] etc. (global indices ``env_ids`` [n]) into out_rgb
        [n, cams, 3, H, W] (and depth); project ``points`` [n, P, 3] into ``out_pixels`` [n, cams, P, 2];
        ``body_poses`` = (body ids [B], positions [n, B, 3], quaternions [n, B, 4]) of bodies placed per env."""
        self.gl.make_current()
        cfg, m, d = self.config, self.model, self.data
        for chunk in self._chunks(env_ids):
            if not chunk:
                continue
            last_env = -1
            for i, c, t in chunk:
                if i != last_env:
                    d.qpos[:] = qpos[i]
                    d.mocap_pos[:] = mocap_pos[i]
                    if body_poses is not None:
                        m.body_pos[body_poses[0]], m.body_quat[body_poses[0]] = body_poses[1][i], body_poses[2][i]
                    mujoco.mj_kinematics(m, d)
                    mujoco.mj_camlight(m, d)
                    m.geom_rgba[colour_geoms] = rgba[i]
                    last_env = i
                    if points is not None and out_pixels is not None:
                        for k, cam in enumerate(self.cameras):
                            out_pixels[i, k] = project_points(d.cam_xpos[cam.fixedcamid], d.cam_xmat[cam.fixedcamid],
                                                              m.cam_fovy[cam.fixedcamid], self.aspect, points[i])
                row, col = divmod(t, self.cols)
                rect = mujoco.MjrRect(col * cfg.width, row * cfg.height, cfg.width, cfg.height)
                if len(self.cull_geoms):
                    cam_id = self.cameras[c].fixedcamid
                    out = outside_view(d.cam_xpos[cam_id], d.cam_xmat[cam_id], m.cam_fovy[cam_id], self.aspect,
                                       d.geom_xpos[self.cull_geoms], m.geom_rbound[self.cull_geoms])
                    m.geom_group[self.cull_geoms] = np.where(out, _CULLED_GROUP, self.cull_groups)
                mujoco.mjv_updateScene(m, d, self.option, None, self.cameras[c],
                                       mujoco.mjtCatBit.mjCAT_ALL, self.scene)
                mujoco.mjr_render(rect, self.scene, self.context)
            mujoco.mjr_readPixels(self.rgb, self.depth, mujoco.MjrRect(0, 0, self.rgb.shape[1], self.rgb.shape[0]),
                                  self.context)
            # OpenGL's origin is the bottom left: row r of tiles starts r*H rows from the bottom.
            for i, c, t in chunk:
                row, col = divmod(t, self.cols)
                y0 = row * cfg.height
                xs = slice(col * cfg.width, (col + 1) * cfg.width)
                tile = self.rgb[y0:y0 + cfg.height, xs][::-1]
                out_rgb[i, c] = tile.transpose(2, 0, 1)
                if out_depth is not None:
                    z = self.depth[y0:y0 + cfg.height, xs][::-1]
                    out_depth[i, c] = self.znear / (1.0 - z * (1.0 - self.znear / self.zfar))

    def close(self) -> None:
        self.gl.make_current()
        self.context.free()
        self.gl.free()


class BatchRenderer:
    """Render many environments of one model with a pool of GL contexts (see module docstring)."""

    def __init__(self, model: mujoco.MjModel, config: RenderConfig | None = None):
        """Create ``config.num_contexts`` GL contexts, each in its own worker thread."""
        self.config = config or RenderConfig()
        self.config.validate(camera_names(model))
        n = self.config.num_contexts or os.cpu_count() or 1
        self._local = threading.local()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._model = model
        self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="sims-render")
        self.num_contexts = n
        self._on_every_thread(self._worker)  # each context is created in the thread that uses it
        #: GL vendor of the contexts ("Mesa" on CPUs, "NVIDIA Corporation" on NVIDIA's EGL driver).
        self.gl_vendor = self._workers[0].vendor
        if "NVIDIA" in self.gl_vendor:
            warnings.warn(NVIDIA_EGL_WARNING.format(vendor=self.gl_vendor), RuntimeWarning, stacklevel=2)

    def _on_every_thread(self, fn) -> None:
        """Run ``fn`` once in each worker thread (a barrier keeps the calls on distinct threads)."""
        barrier = threading.Barrier(self.num_contexts)

        def call(_: int) -> None:
            fn()
            barrier.wait(timeout=60)

        list(self._pool.map(call, range(self.num_contexts)))

    def _worker(self) -> _Worker:
        worker = getattr(self._local, "worker", None)
        if worker is None:
            worker = _Worker(self._model, self.config)
            self._local.worker = worker
            with self._lock:
                self._workers.append(worker)
        return worker

    def render(self, qpos: np.ndarray, mocap_pos: np.ndarray, rgba: np.ndarray,
               layout: S.SceneLayout, points: np.ndarray | None = None,
               env_ids: np.ndarray | None = None,
               body_poses: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Frames of every environment.

        Args:
            qpos: [N, nq]; mocap_pos: [N, nmocap, 3]: the states.
            rgba: [N, len(layout.colour_geoms), 4] colours of the recoloured geoms.
            layout: the scene's addresses.
            points: optional world points [N, P, 3] to locate in every camera.
            env_ids: global indices [N] of the environments (default ``0..N-1``): an environment's
                frames are then identical whatever batch it is rendered in.
            body_poses: optional (body ids [B], positions [N, B, 3], quaternions [N, B, 4]) of bodies placed
                per environment (LIBERO's fixtures).

        Returns:
            ``rgb`` uint8 [N, cams, 3, H, W], ``depth`` float32 [N, cams, H, W] if configured, and
            with ``points`` ``pixels`` float32 [N, cams, P, 2] (:func:`project_points`).
        """
        cfg = self.config
        n, cams = len(qpos), len(cfg.cameras)
        out = {"rgb": np.empty((n, cams, 3, cfg.height, cfg.width), np.uint8)}
        if cfg.depth:
            out["depth"] = np.empty((n, cams, cfg.height, cfg.width), np.float32)
        if points is not None:
            out["pixels"] = np.empty((n, cams, points.shape[1], 2), np.float32)
        bounds = np.linspace(0, n, self.num_contexts + 1).astype(int)
        ids = np.arange(n) if env_ids is None else np.asarray(env_ids, dtype=np.int64)
        if ids.shape != (n,):
            raise ValueError(f"env_ids has shape {ids.shape}; give one global index per environment ({n},)")

        def job(k: int) -> None:
            lo, hi = bounds[k], bounds[k + 1]
            if hi > lo:
                self._worker().render(qpos[lo:hi], mocap_pos[lo:hi], rgba[lo:hi], layout.colour_geoms,
                                      ids[lo:hi], out["rgb"][lo:hi], out["depth"][lo:hi] if cfg.depth else None,
                                      None if points is None else points[lo:hi],
                                      out["pixels"][lo:hi] if points is not None else None,
                                      None if body_poses is None else (body_poses[0], body_poses[1][lo:hi],
                                                                       body_poses[2][lo:hi]))

        list(self._pool.map(job, range(self.num_contexts)))
        return out

    def close(self) -> None:
        """Free every GL context and stop the worker threads."""
        def free() -> None:
            worker = getattr(self._local, "worker", None)
            if worker is not None:
                worker.close()
                self._local.worker = None

        self._on_every_thread(free)
        self._pool.shutdown()

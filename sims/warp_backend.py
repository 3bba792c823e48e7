"""MuJoCo Warp backend: every world stepped and rendered by ``mujoco_warp`` on one Warp device.

The same model as the batch backend (island sleeping included) lives on a Warp device, ``"cpu"``
or ``"cuda:N"``. Its state arrays are handed to the environment as torch tensors that alias the
Warp arrays (``wp.to_torch``, no copy), so :func:`sims.tasks.task_signals` runs in torch on the device
(:class:`sims.xp_torch.TorchNamespace`) and observations, rewards and frames reach the policy
without leaving the device. Episode sampling stays on the host (it is the batch backend's seeded
numpy code, so both backends draw the same episodes); a reset uploads only the restarted rows.

Frames come from mujoco_warp's batched ray tracer (``create_render_context``, ``refit_bvh``,
``render``). Colours are per world: the model's ``geom_rgba`` is allocated with one row per world
(``put_model(batch_sizes={"geom_rgba": N})``) and each episode writes its colours into its row. With
``per_world_bodies`` the bodies' frames relative to their parents (``body_pos``, ``body_quat``) are per world
too, so a scene can stand its fixtures elsewhere in every world (:meth:`WarpBackend.place_bodies`, LIBERO's
fixtures re-placed per episode).
The packed BGRA pixels are reordered on the device into uint8 ``[N, cams, 3, H, W]``. The ray
tracer is set up to draw what MuJoCo's OpenGL renderer (the batch backend's) draws from the same
model: materials' specular terms and textures as :func:`gl_materials` and :func:`prefilter_texture`
give them.

On CUDA the ``frame_skip`` substeps and the render pass are captured once as CUDA graphs, and
Warp's stream is ordered against torch's current stream at every hand-over (event waits), so the
two libraries never race on a shared array. A capture that fails is an error (uncaptured stepping
is about 100x slower on the suite) unless ``uncaptured=True`` asks for eager launches.

Determinism is opt-in (``deterministic=True``, ``env.suite.warp_deterministic``): it turns on mujoco_warp's
``DeterminismType.ALL``, whose run-to-run reductions record every floating-point atomic update
and sort the records after each kernel. :func:`plan_buffers` sizes those records (and the
contact and constraint buffers) before anything is allocated and :meth:`BufferPlan.check`
refuses, in one line, a number of worlds that Warp cannot hold.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from typing import Any

import mujoco
import numpy as np
import torch

from sims.render import RenderConfig, camera_names
from sims.xp_torch import TorchNamespace

#: Contacts and constraint rows allocated per world. The suite's scripted experts peak at 19
#: contacts and 77 constraint rows with sleeping (48 environments x 240 steps, MuJoCo C); without
#: sleeping every resting object adds its contacts, so there is room for all of them.
NCONMAX = 48
NJMAX = 192

#: Solver tolerance of the Warp model (the batch model keeps MuJoCo's 1e-8). MuJoCo C solves each
#: constraint island on its own, so dofs without contacts (the gantry in the air) get their exact
#: unconstrained acceleration; mujoco_warp solves a world's constraints as one system, whose shared
#: line search and tolerance stop left those dofs short of it: 1e-2 m/s apart after one control
#: step. At 1e-10 the two agree to 1e-7 over 10 steps, for 1 % more Newton iterations (measured).
SOLVER_TOLERANCE = 1e-10

#: Arrays that ``make_data`` allocates uninitialised (``wp.empty``) when island sleeping is on,
#: and that the first solve reads: in reused memory (a second environment in one process) they
#: hold garbage and the worlds turn NaN. The backend zeroes them. (mujoco_warp 4.0.0.)
_UNINITIALISED = ("cM", "cqLD", "crhs", "cx", "cMa", "cqfrc_smooth", "cqacc_smooth", "cqacc_warmstart", "cqacc",
                  "cqfrc_constraint")


#: Largest extent of one dimension of a Warp array (a signed 32-bit int); Warp's deterministic
#: record buffers are one-dimensional, and so is the byte workspace that sorts them.
INT32_MAX = 2**31 - 1
#: Bytes of sort-reduce workspace per deterministic record: 40 from Warp 1.19's own size query
#: (``wp_deterministic_sort_reduce_workspace_size``, float32 sums) plus CUB's temporary storage,
#: 0.41 per record on the H200 (the 7,627,550,207-byte request at 1,024 worlds = 40 x 188,743,680
#: records + 256 + 77.8 MB). The records themselves add 12 bytes each (int64 key, float32 value).
DET_WORKSPACE_BYTES_PER_RECORD = 40.42
#: Lanes per constraint group in mujoco_warp's sparse Hessian kernels (``_JTDAJ_THREADS_PER_GROUP``)
#: and per tile of its dense contact Jacobian (``BlockDim.contact_jac_tiled``), mujoco_warp 4.0.0.
_JTDAJ_LANES = 32
_CONTACT_JAC_TILE = 32


@dataclasses.dataclass(frozen=True)
class BufferPlan:
    """Sizes mujoco_warp allocates for ``nworld`` worlds, computed without allocating anything.

    ``contacts`` (``naconmax``) and ``constraint_rows`` (nworld x njmax) are the data's buffers;
    ``det_records`` is the largest deterministic launch's record buffer (0 when not deterministic)
    and ``det_workspace_bytes`` the one-dimensional byte array that sorts it.
    """

    nworld: int
    contacts: int
    constraint_rows: int
    jacobian_entries: int
    det_records: int
    det_workspace_bytes: int
    det_records_per_world: int

    def check(self) -> None:
        """Raise if Warp cannot allocate these buffers.

        Raises:
            ValueError: a buffer over Warp's 2^31 - 1 limit, in one line naming the buffer, the
                largest number of worlds that fits, and the setting that avoids it.
        """
        if self.contacts > INT32_MAX:
            raise ValueError(f"{self.nworld} Warp worlds need {self.contacts} contact slots (over 2^31 - 1): "
                             f"use at most {INT32_MAX // (self.contacts // self.nworld)} worlds or a smaller nconmax")
        if self.det_records and max(self.det_records, self.det_workspace_bytes) > INT32_MAX:
            fits = int(INT32_MAX / (self.det_records_per_world * DET_WORKSPACE_BYTES_PER_RECORD))
            raise ValueError(
                f"deterministic Warp at {self.nworld} worlds needs {self.det_records} atomic records and a "
                f"{self.det_workspace_bytes}-byte sort workspace (Warp's limit: 2^31 - 1): set "
                f"env.suite.warp_deterministic=false (the default) or use at most {fits} worlds")


def plan_buffers(nv: int, nworld: int, nconmax: int = 48, njmax: int = 192, deterministic: bool = False,
                 sparse: bool = False) -> BufferPlan:
    """What mujoco_warp 4.0.0 allocates for ``nworld`` worlds of a model with ``nv`` dofs.

    With determinism, the largest record buffer is a kernel's threads x its records per thread.
    The sparse-Jacobian Hessian (``_JTDACJ_sparse``, ``_update_gradient_h_incremental_sparse``)
    gives each of 32 lanes per constraint group room for every row of its group times its share of
    the whole nv(nv+1)/2 triangle: at least nworld x 32 x njmax x ceil(nv(nv+1)/2 / 32) records
    (184,320 per world for the suite; exact when the groups divide njmax), however few dofs a row
    touches. The dense path's largest is the tiled contact Jacobian: 32 lanes x ceil(nv_pad / 32)
    tiles per world, njmax records each (12,288 per world for the suite).

    Args:
        nv: degrees of freedom of the model; nworld: worlds; nconmax, njmax: contacts and
            constraint rows per world; deterministic: ``DeterminismType.ALL``; sparse: whether
            mujoco_warp uses the sparse Jacobian (it does above 32 dofs unless told otherwise).
    """
    nv_pad = -(-nv // 16) * 16  # mujoco_warp's TILE_SIZE_JTDAJ (16) above 32 dofs
    per_world = 0
    if deterministic and sparse:
        per_world = _JTDAJ_LANES * njmax * -(-(nv * (nv + 1) // 2) // _JTDAJ_LANES)
    elif deterministic:
        per_world = _CONTACT_JAC_TILE * -(-nv_pad // _CONTACT_JAC_TILE) * njmax
    records = nworld * per_world
    return BufferPlan(nworld=nworld, contacts=nworld * nconmax, constraint_rows=nworld * njmax,
                      jacobian_entries=nworld * njmax * nv_pad, det_records=records,
                      det_workspace_bytes=math.ceil(records * DET_WORKSPACE_BYTES_PER_RECORD),
                      det_records_per_world=per_world)


#: Ray-traced textures are box-filtered to at most this fraction of the frame's larger side (see
#: :func:`prefilter_texture`); measured on LIBERO's spatial/0 against EGL, mean frame difference
#: (agentview, wrist): 3.6, 5.3 levels unfiltered, 2.4, 4.3 at half of 64x64, 2.6, 4.4 at 64x64;
#: 2.7, 4.2 at half of 128x128, 2.9, 4.4 at 128x128.
TEXTURE_FRACTION = 0.5
#: Smallest material shininess the ray tracer gets (see :func:`gl_materials`).
MIN_SHININESS = 1e-6


def gl_materials(model: mujoco.MjModel, texture_mean: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Material shininess and specular, each [nmat], with which mujoco_warp's ray tracer lights a
    surface as MuJoCo's OpenGL renderer does.

    - OpenGL raises the specular cosine to ``128 * shininess``: at shininess 0 a light adds its
      full specular wherever it reaches; mujoco_warp drops the term at exponent 0. Shininess is
      raised to :data:`MIN_SHININESS` (an exponent of 1.3e-4: the same full specular).
    - OpenGL multiplies the lit colour, specular included, by the texture (MuJoCo does not
      separate the specular colour); mujoco_warp adds the specular after the texture. A textured
      material's specular is scaled by its texture's mean colour (exact for a uniform texture).

    Args:
        model: the model; texture_mean: each texture's mean colour in [0, 1], [ntex] (None:
            textures are not drawn).
    """
    shininess = np.maximum(model.mat_shininess, MIN_SHININESS)
    specular = model.mat_specular.copy()
    if texture_mean is not None:
        tex = model.mat_texid[:, mujoco.mjtTextureRole.mjTEXROLE_RGB]
        specular[tex >= 0] *= texture_mean[tex[tex >= 0]]
    return shininess, specular


def prefilter_texture(pixels: np.ndarray, side: int) -> np.ndarray:
    """A texture's pixels uint8 [h, w, c] box-filtered to at most ``side`` pixels a side, as float32
    RGBA [h', w', 4] in [0, 1] (Warp's texture format).

    OpenGL samples a minified texture from its mipmaps (the average of the texels a pixel covers);
    mujoco_warp samples the full texture at one point per pixel, so a 4096 x 4096 texture on an
    object a few pixels wide comes out as noise of its texels. Filtering the texture to about the
    size at which the frame shows it stands in for the mipmap level.
    """
    from PIL import Image

    h, w, c = pixels.shape
    rgba = np.concatenate([pixels[..., :3] if c >= 3 else np.repeat(pixels[..., :1], 3, axis=2),
                           pixels[..., 3:4] if c == 4 else np.full((h, w, 1), 255, np.uint8)], axis=2)
    if max(h, w) > side:
        size = (max(1, round(w * side / max(h, w))), max(1, round(h * side / max(h, w))))
        rgba = np.asarray(Image.fromarray(np.ascontiguousarray(rgba), "RGBA").resize(size, Image.BOX))
    return rgba.astype(np.float32) / 255.0


def warp_device_for(device: str) -> str:
    """The Warp device for ``device``: "cpu", "cuda:N", or "auto" (the first GPU, else the CPU).

    Raises:
        ValueError: a device Warp does not have; the message lists the ones it has.
    """
    import warp as wp

    if wp.config.log_level == wp.LOG_INFO:  # the default prints a line per kernel module loaded
        wp.config.log_level = wp.LOG_WARNING
    wp.init()
    names = [str(d) for d in wp.get_devices()]
    if device == "auto":
        return "cuda:0" if wp.get_cuda_device_count() > 0 else "cpu"
    if device == "cuda":
        device = "cuda:0"
    if device not in names:
        raise ValueError(f"warp_device={device!r} is not a Warp device here; available: {names} or 'auto'")
    return device


def _array_fields(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(path, wp.array) of every array in a mujoco_warp dataclass, nested dataclasses included."""
    import warp as wp

    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name, None)
        if isinstance(value, wp.array):
            out.append((prefix + f.name, value))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.extend(_array_fields(value, prefix + f.name + "."))
    return out


class WarpBackend:
    """``num_envs`` worlds of one model in mujoco_warp, with an optional batched renderer.

    The backend interface of :mod:`sims.backends` (``set_state``, ``step``, ``qpos``/``qvel``/
    ``mocap_pos``, ``get_state``/``restore``) with torch tensors on :attr:`device`, plus the
    renderer's ``set_colours`` and ``render``.
    """

    renders = True
    deferred: Any = None
    """A :class:`sims.deferred.DeferredChecks` while the overflow check is deferred (see its module)."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, frame_skip: int, device: str = "auto",
                 render: RenderConfig | None = None, colour_geoms: np.ndarray | None = None,
                 nconmax: int = NCONMAX, njmax: int = NJMAX, deterministic: bool = False,
                 uncaptured: bool = False, forward_after_step: bool = False, per_world_bodies: bool = False):
        """Args: model; num_envs worlds; frame_skip substeps per step; device ("cpu", "cuda:N" or
        "auto"); render: what to render (None: no renderer); colour_geoms: ids of the geoms whose
        colour each episode sets; nconmax, njmax: contacts and constraint rows per world;
        deterministic: mujoco_warp's ``DeterminismType.ALL`` (run-to-run identical on a GPU; the
        CPU device runs serially and is deterministic anyway), on the dense Jacobian, whose
        deterministic records are 15x fewer than the sparse one's (:func:`plan_buffers`);
        uncaptured: on CUDA, step with eager launches instead of CUDA graphs (slow; for drivers
        without graph support); forward_after_step: end each step with ``mjw.forward`` (poses and
        sensors of the new state, as LIBERO's controllers read them), inside the step's graph;
        per_world_bodies: ``body_pos`` and ``body_quat`` with one row per world (:meth:`place_bodies`).

        Raises:
            ValueError: buffers for ``num_envs`` worlds that Warp cannot allocate
                (:meth:`BufferPlan.check`), or CUDA graphs impossible (Warp's memory pool off).
        """
        import mujoco_warp as mjw
        import warp as wp
        from mujoco_warp._src.io import is_sparse  # mujoco_warp's own rule (sparse above 32 dofs)

        if deterministic:  # a copy: the caller's model keeps its Jacobian
            model = copy.copy(model)
            model.opt.jacobian = mujoco.mjtJacobian.mjJAC_DENSE
        self.buffer_plan = plan_buffers(model.nv, num_envs, nconmax, njmax, deterministic,
                                        sparse=is_sparse(model))
        self.buffer_plan.check()
        self.deterministic = deterministic

        self._wp, self._mjw = wp, mjw
        self.renders = render is not None
        name = warp_device_for(device)
        self.wp_device = wp.get_device(name)
        self.device = torch.device(name)
        self.xp = self.ax = TorchNamespace(self.device)
        self.frame_skip = frame_skip
        self.forward_after_step = forward_after_step
        self.num_envs = num_envs
        self._cuda = self.wp_device.is_cuda
        self._stream = self.wp_device.stream if self._cuda else None
        per_world = (["geom_rgba"] if self.renders else []) + (["body_pos", "body_quat"] if per_world_bodies else [])
        self._put_on_device(model, num_envs, nconmax, njmax, per_world)
        self._qpos = wp.to_torch(self.d.qpos)
        self._qvel = wp.to_torch(self.d.qvel)
        self._mocap_pos = wp.to_torch(self.d.mocap_pos)
        self._ctrl = wp.to_torch(self.d.ctrl)
        self._overflow = wp.to_torch(self.d.overflow)
        self._reset_mask = wp.to_torch(self._reset_mask_wp)
        self._fields = _array_fields(self.d)
        # The model's per-world arrays are state too: a snapshot holds each world's colours and body frames.
        self._fields += [(f"model.{name}", getattr(self.m, name)) for name in per_world]
        self._body_pos = wp.to_torch(self.m.body_pos) if per_world_bodies else None
        self._body_quat = wp.to_torch(self.m.body_quat) if per_world_bodies else None

        self._rc = None
        if self.renders:
            self._init_renderer(model, render, colour_geoms)
        # CUDA graphs of the substeps and of the render pass, captured after their first eager
        # call (which loads the kernels) from a real episode state.
        self._step_graph = self._render_graph = None
        self._capture = self._cuda and not uncaptured
        if self._capture and not wp.is_mempool_enabled(self.wp_device):
            raise ValueError(f"CUDA graphs need Warp's memory pool on {name}, which is off: call "
                             "wp.set_mempool_enabled(device, True) or set env.suite.warp_uncaptured=true (about 100x slower)")

    def _put_on_device(self, model: mujoco.MjModel, num_envs: int, nconmax: int, njmax: int,
                       per_world: list[str]) -> None:
        """The Warp model (``per_world`` fields with one row per world) and data of ``num_envs`` worlds, with the
        solver's settings and the overflow flags that count as a capacity error."""
        wp, mjw = self._wp, self._mjw
        with wp.ScopedDevice(self.wp_device):
            self.m = mjw.put_model(model, batch_sizes={name: num_envs for name in per_world} or None)
            self.m.opt.tolerance.fill_(SOLVER_TOLERANCE)
            # Iteration limits are reached now and then, as in MuJoCo C (which says nothing): no print.
            flag = mjw.OverflowType
            self.m.opt.warn_overflow = int(self.m.opt.warn_overflow) & ~int(flag.ITERATIONS | flag.LS_ITERATIONS)
            self._capacity = int(flag.NEFC | flag.NJMAX_NNZ | flag.BROADPHASE | flag.NARROWPHASE | flag.CCD
                                 | flag.NVMAX)
            if self.deterministic:
                self.m.opt.deterministic = int(mjw.DeterminismType.ALL)
            self.d = mjw.make_data(model, nworld=num_envs, nconmax=nconmax, njmax=njmax)
            for field in _UNINITIALISED:
                arr = getattr(self.d, field, None)
                if arr is not None and arr.size:
                    arr.zero_()
            self._reset_mask_wp = wp.zeros(num_envs, dtype=bool)

    # ----------------------------------------------------------------------------- streams
    @contextlib.contextmanager
    def _on_warp(self):
        """Run Warp launches after torch's queued work on this device, and torch's after them."""
        wp = self._wp
        if self._cuda:
            self._stream.wait_stream(wp.stream_from_torch(torch.cuda.current_stream(self.device)))
        with wp.ScopedDevice(self.wp_device):
            yield
        if self._cuda:
            torch.cuda.current_stream(self.device).wait_stream(wp.stream_to_torch(self._stream))

    @property
    def graphs_captured(self) -> dict[str, bool]:
        """Which passes run as captured CUDA graphs: ``step`` (the substeps) and ``render`` (False on
        the CPU, and before a pass's first call)."""
        return {"step": self._step_graph is not None, "render": self._render_graph is not None}

    def _graph(self, launches) -> Any:
        """``launches`` recorded as a CUDA graph (recording runs nothing).

        Raises:
            RuntimeError: the capture failed; running on uncaptured costs about 100x, so this is
                no fallback: the message names the cause and the settings that avoid it.
        """
        try:
            with self._wp.ScopedCapture() as capture:
                launches()
        except Exception as exc:
            hint = "set env.suite.warp_deterministic=false, or " if self.deterministic else ""
            raise RuntimeError(f"CUDA graph capture of mujoco_warp failed ({type(exc).__name__}: {exc}); {hint}"
                               "set env.suite.warp_uncaptured=true to step without graphs (about 100x slower)") from exc
        return capture.graph

    def _substeps(self) -> None:
        for _ in range(self.frame_skip):
            self._mjw.step(self.m, self.d)
        if self.forward_after_step:
            self._mjw.forward(self.m, self.d)

    # ----------------------------------------------------------------------------- physics
    def compile(self, fn: Any) -> Any:
        """``fn`` as this backend runs it (eager torch on the device)."""
        return fn

    @property
    def qpos(self) -> torch.Tensor:
        return self._qpos

    @property
    def qvel(self) -> torch.Tensor:
        return self._qvel

    @property
    def mocap_pos(self) -> torch.Tensor:
        return self._mocap_pos

    def set_state(self, ids: np.ndarray, qpos: np.ndarray, mocap_pos: np.ndarray, ctrl: np.ndarray,
                  qvel: np.ndarray | None = None) -> None:
        """Restart worlds ``ids`` (warm starts, sleep, time zeroed; velocities zeroed, or ``qvel`` [n, nv]) from these values."""
        idx = torch.as_tensor(ids, device=self.device)
        self._reset_mask.zero_()
        self._reset_mask[idx] = True
        with self._on_warp():
            self._mjw.reset_data(self.m, self.d, reset=self._reset_mask_wp)
        self._qpos[idx] = self.ax.asarray(qpos)
        self._mocap_pos[idx] = self.ax.asarray(mocap_pos)
        self._ctrl[idx] = self.ax.asarray(ctrl)
        if qvel is not None:
            self._qvel[idx] = self.ax.asarray(qvel)

    def place_bodies(self, ids: np.ndarray, bodies: np.ndarray, pos: np.ndarray, quat: np.ndarray) -> None:
        """Stand bodies ``bodies`` [B] of worlds ``ids`` at ``pos`` [n, B, 3] and ``quat`` [n, B, 4] (wxyz), relative
        to their parents; in place, so captured graphs keep reading them. Call before :meth:`set_state`.

        Raises:
            ValueError: the backend was built without ``per_world_bodies``.
        """
        if self._body_pos is None:
            raise ValueError("bodies placed per world need WarpBackend(per_world_bodies=True)")
        rows = torch.as_tensor(np.asarray(ids), device=self.device)[:, None]
        cols = torch.as_tensor(np.asarray(bodies), device=self.device)[None, :]
        self._body_pos[rows, cols] = torch.as_tensor(np.asarray(pos), dtype=self._body_pos.dtype, device=self.device)
        self._body_quat[rows, cols] = torch.as_tensor(np.asarray(quat), dtype=self._body_quat.dtype, device=self.device)

    def step(self, ctrl: torch.Tensor) -> None:
        """Apply ``ctrl`` [N, nu] and advance every world by ``frame_skip`` substeps.

        Raises:
            RuntimeError: a world ran out of contact or constraint rows (its physics is wrong);
                solver iteration limits, reached now and then as in MuJoCo C, are no error.
        """
        self._ctrl.copy_(ctrl)
        with self._on_warp():
            if self._step_graph is not None:
                self._wp.capture_launch(self._step_graph)
            else:
                self._substeps()
                if self._capture:
                    self._step_graph = self._graph(self._substeps)
        full = self._overflow & self._capacity  # sticky per world until its reset
        if self.deferred is not None:  # read once at the block's end (sims.deferred), not per step
            self.deferred.add("overflow", full != 0)
        elif bool(full.any()):
            worlds = torch.nonzero(full).flatten()[:10].tolist()
            raise RuntimeError(f"mujoco_warp overflow in worlds {worlds} (flags {self._overflow[worlds].tolist()}): "
                               f"raise sims.warp_backend.NCONMAX / NJMAX (now {NCONMAX} / {NJMAX})")

    def get_state(self) -> dict[str, Any]:
        """Snapshot: every array of the device data (and the per-world colours), copied to numpy."""
        with self._on_warp():
            return {"arrays": {name: arr.numpy().copy() for name, arr in self._fields}}

    def restore(self, state: dict[str, Any]) -> None:
        """Write :meth:`get_state`'s snapshot back into the device arrays (in place).

        Raises:
            ValueError: the snapshot is of another model, number of worlds or array sizes.
        """
        arrays = dict(self._fields)
        saved = state["arrays"]
        bad = sorted(k for k in arrays if k not in saved or saved[k].shape != arrays[k].numpy().shape)
        if bad or set(saved) - set(arrays):
            raise ValueError(f"Warp snapshot does not fit this backend (arrays {bad[:5]} differ); build the env "
                             "with the config it was saved with")
        with self._on_warp():
            for name, arr in arrays.items():
                arr.assign(saved[name])

    # ----------------------------------------------------------------------------- rendering
    def _init_renderer(self, model: mujoco.MjModel, config: RenderConfig, colour_geoms: np.ndarray | None) -> None:
        config.validate(camera_names(model))
        self.render_config = config
        self._colour_geoms = torch.as_tensor(np.asarray(colour_geoms if colour_geoms is not None else []),
                                             device=self.device, dtype=torch.int64)
        self._cam_ids = [model.camera(c).id for c in config.cameras]
        self._cam_fovy = [float(model.cam_fovy[c]) for c in self._cam_ids]
        with self._wp.ScopedDevice(self.wp_device):
            # Geom groups 0-2 are what MuJoCo's default visual option shows (colliders sit in group 3).
            # Textures are uploaded below, prefiltered, instead of at full size by mujoco_warp.
            self._rc = self._mjw.create_render_context(
                model, nworld=self.num_envs, cam_res=(config.width, config.height), render_rgb=True,
                render_depth=config.depth, use_textures=False, use_shadows=False,
                enabled_geom_groups=[0, 1, 2], cam_active=list(config.cameras))
            self._upload_materials(model, config)
        self._rgba = self._wp.to_torch(self.m.geom_rgba)  # [N, ngeom, 4]
        n, hw = self.num_envs, config.width * config.height
        self._packed = self._wp.to_torch(self._rc.rgb_data).view(torch.uint8).view(n, -1, 4)  # BGRA per pixel
        self._rgb_adr = self._rc.rgb_adr.numpy().tolist()
        self._bgr = torch.tensor([2, 1, 0], device=self.device)
        self._depth = self._wp.to_torch(self._rc.depth_data) if config.depth else None
        self._depth_adr = self._rc.depth_adr.numpy().tolist()
        self._hw = hw

    def _upload_materials(self, model: mujoco.MjModel, config: RenderConfig) -> None:
        """Set the ray tracer's textures (:func:`prefilter_texture`) and the Warp model's material
        shininess and specular (:func:`gl_materials`); on the Warp device, before the first render."""
        from mujoco_warp._src.render_util import texture_pixels  # decodes by-reference textures too

        wp = self._wp
        texture_mean = None
        if config.textures and model.ntex:
            side = max(1, round(max(config.width, config.height) * TEXTURE_FRACTION))
            filtered = [prefilter_texture(texture_pixels(model, t), side) for t in range(model.ntex)]
            texture_mean = np.array([f[..., :3].mean() for f in filtered])
            registry = [wp.Texture2D(f, filter_mode=wp.TextureFilterMode.LINEAR, device=self.wp_device)
                        for f in filtered]
            self._rc.textures_registry = registry
            self._rc.textures = wp.array(registry, dtype=wp.Texture2D, device=self.wp_device)
            self._rc.use_textures = True  # read when the render kernel is built, at the first render
        shininess, specular = gl_materials(model, texture_mean)
        if model.nmat:
            self.m.mat_shininess.assign(shininess.astype(np.float32)[None])
            self.m.mat_specular.assign(specular.astype(np.float32)[None])

    def _render_launches(self) -> None:
        mjw = self._mjw
        mjw.kinematics(self.m, self.d)  # positions of the current qpos (a step leaves the pre-step ones)
        mjw.camlight(self.m, self.d)
        mjw.refit_bvh(self.m, self.d, self._rc)
        mjw.render(self.m, self.d, self._rc)

    def set_colours(self, ids: np.ndarray, rgba: np.ndarray) -> None:
        """Colour geoms ``colour_geoms`` of worlds ``ids``: ``rgba`` [len(ids), len(colour_geoms), 4]."""
        if self.renders:
            idx = torch.as_tensor(ids, device=self.device)
            self._rgba[idx[:, None], self._colour_geoms[None, :]] = self.ax.asarray(rgba)

    def render(self, points: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Frames of every world at the current state.

        Args:
            points: optional world points [N, P, 3] to locate in every camera.

        Returns:
            ``rgb`` uint8 [N, cams, 3, H, W], ``depth`` float32 [N, cams, H, W] (camera-axis
            metres) if configured, and with ``points`` ``pixels`` float32 [N, cams, P, 2] as
            :func:`sims.render.project_points` gives them (NaN behind the camera).
        """
        cfg = self.render_config
        with self._on_warp():
            if self._render_graph is not None:
                self._wp.capture_launch(self._render_graph)
            else:
                self._render_launches()
                if self._capture:
                    self._render_graph = self._graph(self._render_launches)
        n, h, w = self.num_envs, cfg.height, cfg.width
        # Each camera's pixels: [N, H*W, 4] BGRA -> [N, 3, H, W] RGB, one gather per camera.
        frames = [self._packed[:, a:a + self._hw].view(n, h, w, 4).permute(0, 3, 1, 2)[:, self._bgr]
                  for a in self._rgb_adr]
        out = {"rgb": frames[0][:, None] if len(frames) == 1 else torch.stack(frames, dim=1)}
        if self._depth is not None:
            out["depth"] = torch.stack([self._depth[:, a:a + self._hw] for a in self._depth_adr], 1).reshape(
                n, -1, h, w).clone()
        if points is not None:
            out["pixels"] = self._project(points)
        return out

    def _project(self, points: torch.Tensor) -> torch.Tensor:
        """Normalised image coordinates of ``points`` [N, P, 3] in each camera, [N, cams, P, 2]."""
        cam_pos = self._wp.to_torch(self.d.cam_xpos)  # [N, ncam, 3]
        cam_mat = self._wp.to_torch(self.d.cam_xmat)  # [N, ncam, 3, 3]
        aspect = self.render_config.width / self.render_config.height
        out = []
        for cam, fovy in zip(self._cam_ids, self._cam_fovy):
            local = torch.einsum("npi,nij->npj", points - cam_pos[:, None, cam], cam_mat[:, cam])  # world -> camera
            depth = -local[..., 2]
            tan_half = float(np.tan(np.deg2rad(fovy) / 2.0))
            uv = torch.stack([local[..., 0] / (depth * tan_half * aspect), -local[..., 1] / (depth * tan_half)], -1)
            out.append(torch.where((depth > 0)[..., None], uv, torch.nan))
        return torch.stack(out, dim=1)

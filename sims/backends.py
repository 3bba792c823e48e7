"""Physics backends behind one small interface.

A backend holds ``num_envs`` simulations of one model and offers:

- ``set_state(ids, qpos, mocap_pos, ctrl)``: start those simulations afresh from these values
  (velocities, warm starts and time zeroed; ``batch`` and ``warp`` also take ``qvel=`` [n, nv], the
  velocities to start from);
- ``step(ctrl)``: apply controls [N, nu] to all simulations and advance ``frame_skip`` substeps;
- ``qpos``, ``qvel``, ``mocap_pos``: the current state, arrays of the backend's module ``xp``;
- ``xp``: the array module that :func:`sims.tasks.task_signals` runs with (``numpy``, ``jax.numpy``,
  or torch on a device through :class:`sims.xp_torch.TorchNamespace`);
- ``ax``: the array module of what the environment hands out (``numpy`` on the host, or a
  :class:`~sims.xp_torch.TorchNamespace` on the backend's device: observations stay there);
- ``compile(fn)``: ``fn`` as the backend runs it (jitted for MJX);
- ``get_state()`` / ``restore(state)``: a snapshot of every simulation, restored bit for bit;
- ``renders``: whether the backend renders its own frames (``set_colours(ids, rgba)``,
  ``render(points)``); otherwise the environment renders with :class:`sims.render.BatchRenderer`.

:class:`BatchBackend` runs ``mujoco.batch.Batch`` (threaded CPU, bit-identical at any thread
count); :class:`MjxBackend` runs MJX (``jax.vmap`` + ``jax.jit``), its results reaching torch by
DLPack; :class:`sims.warp_backend.WarpBackend` runs MuJoCo Warp on a Warp device, with its own
batched renderer. ``"mjx-warp"`` (MJX's Warp implementation) is gone: see :func:`make_backend`.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import mujoco
import mujoco.batch
import numpy as np

BACKENDS = ("batch", "mjx", "warp")


def to_numpy(x: Any) -> np.ndarray:
    """A numpy view (CPU) or copy (device) of a numpy array, torch tensor or JAX array (no torch import)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().cpu().numpy()
    return np.asarray(x)


class BatchBackend:
    """``mujoco.batch.Batch``: many simulations of one model on a thread pool.

    Snapshots: a simulation's state row (``mjSTATE_INTEGRATION``: positions, velocities,
    warm start, controls, mocap) does not hold its island-sleep state, which lives in the
    persistent batch's per-simulation ``MjData`` and which ``mujoco.batch`` offers no way to
    write. A restored simulation whose bodies had been asleep would wake them and drift. So the
    backend logs each simulation's episode start and the controls it applied since, and
    :meth:`restore` replays them (physics only, bit-identical at any thread count) and checks that
    the replayed state rows equal the saved ones.
    """

    xp = ax = np
    renders = False

    def __init__(self, model: mujoco.MjModel, num_envs: int, frame_skip: int, num_threads: int | None = None,
                 persistent: bool = False):
        """Args: model; num_envs simulations; frame_skip substeps per step; num_threads (None: all CPUs);
        persistent: keep one ``MjData`` per simulation (always with sleeping), so that a step's ``stage``
        (:meth:`step`) carries into the next step instead of being computed twice."""
        self.model = model
        self.frame_skip = frame_skip
        nthread = num_threads if num_threads is not None else (os.cpu_count() or 1)
        # Sleeping needs one MjData per simulation (a persistent batch).
        sleep = bool(model.opt.enableflags & mujoco.mjtEnableBit.mjENBL_SLEEP)
        self.batch = mujoco.batch.Batch(model, num_envs, nthread=max(1, min(nthread, num_envs)),
                                        persistent=sleep or persistent)
        self._qpos = self.batch.bind("qpos")
        self._qvel = self.batch.bind("qvel")
        self._ctrl = self.batch.bind("ctrl")
        self._mocap_pos = self.batch.bind("mocap_pos")
        # Replay log: controls applied at global steps [_base, _t); simulation i started at _start_step[i].
        self._t = 0
        self._base = 0
        self._log: list[np.ndarray] = []
        self._start_step = np.zeros(num_envs, np.int64)
        self._start = {"qpos": self._qpos.copy(), "qvel": self._qvel.copy(), "mocap_pos": self._mocap_pos.copy(),
                       "ctrl": self._ctrl.copy()}

    def compile(self, fn: Any) -> Any:
        """``fn`` as this backend runs it (numpy: as it is)."""
        return fn

    @property
    def qpos(self) -> np.ndarray:
        return self._qpos

    @property
    def qvel(self) -> np.ndarray:
        return self._qvel

    @property
    def mocap_pos(self) -> np.ndarray:
        return self._mocap_pos

    def set_state(self, ids: np.ndarray, qpos: np.ndarray, mocap_pos: np.ndarray, ctrl: np.ndarray,
                  qvel: np.ndarray | None = None) -> None:
        """Restart simulations ``ids`` from these positions, mocap placements and controls, at rest or with
        velocities ``qvel`` [n, nv]."""
        qvel = np.zeros((len(ids), self.model.nv)) if qvel is None else qvel
        self._start_sims(ids, qpos, qvel, mocap_pos, ctrl)
        for key, value in (("qpos", qpos), ("qvel", qvel), ("mocap_pos", mocap_pos), ("ctrl", ctrl)):
            self._start[key][ids] = value
        self._start_step[ids] = self._t
        drop = int(self._start_step.min()) - self._base
        if drop > 0:  # no running episode needs these controls any more
            del self._log[:drop]
            self._base += drop

    def _start_sims(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray, mocap_pos: np.ndarray,
                    ctrl: np.ndarray) -> None:
        self.batch.reset(ids, stage=mujoco.mjtStage.mjSTAGE_NONE)
        self._qpos[ids] = qpos
        self._qvel[ids] = qvel
        self._mocap_pos[ids] = mocap_pos
        self._ctrl[ids] = ctrl

    def step(self, ctrl: np.ndarray, stage: int = mujoco.mjtStage.mjSTAGE_NONE) -> None:
        """Apply ``ctrl`` [N, nu] and advance every simulation by ``frame_skip`` substeps; ``stage``: the forward
        stages to compute at the new state (``mujoco.batch.Batch.step``; NONE: derived fields describe the state
        before the last substep, as after ``mj_step``)."""
        self._ctrl[:] = ctrl
        self.batch.step(nstep=self.frame_skip, stage=stage)
        self._log.append(np.array(ctrl, dtype=np.float64))
        self._t += 1

    def get_state(self) -> dict[str, Any]:
        """Snapshot: state rows ``[N, nstate]``, episode starts, controls since ``[L, N, nu]``, start offsets ``[N]``."""
        log = np.stack(self._log) if self._log else np.zeros((0, *self._ctrl.shape))
        return {"rows": self.batch.state.copy(), "start": {k: v.copy() for k, v in self._start.items()},
                "controls": log, "offset": self._start_step - self._base}

    def restore(self, state: dict[str, Any]) -> None:
        """Rebuild every simulation from :meth:`get_state`'s snapshot by replaying its episode.

        Raises:
            ValueError: the snapshot is of another number of simulations or model.
            RuntimeError: the replayed state differs from the saved one (another MuJoCo build).
        """
        rows, offset, controls = state["rows"], np.asarray(state["offset"]), state["controls"]
        if rows.shape != self.batch.state.shape:
            raise ValueError(f"simulator snapshot of shape {rows.shape} cannot be restored into a batch of "
                             f"{self.batch.state.shape} (num_envs x state size); build the env as it was saved")
        ids = np.arange(rows.shape[0])
        # A snapshot without start velocities (written before set_state took them) started at rest.
        start = {"qvel": np.zeros((len(ids), self.model.nv)), **state["start"]}
        self._start_sims(ids, start["qpos"], start["qvel"], start["mocap_pos"], start["ctrl"])
        for t in range(len(controls)):
            live = ids[offset <= t]
            if len(live):
                self._ctrl[live] = controls[t, live]
                self.batch.step(ids=live, nstep=self.frame_skip)
        if not np.array_equal(self.batch.state, rows):
            bad = np.flatnonzero((self.batch.state != rows).any(axis=1))
            raise RuntimeError(f"replaying the simulator snapshot did not reproduce simulations {bad[:10].tolist()}; "
                               "was it written by another MuJoCo version?")
        self._start = {k: v.copy() for k, v in start.items()}
        self._log = list(controls)
        self._t = len(controls)
        self._base = 0
        self._start_step = offset.astype(np.int64).copy()


class MjxBackend:
    """MJX: the same model vmapped and jitted with JAX (CPU or accelerator).

    Results reach the environment as torch tensors on the JAX device by DLPack (no copy); resets
    upload only the restarted rows' values. JAX's GPU memory is allocated on demand
    (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, set by ``import sims`` unless already set), so that
    several shards share one GPU.
    """

    renders = False

    def __init__(self, model: mujoco.MjModel, num_envs: int, frame_skip: int):
        """Args: model; num_envs simulations; frame_skip substeps per step."""
        import jax
        import jax.numpy as jnp
        from mujoco import mjx

        from sims.xp_torch import TorchNamespace

        self.xp = jnp
        self.frame_skip = frame_skip
        model = copy.copy(model)
        model.opt.enableflags &= ~int(mujoco.mjtEnableBit.mjENBL_SLEEP)  # MJX has no sleeping
        self.mjx_model = mjx.put_model(model)
        data0 = mjx.make_data(self.mjx_model)
        self._data = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (num_envs, *x.shape)), data0)
        jax_device = next(iter(self._data.qpos.devices()))
        self.ax = TorchNamespace("cpu" if jax_device.platform == "cpu" else f"cuda:{jax_device.id}")
        self.device = self.ax.device

        def substeps(data: Any, ctrl: Any) -> Any:
            data = data.replace(ctrl=ctrl)

            def body(d: Any, _: Any) -> tuple[Any, None]:
                return mjx.step(self.mjx_model, d), None

            return jax.lax.scan(body, data, None, length=frame_skip)[0]

        def restart(data: Any, mask: Any, qpos: Any, mocap_pos: Any, ctrl: Any) -> Any:
            fresh = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (mask.shape[0], *x.shape)), data0)
            fresh = fresh.replace(qpos=qpos, mocap_pos=mocap_pos, ctrl=ctrl)

            def choose(new: Any, old: Any) -> Any:
                return jnp.where(mask.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)

            return jax.tree_util.tree_map(choose, fresh, data)

        self._step = jax.jit(jax.vmap(substeps))
        self._restart = jax.jit(restart)
        self._shapes = (num_envs, model.nq, model.nmocap, model.nu)

    def compile(self, fn: Any) -> Any:
        """``fn`` jitted (array arguments traced, the rest static by closure)."""
        import jax

        return jax.jit(fn)

    @property
    def qpos(self) -> Any:
        return self._data.qpos

    @property
    def qvel(self) -> Any:
        return self._data.qvel

    @property
    def mocap_pos(self) -> Any:
        return self._data.mocap_pos

    def set_state(self, ids: np.ndarray, qpos: np.ndarray, mocap_pos: np.ndarray, ctrl: np.ndarray) -> None:
        """Restart simulations ``ids`` from these positions, mocap placements and controls.

        Only the restarted rows travel to the device (full-size arrays, so one compiled shape;
        the other rows are masked out on the device, never read back).
        """
        n, nq, nmocap, nu = self._shapes
        mask = np.zeros(n, dtype=bool)
        mask[ids] = True
        full_qpos, full_mocap, full_ctrl = np.zeros((n, nq)), np.zeros((n, nmocap, 3)), np.zeros((n, nu))
        full_qpos[ids], full_mocap[ids], full_ctrl[ids] = qpos, mocap_pos, ctrl
        self._data = self._restart(self._data, mask, full_qpos, full_mocap, full_ctrl)

    def step(self, ctrl: Any) -> None:
        """Apply ``ctrl`` [N, nu] (a torch tensor, taken by DLPack) and advance ``frame_skip`` substeps."""
        import jax.dlpack

        ctrl = jax.dlpack.from_dlpack(ctrl.contiguous()) if hasattr(ctrl, "__dlpack__") else self.xp.asarray(ctrl)
        self._data = self._step(self._data, ctrl.astype(self._data.ctrl.dtype))

    def get_state(self) -> dict[str, Any]:
        """Snapshot: every leaf of the batched MJX data, as numpy arrays (MJX has no sleeping)."""
        import jax

        return {"leaves": [np.asarray(x) for x in jax.tree_util.tree_leaves(self._data)]}

    def restore(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s snapshot."""
        import jax

        leaves, treedef = jax.tree_util.tree_flatten(self._data)
        saved = state["leaves"]
        if len(saved) != len(leaves) or any(a.shape != b.shape for a, b in zip(saved, leaves)):
            raise ValueError("MJX snapshot does not fit this backend (another model or number of environments)")
        self._data = jax.tree_util.tree_unflatten(treedef, [self.xp.asarray(x) for x in saved])


def make_backend(name: str, model: mujoco.MjModel, num_envs: int, frame_skip: int,
                 num_threads: int | None = None, *, warp_device: str = "auto", render: Any = None,
                 colour_geoms: np.ndarray | None = None, warp_deterministic: bool = False,
                 warp_uncaptured: bool = False) -> Any:
    """Create backend ``name`` ("batch", "mjx" or "warp").

    ``warp_device``, ``render`` (a :class:`sims.render.RenderConfig`), ``colour_geoms``,
    ``warp_deterministic`` and ``warp_uncaptured`` are the Warp backend's, which renders its own frames.

    Raises:
        ValueError: an unknown name (the message lists the valid ones), or ``"mjx-warp"``, removed.
    """
    if name == "batch":
        return BatchBackend(model, num_envs, frame_skip, num_threads)
    if name == "mjx":
        return MjxBackend(model, num_envs, frame_skip)
    if name == "warp":
        from sims.warp_backend import WarpBackend

        return WarpBackend(model, num_envs, frame_skip, warp_device, render=render, colour_geoms=colour_geoms,
                           deterministic=warp_deterministic, uncaptured=warp_uncaptured)
    if name == "mjx-warp":
        raise ValueError(MJX_WARP_REMOVED)
    raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}")


MJX_WARP_REMOVED = (
    "backend='mjx-warp' was removed: use backend='warp', which runs the same MuJoCo Warp kernels "
    "directly (no JAX in between), hands its arrays to torch without a copy and renders on the device "
    "(see docs/sims.md)")

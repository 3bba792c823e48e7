"""Whether the Warp backend's captured CUDA graphs compute what its eager launches compute.

On CUDA :class:`sims.warp_backend.WarpBackend` records its substeps and its render pass as CUDA
graphs once and replays them; a graph that replays stale pointers or misses a launch would step
every world wrongly and fast. :func:`compare_captured_and_eager` steps and renders from one
snapshot twice, once as the backend runs (the graphs, once captured) and once with eager launches
of the same code, and returns their largest differences. On Warp's CPU device there is no graph:
both runs are eager and must agree exactly, which checks the comparison itself (snapshot,
restore, the two paths) where no GPU is lent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: Largest |qpos| difference (metres or radians) after one control step accepted between a graph's
#: replay and eager launches: both run the same kernels, but contact sums use float atomics whose
#: order differs from run to run on a GPU.
QPOS_ATOL = 1e-3
#: Largest frame difference (levels of 255) accepted between the two render passes.
PIXEL_ATOL = 8


def _frames(backend: Any) -> np.ndarray:
    return backend.render()["rgb"].cpu().numpy().astype(np.int16) if backend.renders else np.zeros(0, np.int16)


def _eager_frames(backend: Any) -> np.ndarray:
    graph, backend._render_graph = backend._render_graph, None
    capture, backend._capture = backend._capture, False
    try:
        return _frames(backend)
    finally:
        backend._render_graph, backend._capture = graph, capture


def compare_captured_and_eager(backend: Any, ctrl: torch.Tensor) -> dict[str, Any]:
    """One control step with ``ctrl`` [N, nu] (and a render pass, if the backend renders) from the
    backend's current state, as it runs and with eager launches; the state is restored after.

    Returns:
        ``{"captured": {step, render}, "qpos_max_abs_diff", "qvel_max_abs_diff", "pixel_max_abs_diff",
        "match"}``; ``match`` is whether the differences are within :data:`QPOS_ATOL` and :data:`PIXEL_ATOL`.
    """
    start = backend.get_state()
    backend.step(ctrl)  # the first call captures (on CUDA); the second replays the graph
    _frames(backend)
    backend.restore(start)
    backend.step(ctrl)
    graph = (backend.qpos.cpu().numpy().copy(), backend.qvel.cpu().numpy().copy(), _frames(backend))
    backend.restore(start)
    backend._ctrl.copy_(ctrl)
    with backend._on_warp():
        backend._substeps()
    eager = (backend.qpos.cpu().numpy().copy(), backend.qvel.cpu().numpy().copy(), _eager_frames(backend))
    backend.restore(start)
    diffs = [float(np.abs(a - b).max()) if a.size else 0.0 for a, b in zip(graph, eager)]
    return {"captured": backend.graphs_captured, "qpos_max_abs_diff": diffs[0], "qvel_max_abs_diff": diffs[1],
            "pixel_max_abs_diff": diffs[2], "match": diffs[0] <= QPOS_ATOL and diffs[2] <= PIXEL_ATOL}

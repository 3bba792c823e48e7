"""A numpy-style array namespace over torch tensors on one device.

:func:`sims.tasks.task_signals` and the vector environment's core are written against an array module
``xp`` (``numpy`` for the batch backend). Backends whose state lives on an accelerator (the Warp
backend; MJX, through DLPack) hand the environment torch tensors on their device instead, so that
observations reach the policy without a copy. :class:`TorchNamespace` offers exactly the numpy
functions those two use, with numpy's names and keyword arguments, over ``torch``.

Floating-point input becomes float32 (as in JAX): the simulators on a device compute in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class TorchNamespace:
    """numpy's functions, as far as ``sims`` uses them, on torch tensors on ``device``."""

    float32 = torch.float32
    float64 = torch.float64
    int64 = torch.int64
    bool_ = torch.bool

    def __init__(self, device: str | torch.device):
        """Args: the torch device every array of this namespace lives on ("cpu", "cuda:0", ...)."""
        self.device = torch.device(device)

    def __repr__(self) -> str:
        return f"TorchNamespace({str(self.device)!r})"

    # ------------------------------------------------------------------ creation and conversion
    def asarray(self, x: Any, dtype: torch.dtype | None = None, copy: bool | None = None) -> torch.Tensor:
        """``x`` as a tensor on this device (zero-copy where it already is one: numpy on the CPU,
        DLPack arrays such as JAX's); floating point becomes float32 unless ``dtype`` says otherwise."""
        if isinstance(x, torch.Tensor):
            t = x
        elif isinstance(x, np.ndarray):
            t = torch.from_numpy(x if x.flags.writeable else x.copy())  # torch warns on read-only memory
        elif hasattr(x, "__dlpack__"):
            t = torch.from_dlpack(x)
        else:
            t = torch.as_tensor(np.asarray(x))
        if dtype is None and t.is_floating_point():
            dtype = torch.float32
        # An upload from host memory need not wait for the device's queued work (a blocking copy
        # does: one host sync per upload); CUDA stages pageable memory at the call, so x may change after.
        out = t.to(device=self.device, dtype=dtype, non_blocking=t.device.type == "cpu" != self.device.type)
        if copy and out.data_ptr() == t.data_ptr():
            out = out.clone()
        return out

    def zeros(self, shape: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=self.device)

    @staticmethod
    def zeros_like(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)

    @staticmethod
    def astype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype)

    # ------------------------------------------------------------------ joining and indexing
    @staticmethod
    def concatenate(xs: Any, axis: int = 0) -> torch.Tensor:
        return torch.cat(list(xs), dim=axis)

    @staticmethod
    def stack(xs: Any, axis: int = 0) -> torch.Tensor:
        return torch.stack(list(xs), dim=axis)

    @staticmethod
    def take_along_axis(x: torch.Tensor, indices: torch.Tensor, axis: int) -> torch.Tensor:
        return torch.take_along_dim(x, indices, dim=axis)

    @staticmethod
    def where(cond: torch.Tensor, x: Any, y: Any) -> torch.Tensor:
        return torch.where(cond, x, y)

    # ------------------------------------------------------------------ elementwise and reductions
    tanh = staticmethod(torch.tanh)
    sqrt = staticmethod(torch.sqrt)
    arctan2 = staticmethod(torch.atan2)
    linalg = torch.linalg
    abs = staticmethod(torch.abs)
    isfinite = staticmethod(torch.isfinite)

    @staticmethod
    def clip(x: torch.Tensor, lo: Any, hi: Any) -> torch.Tensor:
        return torch.clamp(x, lo, hi)

    @staticmethod
    def sum(x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
        return x.sum() if axis is None else x.sum(dim=axis)

    @staticmethod
    def all(x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
        return x.all() if axis is None else x.all(dim=axis)

"""Counting the host reads of device tensors: the points where the host waits for a GPU's stream.

On CUDA every read of a tensor's values by the host (``bool(t)``, ``t.item()``, ``t.tolist()``,
``t.cpu()``, ``t.numpy()``, ``t.nonzero()``, a boolean-mask index or assignment, whose output size
the host must know) waits until the stream has computed them. A training loop that does one per
control step stalls the GPU once per step. :func:`count_host_syncs` counts these reads of
tensors on one device by wrapping those torch methods while it is open (on Warp's CPU device: the
same code path as on CUDA, with CPU tensors), and on CUDA counts every synchronising call that
torch's sync debug mode reports, blocking uploads from the host included; a test holds the
co-located loop to a number per iteration that does not grow with the rollout length.
A measuring tool: the wrappers cost a Python call per wrapped operation, so no figure of speed is
taken inside it.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch

#: Tensor methods that hand the host a tensor's values (each waits for the device's stream on CUDA).
READS = ("__bool__", "__float__", "__int__", "__index__", "item", "tolist", "numpy", "nonzero")
#: Copies to the host, counted from a GPU only (on Warp's CPU device the tensors are there already, and
#: ``.to(device)`` of the device's own code cannot be told from a copy to the host).
COPIES = ("cpu", "to")
_ROOT = Path(__file__).resolve().parent.parent
_host_side = 0


@contextlib.contextmanager
def host_side() -> Iterator[None]:
    """Code on tensors the host already holds (copied once per iteration): not counted, which on
    Warp's CPU device, where every tensor is on the host, it otherwise would be."""
    global _host_side
    _host_side += 1
    try:
        yield
    finally:
        _host_side -= 1


class HostSyncCounter:
    """The reads counted so far: ``count`` in all, ``sites`` per ``"path:line (method)"`` of the project's
    code that made them (the first frame outside torch)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.count = 0
        self.sites: Counter[str] = Counter()

    def _counts(self, tensor: torch.Tensor) -> bool:
        if _host_side:
            return False
        d = tensor.device
        return d.type == self.device.type and (self.device.index is None or d.index == self.device.index)

    def _record(self, what: str) -> None:
        self.count += 1
        frame = sys._getframe(2)
        while frame is not None and "torch" in Path(frame.f_code.co_filename).parts:
            frame = frame.f_back
        if frame is not None:
            path = Path(frame.f_code.co_filename)
            where = path.relative_to(_ROOT) if path.is_relative_to(_ROOT) else path.name
            self.sites[f"{where}:{frame.f_lineno} ({what})"] += 1


def _is_mask(index: object) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


@contextlib.contextmanager
def count_host_syncs(device: str | torch.device) -> Iterator[HostSyncCounter]:
    """Count the host syncs with ``device`` made while the block runs: on CUDA every call torch's sync
    debug mode reports (reads, blocking uploads, stream waits), elsewhere the reads of tensors on it
    (see the module docstring).

    Yields:
        the :class:`HostSyncCounter`, final once the block ends.
    """
    device = torch.device(device)
    if device.type == "cuda":
        with _cuda_syncs(device) as counter:
            yield counter
        return
    with _tensor_reads(device) as counter:
        yield counter


@contextlib.contextmanager
def _cuda_syncs(device: torch.device) -> Iterator[HostSyncCounter]:
    """Every synchronising CUDA call, as torch's sync debug mode warns of them (one warning each)."""
    counter = HostSyncCounter(device)
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counter
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    for w in caught:
        if "synchroniz" in str(w.message).lower():
            counter.count += 1
            path = Path(w.filename)
            where = path.relative_to(_ROOT) if path.is_relative_to(_ROOT) else path.name
            counter.sites[f"{where}:{w.lineno} (cuda sync)"] += 1


@contextlib.contextmanager
def _tensor_reads(device: torch.device) -> Iterator[HostSyncCounter]:
    """The reads of tensors on ``device`` through the wrapped torch methods."""
    counter = HostSyncCounter(device)
    originals = {name: getattr(torch.Tensor, name) for name in (*READS, *COPIES, "__getitem__", "__setitem__")}

    def reading(name):
        original = originals[name]

        def wrapper(self, *args, **kwargs):
            if counter._counts(self):
                counter._record(name)
            return original(self, *args, **kwargs)
        return wrapper

    def get(self, index):
        if _is_mask(index) and counter._counts(self):
            counter._record("mask index")
        return originals["__getitem__"](self, index)

    def put(self, index, value):
        if _is_mask(index) and counter._counts(self):
            counter._record("mask assignment")
        return originals["__setitem__"](self, index, value)

    def cpu(self, *args, **kwargs):
        if self.device.type != "cpu" and counter._counts(self):
            counter._record("cpu")
        return originals["cpu"](self, *args, **kwargs)

    def to(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if (isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"
                and self.device.type != "cpu" and counter._counts(self)):
            counter._record("to cpu")
        return originals["to"](self, *args, **kwargs)

    wrappers = {name: reading(name) for name in READS} | {"__getitem__": get, "__setitem__": put, "cpu": cpu, "to": to}
    try:
        for name, wrapper in wrappers.items():
            setattr(torch.Tensor, name, wrapper)
        yield counter
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)

"""Torch devices named in configs and on the command line, checked against this machine."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a torch device, checked to exist on this machine.

    Raises:
        ValueError: not one of those names, or a CUDA device this machine does not have (one line).
    """
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device {name!r} is not a torch device; use cpu, cuda or cuda:N") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} requested but CUDA is not available on this machine; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r} requested but this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1}"
            )
    elif device.type != "cpu":
        raise ValueError(f"device {name!r} is not supported; use cpu, cuda or cuda:N")
    return device

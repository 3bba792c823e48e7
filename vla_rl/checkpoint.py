"""Checkpoints: everything a run needs to continue bit-identically, written atomically.

A checkpoint is an :mod:`infra.common.checkpoint_io` file of kind ``vla_rl`` holding a dict with the
model, the optimiser and learning-rate state, the RNG states (torch, numpy, python, environment),
step counters, the trainer's carried observation and the config. Writes go to a temporary file in
the same directory and are renamed into place, so a crash never leaves a half-written checkpoint
under the final name; reads verify the digest, so a truncated or corrupted file raises
:class:`CheckpointError` instead of silently starting fresh. Files hold tensors and plain data
only: loading one runs no code from it (format-2 pickles are refused with the converter's command).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from infra.common import checkpoint_io
from infra.common.checkpoint_io import CheckpointError
from infra.common.files import write_atomic
from vla_rl.config.files import upgrade_saved

KIND = "vla_rl"
LATEST = "latest.pt"


def rng_state() -> dict[str, Any]:
    """The global RNG states of torch (CPU, and every CUDA device once CUDA is initialised), numpy and python."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned.

    Raises:
        CheckpointError: the state holds CUDA generators but this process has no (or fewer) CUDA devices.
    """
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state:
        if not torch.cuda.is_available() or torch.cuda.device_count() < len(state["cuda"]):
            raise CheckpointError(
                f"the checkpoint holds the RNG states of {len(state['cuda'])} CUDA device(s) and this machine has "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}; resume on a machine like the one "
                "that wrote it (or start a new run with device=cpu)"
            )
        torch.cuda.set_rng_state_all(state["cuda"])


def remove_partial_writes(directory: Path) -> list[Path]:
    """Delete temporary files a killed process left while writing a checkpoint; returns them."""
    stale = sorted(directory.glob("*.pt.*.tmp")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def save_checkpoint(payload: dict[str, Any], directory: Path, iteration: int, keep: int = 3) -> Path:
    """Write ``payload`` as ``iter_<iteration>.pt`` and ``latest.pt`` atomically; prune old ones.

    Args:
        payload: The checkpoint contents (tensors, numpy arrays and python values).
        directory: The run's ``checkpoints/`` directory (created if missing).
        iteration: The completed iteration the payload describes.
        keep: Numbered checkpoints to keep besides ``latest.pt``.

    Returns:
        The path of the numbered checkpoint.
    """
    directory.mkdir(parents=True, exist_ok=True)
    blob = checkpoint_io.dumps(payload, KIND)
    path = directory / f"iter_{iteration:06d}.pt"
    for target in (path, directory / LATEST):
        write_atomic(target, blob)
    numbered = sorted(directory.glob("iter_*.pt"))
    for old in numbered[:-keep] if keep > 0 else []:
        old.unlink()
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read and verify a checkpoint file (or the ``latest.pt`` of a ``checkpoints/`` or run directory); a config
    saved in an earlier form comes in today's (:func:`vla_rl.config.files.upgrade_saved`).

    Raises:
        CheckpointError: The file is missing, not a checkpoint, truncated or corrupted, or of another format.
    """
    path = Path(path)
    if path.is_dir():
        path = path / LATEST if (path / LATEST).exists() else path / "checkpoints" / LATEST
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint at {path}; train first (scripts/train.py) or pass the path of an existing .pt file"
        )
    fix = f"resume from an older iter_*.pt in {path.parent} or delete the run directory to start over"
    state = checkpoint_io.load(path, KIND, fix)
    if isinstance(state.get("config"), dict):
        state["config"] = upgrade_saved(state["config"])
    return state

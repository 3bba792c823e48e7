"""Trainer checkpoints of LLM jobs: everything a job's trainer needs to continue bit for bit.

One file per job, ``<dir>/trainer.ckpt``, an :mod:`infra.common.checkpoint_io` file of kind ``llm_trainer``
holding the job name, its step (state-changing calls applied: supervised
steps, the end of the warm-up, GRPO updates), its weight version, the model, the frozen reference
and the optimiser state dicts, the trainer's minibatch generator and the job's torch RNG state
(dropout), and the result of the last call (so a call whose reply was lost in a crash is answered,
not applied twice). The same payload serves the character model and Hugging Face models: both are
``nn.Module`` state dicts (an HF model is exported for users with ``save_pretrained`` by the job,
separately).

The file is sealed: written to a temporary file in the same directory,
flushed to disk and renamed over the previous checkpoint, so a trainer killed while writing leaves
the previous checkpoint intact; reads verify the digest, so a truncated or corrupted file raises
:class:`CheckpointError` instead of the job silently starting again from its seed.

Cost: one write holds model + reference + Adam moments, 16 bytes per parameter in float32 (the
342k-parameter character model: 5.5 MB, a few milliseconds on local disk); a 1B-parameter model
writes 16 GB per checkpoint, so large models set ``CheckpointSpec.every`` above 1.

Files hold tensors and plain data only: loading one runs no code from it (format-2 pickles are
refused with the converter's command).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from infra.common import checkpoint_io
from infra.common.checkpoint_io import CheckpointError
from infra.common.typed_config import ConfigError

KIND = "llm_trainer"
FILENAME = "trainer.ckpt"


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often the trainer service checkpoints one job."""

    dir: str
    """The job's own directory, an absolute path that every node which may host the trainer reads
    and writes (a shared filesystem on a cluster; any local folder on one machine)."""
    every: int = 1
    """Checkpoint after every ``every``-th state-changing call. 1 makes a trainer crash invisible to
    the job (the interrupted call is redone from the checkpoint); with more, a crash between two
    checkpoints loses calls, which the trainer refuses with an error rather than continue."""

    def validate(self) -> None:
        """Raise :class:`~infra.common.typed_config.ConfigError` naming the field and the fix."""
        if not os.path.isabs(self.dir):
            raise ConfigError(f"CheckpointSpec.dir={self.dir!r} is relative; pass an absolute path (the trainer may run "
                              "in another working directory).")
        if self.every < 1:
            raise ConfigError(f"CheckpointSpec.every={self.every} must be >= 1 (1: after every state-changing call).")


@dataclass(frozen=True)
class CheckpointInfo:
    """Where a checkpointed job stands, read without building its model."""

    job: str
    step: int
    """State-changing calls applied (warm-up steps, the end of the warm-up, GRPO updates)."""
    version: int
    """Weight version: GRPO updates applied."""


def checkpoint_path(directory: str | Path) -> Path:
    """The checkpoint file of the job whose directory is ``directory``."""
    return Path(directory) / FILENAME


def save(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, ``os.replace``)."""
    checkpoint_io.save(path, payload, KIND)


def load(path: Path, job: str) -> dict[str, Any]:
    """Read and verify ``job``'s checkpoint at ``path``.

    Raises:
        CheckpointError: the file is missing, not a checkpoint, truncated or corrupted, or another job's.
    """
    if not path.is_file():
        raise CheckpointError(f"job {job!r} expects a trainer checkpoint at {path} and there is none; restore the file, "
                              "or register the job with resume=False to start it again from its seed.")
    payload = checkpoint_io.load(path, KIND, f"restore job {job!r}'s trainer checkpoint from a copy, or register the "
                                 "job with resume=False to start from its seed.")
    if payload.get("job") != job:
        raise CheckpointError(f"trainer checkpoint {path} belongs to job {payload.get('job')!r}, not {job!r}; give each "
                              "job its own checkpoint directory.")
    return payload


def read_info(directory: str | Path, job: str) -> CheckpointInfo:
    """The step and weight version of ``job``'s checkpoint in ``directory`` (verified like :func:`load`)."""
    payload = load(checkpoint_path(directory), job)
    return CheckpointInfo(job, payload["step"], payload["version"])


def trainer_payload(job: str, trainer: Any, *, step: int, rng: torch.Tensor, last: Any) -> dict[str, Any]:
    """The checkpoint payload of ``job``: a ``GRPOTrainer``'s model, reference, optimiser, generator and
    version, the job's ``step``, its torch RNG state ``rng`` and the ``last`` call's result."""
    return {
        "job": job, "step": step, "version": trainer.version, "last": last, "rng": rng,
        "model": trainer.model.state_dict(), "ref": trainer.ref.state_dict(), "opt": trainer.opt.state_dict(),
        "gen": trainer.gen.get_state(),
    }


def restore_trainer(trainer: Any, payload: dict[str, Any]) -> None:
    """Load a payload of :func:`trainer_payload` into ``trainer`` (built like the one that wrote it)."""
    trainer.model.load_state_dict(payload["model"])
    trainer.ref.load_state_dict(payload["ref"])
    trainer.opt.load_state_dict(payload["opt"])
    trainer.gen.set_state(payload["gen"])
    trainer.version = payload["version"]

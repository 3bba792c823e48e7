"""Checkpoint files of both trainers: tensors and plain data, never code, whole or refused.

A checkpoint file (format 3) is a sealed file (:mod:`infra.common.files`)::

    MAGIC | sha256(body) | body
    body = u64 little-endian length of the header | header (JSON) | safetensors blob

The header is ``{"format": 3, "kind": KIND, "payload": TREE}``: TREE is the payload dict written by
:mod:`infra.common.plain_data` (numbers, strings, lists, dicts, tuples, numpy arrays inline) in which every
torch tensor is a ``{"$tensor": KEY}`` into the safetensors blob. Loading parses JSON and
safetensors only, so a file can hold data and nothing that runs; ``kind`` (``vla_rl``,
``llm_trainer``) keeps one trainer from reading the other's files.

Format-2 files (``torch.save`` pickles behind the magics in :data:`LEGACY_MAGICS`) are refused with
the command that converts them, ``scripts/convert_checkpoint.py``: the one place that unpickles a
checkpoint, run by a user who trusts the file.

Errors are one :class:`CheckpointError`, with a message that names the file and the fix.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from infra.common.files import DigestMismatch, NotSealed, seal, unseal, write_atomic
from infra.common.limits import short
from infra.common.plain_data import Codec, DataError

FORMAT = 3
MAGIC = b"CKPT3\n"
LEGACY_MAGICS = {b"VLARLCKPT1\n": "vla_rl", b"LLMTRAINERCKPT1\n": "llm_trainer"}
"""Headers of format-2 checkpoints (a sha256 and a ``torch.save`` pickle follow) and their kinds."""
CONVERTER = "python scripts/convert_checkpoint.py"
_LENGTH = struct.Struct("<Q")
_CODEC = Codec()


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, of another format or kind, or does not fit what loads it."""


def dumps(payload: dict[str, Any], kind: str) -> bytes:
    """The sealed bytes of ``payload`` (a dict of tensors, numpy arrays and plain Python values).

    Raises:
        CheckpointError: the payload holds a value that is not data (an object, a function), named by its key.
    """
    tensors: dict[str, Any] = {}
    try:
        tree = _CODEC.encode(payload, tensors)
    except DataError as exc:
        raise CheckpointError(f"cannot write a {kind} checkpoint: {exc}") from None
    flat, storages = {}, set()
    for key, tensor in tensors.items():
        t = tensor.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        # safetensors refuses tensors that share memory (tied weights, views): those get their own copy
        flat[key] = t.clone() if ptr in storages and t.numel() else t
        storages.add(ptr)
    header = json.dumps({"format": FORMAT, "kind": kind, "payload": tree}, allow_nan=False).encode()
    return seal(MAGIC, _LENGTH.pack(len(header)) + header + save_tensors(flat))


def loads(blob: bytes, kind: str, source: str, fix: str) -> dict[str, Any]:
    """The payload of the sealed ``blob`` read from ``source`` (a path, for messages).

    Args:
        fix: what the user should do about a corrupt or truncated file (ends the message).

    Raises:
        CheckpointError: a format-2 pickle (with the converter's command), not a checkpoint, corrupt,
            of another kind, or holding something the format does not allow.
    """
    if blob.startswith(tuple(LEGACY_MAGICS)):
        raise CheckpointError(f"{source} is a format-2 checkpoint (a pickle, which can run code when loaded), this code "
                              f"reads format {FORMAT}; if you trust the file, convert it once: {CONVERTER} {source}")
    try:
        body = unseal(blob, MAGIC)
    except NotSealed:
        raise CheckpointError(f"{source} is not a checkpoint (bad header); was it written by this project's "
                              "trainers?") from None
    except DigestMismatch:
        raise CheckpointError(f"{source} is corrupt or truncated (checksum mismatch); {fix}") from None
    try:
        (size,) = _LENGTH.unpack_from(body)
        header = json.loads(body[_LENGTH.size : _LENGTH.size + size])
        tensors = load_tensors(body[_LENGTH.size + size :])
        if header.get("kind") != kind:
            raise CheckpointError(f"{source} is a {header.get('kind')!r} checkpoint, not a {kind!r} one; pass a "
                                  f"checkpoint that a {kind} run wrote")
        payload = _CODEC.decode(header["payload"], tensors)
    except CheckpointError:
        raise
    except (struct.error, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError,
            SafetensorError, RuntimeError, OverflowError, MemoryError) as exc:
        # the digest matched, so the writer itself wrote this: a crafted or foreign file (torch raises
        # RuntimeError for strides that leave the storage)
        raise CheckpointError(f"{source} has a valid seal but its contents are not a format-{FORMAT} checkpoint "
                              f"({type(exc).__name__}: {short(str(exc), 200)}); it was not written by this "
                              "project's trainers") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{source} holds a {type(payload).__name__}, not a checkpoint's dict")
    return payload


def save(path: Path, payload: dict[str, Any], kind: str) -> None:
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, rename; see :func:`dumps`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, dumps(payload, kind))


def load(path: Path, kind: str, fix: str) -> dict[str, Any]:
    """Read and verify the ``kind`` checkpoint at ``path`` (an existing file; see :func:`loads`)."""
    return loads(path.read_bytes(), kind, str(path), fix)


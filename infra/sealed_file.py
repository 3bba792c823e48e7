"""Files that are whole or absent: written atomically, read back verified.

A sealed file is ``magic | sha256(data) | data``. :func:`write_atomic` writes a temporary file in
the target's directory (named ``<name>.<random>.tmp``), flushes it to disk and renames it over the
target (``os.replace``), so a process killed while writing leaves the previous file intact;
:func:`unseal` checks the header and the digest, so a truncated or corrupted file is refused
instead of read. The trainers' checkpoints (``vla_rl.checkpoint``, ``infra.llm.checkpoint``) are
sealed files with their own magic and their own error messages.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

DIGEST_BYTES = 32


class NotSealed(ValueError):
    """The bytes do not start with the expected magic header (another kind of file)."""


class DigestMismatch(ValueError):
    """The bytes have the header but not the recorded digest (truncated or corrupted)."""


def seal(magic: bytes, data: bytes) -> bytes:
    """``magic | sha256(data) | data``."""
    return magic + hashlib.sha256(data).digest() + data


def unseal(blob: bytes, magic: bytes) -> bytes:
    """The data of a sealed ``blob``.

    Raises:
        NotSealed: ``blob`` does not start with ``magic`` (or is shorter than the header).
        DigestMismatch: the data does not match the recorded digest.
    """
    header = len(magic) + DIGEST_BYTES
    if not blob.startswith(magic) or len(blob) < header:
        raise NotSealed(f"no {magic!r} header")
    if hashlib.sha256(blob[header:]).digest() != blob[len(magic) : header]:
        raise DigestMismatch("sha256 of the data differs from the recorded digest")
    return blob[header:]


def write_atomic(path: Path, blob: bytes) -> None:
    """Write ``blob`` to ``path`` through a flushed temporary file renamed into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unwritable(path: str | Path) -> str | None:
    """Why a file or directory could not be written at ``path`` (missing parents created), or ``None``.

    Checked before a job starts, so that its results are never computed only to be lost at the write:
    a small file is created and removed in the nearest directory that exists (permissions alone do not
    tell: root may write anywhere but into ``/proc``, a read-only mount refuses everyone).
    """
    target = Path(path).absolute()
    while not target.exists():
        target = target.parent
    if target == Path(path).absolute() and not target.is_dir():
        target = target.parent  # an existing file, replaced: its directory must take a new file
    if not target.is_dir():
        return f"{target} is a file, not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=target, prefix=".write-check.")
    except OSError as exc:
        return f"cannot create files in {target} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None

"""Files that are whole or absent: written atomically, read back verified.

A sealed file is ``magic | sha256(data) | data``. :func:`write_atomic` writes a temporary file in
the target's directory (named ``.<stem>.<random>.tmp<suffix>``; :func:`atomic_path` gives such a path to
writers that want a file name), flushes it to disk and renames it over the
target (``os.replace``) and fsyncs the directory, so a process killed while writing (or a power
loss after) leaves the previous file intact; :func:`unseal` checks the header and the digest, so a
truncated or corrupted file is refused instead of read. The trainers' checkpoints
(``infra.common.checkpoint_io``) are sealed files; the scheduler's journal snapshot is written with
:func:`write_atomic`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
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


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that wants a file name (a plot, a video); renamed
    over ``path`` when the block ends without error, removed otherwise. The suffix is kept, so
    writers that pick the format from it still do."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path: Path, blob: bytes) -> None:
    """Write ``blob`` to ``path`` through a flushed temporary file renamed into place."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(directory: Path) -> None:
    """Flush ``directory``'s entries to disk, so that a rename in it survives a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

"""Write-ahead journal and snapshots of the scheduler service, on a file system or in Ray's GCS.

Every verb that changes the plan is appended (with its time) *before* it is applied; every
``snapshot_every`` records the whole state is written as a snapshot. A restarted service loads the
last snapshot and replays the records after it, which redoes exactly the same decisions (the
scheduler is deterministic given its verbs and their times).

A record is one line, ``CRC32 JSON\n``: eight hex digits of the crc32 of the JSON bytes, a space, and
the JSON of ``{"seq", "op", "args"}`` written by :mod:`infra.common.plain_data` (the snapshot is one such
line holding ``{"seq", "state"}``). Reading parses JSON and builds only the scheduler's own classes
(:data:`CODEC`), so a crafted file cannot run code. A line that is empty, all zeros, torn by a crash
or altered fails its format or its checksum: it is skipped and described in :attr:`Journal.damage`,
and every intact record around it is kept.

Stores: ``FileStore(directory)``, by default under Ray's session directory (``session``), and
``KVStore`` (Ray's internal key-value store in the GCS). A file store appends each record with one
unbuffered ``write`` checked for its full length and an ``fsync``; a write that fails or falls short
(a full disk, a file-size limit) is cut back off the file (:class:`JournalUnwritable`), so a record
the caller was told had failed never comes back, and every later append tries again from the last
whole record. A snapshot is written to a temporary file and made durable before it replaces the
current one; the previous snapshot and the records after it are kept (``.prev``) until then, so a
damaged snapshot falls back to the one before it and loses nothing. Its files must be regular files
(a FIFO, a directory or a symbolic link in their place is refused).
"""

from __future__ import annotations

import json
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from sortedcontainers import SortedList

from infra.common.files import fsync_dir, write_atomic
from infra.common.plain_data import Codec, DataError, classes_of
from infra.scheduler import (
    admission,
    core,
    events,
    frag,
    gang_book,
    gang_placer,
    node_events,
    node_scoring,
    placing,
    preemption,
    preemptor,
    quota,
    requests,
    reservation,
    reservation_keeper,
    resources,
    wait_queue,
)

SCHEDULER_CLASSES = (*classes_of([admission, core, events, frag, gang_book, gang_placer, node_events, node_scoring, placing,
                                  preemption, preemptor, quota, requests, reservation, reservation_keeper, resources,
                                  wait_queue]), SortedList)
"""Classes a journal may rebuild: those of the scheduler core's modules (pure computation, no I/O) and the
sorted list of its wait queue."""
_LINE = re.compile(rb"([0-9a-f]{8}) (\{.*\})")
JOURNAL_FILE, SNAPSHOT_FILE = "journal.jsonl", "snapshot.json"
PREV_JOURNAL_FILE, PREV_SNAPSHOT_FILE = "journal.prev.jsonl", "snapshot.prev.json"
"""The generation before the last snapshot, kept until the next one is durable."""
OLD_FILES = ("journal.log", "snapshot.pkl")
"""The pickle journal of earlier versions: never read, reported when found."""


class JournalUnwritable(OSError):
    """An append did not reach the disk whole (it was cut back off): the verb is refused, nothing changed."""


class JournalRefused(OSError):
    """A journal or snapshot path is not a regular file (a FIFO, a directory, a link)."""


def _read_regular(path: Path) -> bytes | None:
    """The bytes of ``path`` (None when absent); anything but a regular file is refused, without blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalRefused(f"{path} cannot be read as the scheduler's journal ({exc.strerror}): it must be a "
                             "regular file; move it away or pick another --store") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise JournalRefused(f"{path} is not a regular file ({stat.filemode(mode)}): the scheduler keeps its "
                                 "journal in regular files only; move it away or pick another --store")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def encode_record(doc: dict[str, Any]) -> bytes:
    """``doc`` (JSON-able) as one checksummed line."""
    body = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode_records(data: bytes, where: str = "journal") -> tuple[list[dict[str, Any]], list[str]]:
    """The intact records of ``data`` and one description per damaged line (skipped, never a stop).

    A line is intact when it reads ``CRC32 {JSON}`` and the checksum matches: an empty line, zeros,
    a line torn by a crash or a flipped byte is damaged.
    """
    out, damage, pos = [], [], 0
    for line in data.split(b"\n"):
        at, pos = pos, pos + len(line) + 1
        if not line:
            continue
        m = _LINE.fullmatch(line)
        doc = None
        if m is not None and int(m[1], 16) == zlib.crc32(m[2]):
            try:
                doc = json.loads(m[2])
            except (ValueError, RecursionError):
                doc = None
        if isinstance(doc, dict):
            out.append(doc)
        else:
            what = "zeros" if not line.strip(b"\0") else "checksum or format mismatch"
            damage.append(f"{where}: skipped {len(line)} unreadable bytes at offset {at} ({what})")
    return out, damage


class Store(Protocol):
    """Durable storage of the journal and the snapshot (lines of :func:`encode_record`)."""

    def append(self, seq: int, line: bytes) -> None:
        """Store record ``seq`` durably before returning."""

    def records(self) -> tuple[bytes, str]:
        """The journal's bytes and where they are (for messages)."""

    def put_snapshot(self, seq: int, line: bytes) -> None:
        """Make ``line`` the snapshot once it is durable; the previous snapshot and the records after it
        are kept until the next one, older records are dropped."""

    def snapshots(self) -> list[bytes]:
        """The last snapshot's bytes then the previous one's (those that exist)."""

    def clear(self) -> None:
        """Forget the journal and the snapshot (``python -m infra.service reset``)."""

    def notes(self) -> list[str]:
        """What the store found that it does not read (files of an older format)."""


class FileStore:
    """Journal and snapshot files in ``directory`` (``journal.jsonl``, ``snapshot.json`` and their ``.prev``)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in (JOURNAL_FILE, SNAPSHOT_FILE, PREV_JOURNAL_FILE, PREV_SNAPSHOT_FILE):
            _read_regular(self.dir / name)  # refuse a FIFO or a directory before anything is written
        self._fd = -1
        self._open()

    def _open(self) -> None:
        """Open the journal for unbuffered appends; a torn tail is ended, so the next record stays a line of its own."""
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.dir / JOURNAL_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self._size, self._torn = os.fstat(self._fd).st_size, False
        if self._size and not (_read_regular(self.dir / JOURNAL_FILE) or b"").endswith(b"\n"):
            self._write(b"\n")

    def _write(self, data: bytes) -> None:
        """Append ``data`` whole and durably, or cut it back off and raise ``JournalUnwritable``."""
        try:
            if self._torn:  # what a failed append left (its cut failed too) goes first
                os.ftruncate(self._fd, self._size)
                self._torn = False
            if os.write(self._fd, data) != len(data):
                raise OSError(f"short write ({len(data)} bytes asked)")
            os.fsync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self._torn = True  # the next append cuts it first; a reader skips a torn line meanwhile
            raise JournalUnwritable(f"journal {self.dir / JOURNAL_FILE} not written "
                                    f"({exc.strerror or exc}): free space or raise the file-size limit") from None
        self._size += len(data)

    def append(self, seq: int, line: bytes) -> None:
        self._write(line)

    def records(self) -> tuple[bytes, str]:
        prev = _read_regular(self.dir / PREV_JOURNAL_FILE) or b""
        data = _read_regular(self.dir / JOURNAL_FILE) or b""
        joined = prev + (b"\n" if prev and not prev.endswith(b"\n") else b"") + data
        return joined, str(self.dir / JOURNAL_FILE)

    def put_snapshot(self, seq: int, line: bytes) -> None:
        new = self.dir / f".{SNAPSHOT_FILE}.new"
        write_atomic(new, line)  # durable before anything older goes
        try:  # a crash between two renames leaves a snapshot and every record after it (recover reads both)
            if (self.dir / SNAPSHOT_FILE).exists():
                os.replace(self.dir / SNAPSHOT_FILE, self.dir / PREV_SNAPSHOT_FILE)
            os.replace(self.dir / JOURNAL_FILE, self.dir / PREV_JOURNAL_FILE)
            os.replace(new, self.dir / SNAPSHOT_FILE)
            fsync_dir(self.dir)
        finally:
            self._open()  # appends go to journal.jsonl, whatever rename failed

    def snapshots(self) -> list[bytes]:
        return [b for b in (_read_regular(self.dir / n) for n in (SNAPSHOT_FILE, PREV_SNAPSHOT_FILE)) if b is not None]

    def clear(self) -> None:
        os.close(self._fd)
        self._fd = -1
        for name in (JOURNAL_FILE, SNAPSHOT_FILE, PREV_JOURNAL_FILE, PREV_SNAPSHOT_FILE, *OLD_FILES):
            (self.dir / name).unlink(missing_ok=True)
        fsync_dir(self.dir)
        self._open()

    def notes(self) -> list[str]:
        return [f"{self.dir / n} is a journal of the earlier pickle format, not read; run python -m infra.service "
                f"reset --store {self.dir} to remove it" for n in OLD_FILES if (self.dir / n).exists()]


class KVStore:
    """Journal and snapshot in Ray's internal key-value store (the GCS), under ``prefix``."""

    def __init__(self, prefix: str = "infra-scheduler") -> None:
        from ray.experimental import internal_kv

        self.kv = internal_kv
        self.prefix = prefix
        self._snapshot_seq = 0  # of the current snapshot, once this process wrote one

    def _key(self, seq: int) -> bytes:
        return f"{self.prefix}/log/{seq:012d}".encode()

    def append(self, seq: int, line: bytes) -> None:
        self.kv._internal_kv_put(self._key(seq), line, overwrite=True)

    def records(self) -> tuple[bytes, str]:
        keys = sorted(self.kv._internal_kv_list(f"{self.prefix}/log/".encode()))
        lines = [(self.kv._internal_kv_get(key) or b"").rstrip(b"\n") + b"\n" for key in keys]
        return b"".join(lines), f"Ray KV {self.prefix}/log"

    def put_snapshot(self, seq: int, line: bytes) -> None:
        current, prev = f"{self.prefix}/snapshot".encode(), f"{self.prefix}/snapshot.prev".encode()
        old = self.kv._internal_kv_get(current)
        if old is not None:
            self.kv._internal_kv_put(prev, old, overwrite=True)
        self.kv._internal_kv_put(current, line, overwrite=True)
        upto, self._snapshot_seq = self._snapshot_seq, seq  # records after the previous snapshot stay
        for key in self.kv._internal_kv_list(f"{self.prefix}/log/".encode()):
            if int(key.decode().rsplit("/", 1)[1]) <= upto:
                self.kv._internal_kv_del(key)

    def snapshots(self) -> list[bytes]:
        got = (self.kv._internal_kv_get(f"{self.prefix}/{n}".encode()) for n in ("snapshot", "snapshot.prev"))
        return [b for b in got if b is not None]

    def clear(self) -> None:
        for key in self.kv._internal_kv_list(f"{self.prefix}/".encode()):
            self.kv._internal_kv_del(key)

    def notes(self) -> list[str]:
        return []


class Journal:
    """Sequenced write-ahead records and snapshots over a ``Store``.

    Args:
        store: where records go.
        codec: the classes and functions records and snapshots may hold (:data:`SCHEDULER_CLASSES` and more).
        snapshot_every: records between two snapshots.

    Attributes:
        damage: what :meth:`recover` skipped (one line each), empty when the store was intact.
    """

    def __init__(self, store: Store, codec: Codec, snapshot_every: int = 200) -> None:
        self.store, self.codec = store, codec
        self.snapshot_every = snapshot_every
        self.seq = 0
        self._since_snapshot = 0
        self.damage: list[str] = []

    def log(self, op: str, *args: Any) -> int:
        """Append ``(op, args)`` durably; returns its sequence number. ``JournalUnwritable`` when it did not
        reach the store whole: nothing was kept, the sequence number is unchanged, the next call tries again."""
        line = encode_record({"seq": self.seq + 1, "op": op, "args": self.codec.encode(args)})
        self.store.append(self.seq + 1, line)
        self.seq += 1
        self._since_snapshot += 1
        return self.seq

    def due(self) -> bool:
        """Whether a snapshot is due."""
        return self._since_snapshot >= self.snapshot_every

    def snapshot(self, state: Any) -> None:
        """Store ``state`` as the snapshot at the current sequence number."""
        self.store.put_snapshot(self.seq, encode_record({"seq": self.seq, "state": self.codec.encode(state)}))
        self._since_snapshot = 0

    def recover(self, check: Callable[[Any], None] | None = None) -> tuple[Any, list[tuple[int, str, tuple]]]:
        """``(snapshot state or None, [(seq, op, args)] after it)``; sets the sequence number to the last
        one and :attr:`damage` to what was skipped (a damaged snapshot, damaged or undecodable records).

        The last snapshot that decodes and passes ``check`` (which raises ``TypeError`` or ``ValueError``
        on a state of the wrong shape) is used: a damaged one falls back to the one before it.
        """
        self.damage = list(self.store.notes())
        state, seq = None, 0
        for k, data in enumerate(self.store.snapshots()):
            which = "snapshot" if k == 0 else "previous snapshot"
            docs, bad = decode_records(data, which)
            got = self._decode(docs[:1], which, ("seq", "state"))
            try:
                if bad or not got:
                    raise ValueError("unreadable")
                if check is not None:
                    check(got[0]["state"])
            except (TypeError, ValueError) as exc:
                self.damage += bad or [f"{which} not used: {exc}"]
                continue
            seq, state = got[0]["seq"], got[0]["state"]
            break
        else:
            if self.store.snapshots():
                self.damage.append("no snapshot readable: the plan before the journal's first record is lost")
        data, where = self.store.records()
        docs, bad = decode_records(data, where)
        self.damage += bad
        ops = []
        for doc in self._decode(docs, where, ("seq", "op", "args")):
            if doc["seq"] > seq:
                if state is not None and not ops and doc["seq"] != seq + 1:
                    self.damage.append(f"{where}: records {seq + 1}..{doc['seq'] - 1} after the snapshot are missing")
                ops.append((doc["seq"], doc["op"], doc["args"]))
                seq = doc["seq"]
        self.seq = seq
        return state, ops

    def _decode(self, docs: Iterable[dict[str, Any]], where: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
        """Docs with their fields decoded; a doc whose checksum passed but whose data does not decode is skipped."""
        out = []
        for doc in docs:
            try:
                if set(doc) != set(keys) or not isinstance(doc["seq"], int):
                    raise DataError(f"fields {sorted(doc)}, expected {sorted(keys)}")
                out.append({k: doc[k] if k in ("seq", "op") else self.codec.decode(doc[k]) for k in keys})
            except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
                self.damage.append(f"{where}: skipped record {doc.get('seq')!r}: {exc}")
        return out

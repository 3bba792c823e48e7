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

Stores: ``FileStore(directory)`` (``fsync`` on every append, the snapshot written to a temporary
file, renamed over the old one and the directory fsynced), by default under Ray's session directory
(``session``), and ``KVStore`` (Ray's internal key-value store in the GCS).
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterable
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
OLD_FILES = ("journal.log", "snapshot.pkl")
"""The pickle journal of earlier versions: never read, reported when found."""


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
        """Replace the snapshot atomically; records up to ``seq`` may then be dropped."""

    def snapshot(self) -> bytes | None:
        """The last snapshot's bytes, or None."""

    def clear(self) -> None:
        """Forget the journal and the snapshot (``python -m infra.service reset``)."""

    def notes(self) -> list[str]:
        """What the store found that it does not read (files of an older format)."""


class FileStore:
    """Journal and snapshot files in ``directory`` (``journal.jsonl``, ``snapshot.json``)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / JOURNAL_FILE
        self._log = open(path, "ab")  # noqa: SIM115 - held open for appends
        if self._log.tell() and not path.read_bytes().endswith(b"\n"):
            self._log.write(b"\n")  # a torn or damaged tail stays a line of its own: the next record stays intact

    def append(self, seq: int, line: bytes) -> None:
        self._log.write(line)
        self._log.flush()
        os.fsync(self._log.fileno())

    def records(self) -> tuple[bytes, str]:
        path = self.dir / JOURNAL_FILE
        return path.read_bytes() if path.exists() else b"", str(path)

    def put_snapshot(self, seq: int, line: bytes) -> None:
        write_atomic(self.dir / SNAPSHOT_FILE, line)
        self._log.close()
        write_atomic(self.dir / JOURNAL_FILE, b"")  # records before the snapshot are in it
        self._log = open(self.dir / JOURNAL_FILE, "ab")  # noqa: SIM115

    def snapshot(self) -> bytes | None:
        path = self.dir / SNAPSHOT_FILE
        return path.read_bytes() if path.exists() else None

    def clear(self) -> None:
        self._log.close()
        for name in (JOURNAL_FILE, SNAPSHOT_FILE, *OLD_FILES):
            (self.dir / name).unlink(missing_ok=True)
        fsync_dir(self.dir)
        self._log = open(self.dir / JOURNAL_FILE, "ab")  # noqa: SIM115

    def notes(self) -> list[str]:
        return [f"{self.dir / n} is a journal of the earlier pickle format, not read; run python -m infra.service "
                f"reset --store {self.dir} to remove it" for n in OLD_FILES if (self.dir / n).exists()]


class KVStore:
    """Journal and snapshot in Ray's internal key-value store (the GCS), under ``prefix``."""

    def __init__(self, prefix: str = "infra-scheduler") -> None:
        from ray.experimental import internal_kv

        self.kv = internal_kv
        self.prefix = prefix

    def _key(self, seq: int) -> bytes:
        return f"{self.prefix}/log/{seq:012d}".encode()

    def append(self, seq: int, line: bytes) -> None:
        self.kv._internal_kv_put(self._key(seq), line, overwrite=True)

    def records(self) -> tuple[bytes, str]:
        keys = sorted(self.kv._internal_kv_list(f"{self.prefix}/log/".encode()))
        lines = [(self.kv._internal_kv_get(key) or b"").rstrip(b"\n") + b"\n" for key in keys]
        return b"".join(lines), f"Ray KV {self.prefix}/log"

    def put_snapshot(self, seq: int, line: bytes) -> None:
        self.kv._internal_kv_put(f"{self.prefix}/snapshot".encode(), line, overwrite=True)
        for key in self.kv._internal_kv_list(f"{self.prefix}/log/".encode()):
            if int(key.decode().rsplit("/", 1)[1]) <= seq:
                self.kv._internal_kv_del(key)

    def snapshot(self) -> bytes | None:
        return self.kv._internal_kv_get(f"{self.prefix}/snapshot".encode())

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
        """Append ``(op, args)`` durably; returns its sequence number."""
        self.seq += 1
        self.store.append(self.seq, encode_record({"seq": self.seq, "op": op, "args": self.codec.encode(args)}))
        self._since_snapshot += 1
        return self.seq

    def due(self) -> bool:
        """Whether a snapshot is due."""
        return self._since_snapshot >= self.snapshot_every

    def snapshot(self, state: Any) -> None:
        """Store ``state`` as the snapshot at the current sequence number."""
        self.store.put_snapshot(self.seq, encode_record({"seq": self.seq, "state": self.codec.encode(state)}))
        self._since_snapshot = 0

    def recover(self) -> tuple[Any, list[tuple[int, str, tuple]]]:
        """``(snapshot state or None, [(seq, op, args)] after it)``; sets the sequence number to the last
        one and :attr:`damage` to what was skipped (a damaged snapshot, damaged or undecodable records)."""
        self.damage = list(self.store.notes())
        state, seq = None, 0
        data = self.store.snapshot()
        if data is not None:
            docs, bad = decode_records(data, "snapshot")
            got = self._decode(docs[:1], "snapshot", ("seq", "state"))
            if got and not bad:
                seq, state = got[0]["seq"], got[0]["state"]
            else:
                self.damage.append("snapshot unreadable: the plan before the journal's first record is lost")
            self.damage += bad
        data, where = self.store.records()
        docs, bad = decode_records(data, where)
        self.damage += bad
        ops = []
        for doc in self._decode(docs, where, ("seq", "op", "args")):
            if doc["seq"] > seq:
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

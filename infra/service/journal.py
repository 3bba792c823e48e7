"""Write-ahead journal and snapshots of the scheduler service, on a file system or in Ray's GCS.

Every verb that changes the plan is appended (with its time) *before* it is applied; every
``snapshot_every`` records the whole state is written as a snapshot. A restarted service loads the
last snapshot and replays the records after it, which redoes exactly the same decisions (the
scheduler is deterministic given its verbs and their times). A record is
``[length u32][crc32 u32][pickle of (seq, op, args)]``; a torn record at the end of the log (a crash
mid-write) fails its length or checksum and is ignored, as are records already in the snapshot.

Stores: ``FileStore(directory)`` (``fsync`` on every append, the snapshot written to a temporary
file and renamed over the old one) and ``KVStore`` (Ray's internal key-value store in the GCS, the
default: it survives the service actor and needs no shared disk; make the GCS fault tolerant
with Redis for it to survive the head node too).
"""

from __future__ import annotations

import os
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any, Protocol

_HEADER = struct.Struct("<II")


def encode_record(payload: bytes) -> bytes:
    """Length and checksum, then the payload."""
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode_records(data: bytes) -> list[bytes]:
    """The payloads of ``data``, up to the first torn or corrupt record."""
    out, pos = [], 0
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        payload = data[pos + _HEADER.size : pos + _HEADER.size + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            break
        out.append(payload)
        pos += _HEADER.size + length
    return out


class Store(Protocol):
    """Durable storage of the journal and the snapshot."""

    def append(self, seq: int, record: bytes) -> None:
        """Store record ``seq`` durably before returning."""

    def records(self) -> list[bytes]:
        """Every intact record, in order."""

    def put_snapshot(self, seq: int, data: bytes) -> None:
        """Replace the snapshot atomically; records up to ``seq`` may then be dropped."""

    def snapshot(self) -> bytes | None:
        """The last snapshot, or None."""


class FileStore:
    """Journal and snapshot files in ``directory`` (``journal.log``, ``snapshot.pkl``)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.dir / "journal.log", "ab")  # noqa: SIM115 - held open for appends

    def append(self, seq: int, record: bytes) -> None:
        self._log.write(encode_record(record))
        self._log.flush()
        os.fsync(self._log.fileno())

    def records(self) -> list[bytes]:
        path = self.dir / "journal.log"
        return decode_records(path.read_bytes()) if path.exists() else []

    def put_snapshot(self, seq: int, data: bytes) -> None:
        tmp = self.dir / "snapshot.pkl.tmp"
        with open(tmp, "wb") as f:
            f.write(encode_record(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / "snapshot.pkl")
        self._log.close()
        fresh = self.dir / "journal.log.tmp"
        fresh.write_bytes(b"")
        os.replace(fresh, self.dir / "journal.log")  # records before the snapshot are in it
        self._log = open(self.dir / "journal.log", "ab")  # noqa: SIM115

    def snapshot(self) -> bytes | None:
        path = self.dir / "snapshot.pkl"
        if not path.exists():
            return None
        got = decode_records(path.read_bytes())
        return got[0] if got else None


class KVStore:
    """Journal and snapshot in Ray's internal key-value store (the GCS), under ``prefix``."""

    def __init__(self, prefix: str = "infra-scheduler") -> None:
        from ray.experimental import internal_kv

        self.kv = internal_kv
        self.prefix = prefix

    def _key(self, seq: int) -> bytes:
        return f"{self.prefix}/log/{seq:012d}".encode()

    def append(self, seq: int, record: bytes) -> None:
        self.kv._internal_kv_put(self._key(seq), encode_record(record), overwrite=True)

    def records(self) -> list[bytes]:
        keys = sorted(self.kv._internal_kv_list(f"{self.prefix}/log/".encode()))
        out = []
        for key in keys:
            got = decode_records(self.kv._internal_kv_get(key) or b"")
            if not got:
                break
            out += got
        return out

    def put_snapshot(self, seq: int, data: bytes) -> None:
        self.kv._internal_kv_put(f"{self.prefix}/snapshot".encode(), encode_record(data), overwrite=True)
        for key in self.kv._internal_kv_list(f"{self.prefix}/log/".encode()):
            if int(key.decode().rsplit("/", 1)[1]) <= seq:
                self.kv._internal_kv_del(key)

    def snapshot(self) -> bytes | None:
        got = decode_records(self.kv._internal_kv_get(f"{self.prefix}/snapshot".encode()) or b"")
        return got[0] if got else None

    def clear(self) -> None:
        """Forget everything (``python -m infra.service reset``)."""
        for key in self.kv._internal_kv_list(f"{self.prefix}/".encode()):
            self.kv._internal_kv_del(key)


class Journal:
    """Sequenced write-ahead records and snapshots over a ``Store``.

    Args:
        store: where records go.
        snapshot_every: records between two snapshots.
    """

    def __init__(self, store: Store, snapshot_every: int = 200) -> None:
        self.store = store
        self.snapshot_every = snapshot_every
        self.seq = 0
        self._since_snapshot = 0

    def log(self, op: str, *args: Any) -> int:
        """Append ``(op, args)`` durably; returns its sequence number."""
        self.seq += 1
        self.store.append(self.seq, pickle.dumps((self.seq, op, args)))
        self._since_snapshot += 1
        return self.seq

    def due(self) -> bool:
        """Whether a snapshot is due."""
        return self._since_snapshot >= self.snapshot_every

    def snapshot(self, state: Any) -> None:
        """Store ``state`` as the snapshot at the current sequence number."""
        self.store.put_snapshot(self.seq, pickle.dumps((self.seq, state)))
        self._since_snapshot = 0

    def recover(self) -> tuple[Any, list[tuple[str, tuple]]]:
        """``(snapshot state or None, [(op, args)] after it)``; sets the sequence number to the last one."""
        state, seq = None, 0
        data = self.store.snapshot()
        if data is not None:
            seq, state = pickle.loads(data)
        ops = []
        for record in self.store.records():
            rseq, op, args = pickle.loads(record)
            if rseq > seq:
                ops.append((op, args))
                seq = rseq
        self.seq = seq
        return state, ops

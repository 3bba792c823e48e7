"""One run per directory: safe run names and an exclusive lock held for a run's life.

Both trainers (``vla_rl.trainer.Trainer`` and ``infra.llm.rlvr.run_rlvr``) name their run directory
``out_dir/NAME``; :func:`check_run_name` keeps ``NAME`` one plain path component, and
:class:`RunDirLock` holds ``fcntl.flock`` on ``NAME/.lock`` from before the first file of the run is
touched until the run ends, so a second process started on the same directory is refused with the
holder's PID instead of resuming or overwriting a run that is still going. The kernel drops the lock
when its process dies, so a crashed run never leaves a stale lock behind (its ``.lock`` file, left,
is locked again by the next run); a run that ends removes it.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
from pathlib import Path

from infra.common.limits import short
from infra.common.typed_config import ConfigError

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]{0,127}")
"""A run name: letters, digits and ``_ . = + -``, starting with a letter or digit, at most 128 characters
(no path separator, never ``.`` or ``..``)."""
LOCK_FILE = ".lock"
_HELD: dict[str, list[int]] = {}
"""Run directories this process holds: real path -> [descriptor, holders]."""


class RunDirBusy(ConfigError):
    """Another process holds the run directory's lock (a config error as a name already taken is: the fix is
    another ``name=``, or waiting)."""


def check_run_name(name: str, key: str = "name") -> None:
    """``ConfigError`` unless ``name`` is a safe run name (:data:`RUN_NAME`): it must stay inside the output folder."""
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
        raise ConfigError(f"{key}={short(name)} is not a run name: write one directory name of letters, digits and "
                          "_ . = + - (starting with a letter or digit, at most 128 characters), e.g. name=reach_ppo_s1")


class RunDirLock:
    """The exclusive lock of ``run_dir`` for this process (``release`` or the process's end frees it); holders
    in one process share it (a trainer built again on its directory to resume), other processes are refused.

    The directory is made when missing; :meth:`release` removes it again when this lock made it and
    nothing but the lock file is in it (a run refused before writing leaves nothing behind).

    Raises:
        RunDirBusy: another process holds it; the message names its PID and command line.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._key = os.path.realpath(self.run_dir)
        self.made = not self.run_dir.exists()
        if self._key in _HELD:  # this process holds it already (a trainer built again to resume): shared
            _HELD[self._key][1] += 1
            self.made, self._fd = False, _HELD[self._key][0]
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._fd = -1
        while self._fd < 0:
            self._fd = self._take(self.run_dir / LOCK_FILE)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()} ({' '.join(sys.argv)[:200]})\n".encode(), 0)
        _HELD[self._key] = [self._fd, 1]

    def _take(self, path: Path) -> int:
        """The locked descriptor of ``path``, or -1 when the file was replaced meanwhile (try again)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 400, 0).decode(errors="replace").strip()[:200] or "unknown"
            holder = "".join(c if c.isprintable() else "?" for c in text)
            os.close(fd)
            raise RunDirBusy(f"run directory {self.run_dir} is in use by process {holder}: wait for it "
                             "to end or stop it, or choose another name=") from None
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it between our open and our lock: lock the new one
            os.close(fd)
            return -1
        return fd

    def release(self) -> None:
        """Free the lock and remove its file (idempotent); remove the directory too when this lock made it and
        nothing else is in it (a run refused before writing leaves nothing behind)."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        _HELD[self._key][1] -= 1
        if _HELD[self._key][1]:
            return
        del _HELD[self._key]
        (self.run_dir / LOCK_FILE).unlink(missing_ok=True)  # while still held: a waiter then locks a new file
        if self.made and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()
        os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

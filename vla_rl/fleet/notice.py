"""A preemption notice delivered to the running trainer: the service tells the job's driver that its gang must
stop, and :class:`NoticeRelay` turns that into SIGTERM for the trainer's process on its node, which checkpoints
and exits (the driver and :mod:`vla_rl.fleet.data_parallel`'s ranks both arm it)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

import ray


@ray.remote(num_cpus=0, max_retries=0)
def _sigterm(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)


class NoticeRelay:
    """Turns the service's preemption notice into SIGTERM for the running trainer (on its node)."""

    def __init__(self) -> None:
        self.noticed = threading.Event()
        self._target: tuple[str, int] | None = None
        self._lock = threading.Lock()

    def notice(self, _status: Any) -> None:
        """The gang was told to stop: signal the trainer now, or as soon as one is armed."""
        with self._lock:
            self.noticed.set()
            target = self._target
        if target is not None:
            _signal(target)

    def arm(self, node_id: str, pid: int) -> None:
        """The trainer to signal from now on (signalled at once if a notice came first)."""
        with self._lock:
            self._target = (node_id, pid)
            noticed = self.noticed.is_set()
        if noticed:
            _signal((node_id, pid))

    def disarm(self) -> None:
        with self._lock:
            self._target = None


def _signal(target: tuple[str, int]) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node_id, pid = target
    with contextlib.suppress(Exception):  # the trainer may be gone already
        ray.get(_sigterm.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(pid),
                timeout=30)

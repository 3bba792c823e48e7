"""The scheduler's event log: every step of every verb, in order (``EventKind``, ``Event``, ``EventLog``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import StrEnum


class EventKind(StrEnum):
    """What an ``Event`` records."""

    SUBMITTED = "submitted"
    PLACED = "placed"
    READY = "ready"
    QUEUED = "queued"
    RESERVED = "reserved"
    UNRESERVED = "unreserved"
    PREEMPT_NOTICE = "preempt_notice"
    PREEMPTED = "preempted"
    FORCED_STOP = "forced_stop"
    RELEASED = "released"
    RESIZED = "resized"
    TIMED_OUT = "timed_out"
    NODE_JOINED = "node_joined"
    NODE_LOST = "node_lost"
    NODE_RESTORED = "node_restored"
    EVICTED_BY_NODE_LOSS = "evicted_by_node_loss"
    SERVICE_PROBLEM = "service_problem"
    """Not the plan's: the service's journal damage, replay and background errors (``seq`` -1)."""


@dataclass(frozen=True)
class Event:
    """One entry of the event log.

    Attributes:
        seq: position in the log.
        kind: what happened.
        gang: the gang concerned ("" for node events).
        time: the scheduler's time of the event (seconds).
        detail: kind-specific facts (nodes, priorities, reasons, sizes, deadlines).
    """

    seq: int
    kind: EventKind
    gang: str
    time: float = 0.0
    detail: dict = field(default_factory=dict)


class EventLog:
    """The events kept, oldest first.

    Args:
        max_events: events kept (once twice as many are logged the oldest are dropped down to this
            many; None keeps all).
    """

    def __init__(self, max_events: int | None = None) -> None:
        self.events: list[Event] = []
        self.max_events = max_events
        self._seq = itertools.count()

    def add(self, kind: EventKind, gang: str, now: float, **detail) -> None:
        """Append an event of ``kind`` about ``gang`` at time ``now``."""
        self.events.append(Event(next(self._seq), kind, gang, now, detail))
        if self.max_events is not None and len(self.events) > 2 * self.max_events:
            del self.events[: len(self.events) - self.max_events]

    def since(self, seq: int) -> list[Event]:
        """Events with a sequence number above ``seq`` (those still kept)."""
        lo, hi = 0, len(self.events)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.events[mid].seq <= seq:
                lo = mid + 1
            else:
                hi = mid
        return self.events[lo:]

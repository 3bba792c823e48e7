"""One restart policy: a budget of restarts, a timeout per attempt, a recovery hook after each restart.

Everything in the project that starts a component again after it died goes through a
:class:`Supervisor`: the fleet trainer's job loop (``vla_rl.fleet.job``), the fleet collector's
re-collection of an iteration (``vla_rl.fleet.collector``), the LLM services'
``infra.llm.service_plane.ResilientService``, the scheduler client's
``infra.service.client.GangBackend`` and the LLM jobs' reward worker (``infra.llm.reward.RewardRunner``). Each says what it supervises, which setting bounds its
restarts, and what to do after a restart (the *recovery hook*: roll shards back, replay a
service's jobs, tell the owner); the supervisor counts, decides and names the setting when it
gives up::

    supervisor = Supervisor("the trainer", max_restarts=3, setting="fleet.max_restarts")
    supervisor.restart(cause, recover=restart_data_plane)   # counts; raises once the budget is spent
    result = supervisor.run(attempt, retry_on=(RayActorError,), recover=roll_back)   # the whole loop

Detecting a death stays with the caller (Ray raises ``RayActorError``, a trainer returns
``None``, a gang is placed again): only the caller knows which failures a restart can mend.
Errors are one line, name the setting that would allow more, and chain the cause.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

CAUSE_CHARS = 200
"""Longest excerpt of a cause in an error message (Ray's errors run to many lines)."""


class SupervisorEvent(enum.Enum):
    """What a supervisor reports to ``on_event``, in the order it happens."""

    DIED = "died"
    """An attempt failed in a way a restart can mend; counted against the budget."""
    RESTARTING = "restarting"
    """The budget allows a restart: the recovery hook runs next."""
    RESTARTED = "restarted"
    """The recovery hook returned: the component runs again."""
    GAVE_UP = "gave_up"
    """The budget is spent: the supervisor raises its error."""
    TIMED_OUT = "timed_out"
    """An attempt ran past the timeout; a hang is not restarted, the supervisor raises."""


class RestartsExhausted(RuntimeError):
    """A component died more often than its restart budget allows (the message names the setting)."""


class AttemptTimedOut(TimeoutError):
    """One attempt ran past its timeout (the message names the setting)."""


class Supervisor:
    """Counts a component's restarts against a budget and runs the recovery hook after each.

    Args:
        what: the supervised component as a message names it ("the trainer", "the reward service").
        max_restarts: restarts allowed in the supervisor's life (None: no limit; 0: none).
        setting: the name a user changes to allow more restarts ("fleet.max_restarts").
        timeout_s: the longest one attempt of :meth:`attempt` / :meth:`run` may take (None: no limit).
        timeout_setting: the name a user changes to allow longer attempts.
        on_event: called with each :class:`SupervisorEvent` and a one-line detail.
        error: builds the exception raised when the budget is spent (from the one-line message).
        timeout_error: builds the exception raised when an attempt times out.

    Attributes:
        restarts: the restarts done so far (recovery hooks that were started).
    """

    def __init__(
        self, what: str, max_restarts: int | None, setting: str, *, timeout_s: float | None = None,
        timeout_setting: str = "timeout_s", on_event: Callable[[SupervisorEvent, str], None] | None = None,
        error: Callable[[str], Exception] = RestartsExhausted,
        timeout_error: Callable[[str], Exception] = AttemptTimedOut,
    ) -> None:
        if max_restarts is not None and max_restarts < 0:
            raise ValueError(f"{setting}={max_restarts} for {what}; a restart budget is 0 or more (None: no limit)")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"{timeout_setting}={timeout_s} for {what}; a timeout is positive seconds (None: no limit)")
        self.what = what
        self.max_restarts = max_restarts
        self.setting = setting
        self.timeout_s = timeout_s
        self.timeout_setting = timeout_setting
        self.on_event = on_event
        self.error = error
        self.timeout_error = timeout_error
        self.restarts = 0

    def restart(self, cause: BaseException | str, recover: Callable[[], T]) -> T:
        """Count a death from ``cause``; when the budget allows, run ``recover`` once and return its result.

        Raises:
            the ``error`` (``RestartsExhausted`` by default), chained to ``cause``: the budget is spent.
        """
        why = _one_line(cause)
        self._emit(SupervisorEvent.DIED, why)
        if self.max_restarts is not None and self.restarts >= self.max_restarts:
            message = (f"{self.what} died {self.restarts + 1} times, more than {self.setting}={self.max_restarts} "
                       f"allows; raise {self.setting} or find why it dies (last: {why})")
            self._emit(SupervisorEvent.GAVE_UP, message)
            raise self.error(message) from (cause if isinstance(cause, BaseException) else None)
        self.restarts += 1
        self._emit(SupervisorEvent.RESTARTING, why)
        result = recover()
        self._emit(SupervisorEvent.RESTARTED, f"restart {self.restarts}")
        return result

    def attempt(self, fn: Callable[[float | None], T]) -> T:
        """``fn(timeout_s)``: one attempt, given the time it has; a ``TimeoutError`` it raises (Ray's
        ``GetTimeoutError`` is one) becomes the one-line ``timeout_error`` naming ``timeout_setting``."""
        if self.timeout_s is None:
            return fn(None)
        try:
            return fn(self.timeout_s)
        except TimeoutError as exc:
            message = (f"{self.what} did not finish within {self.timeout_setting}={self.timeout_s:g} s; raise "
                       f"{self.timeout_setting} if it is only slow, else find why it hangs ({_one_line(exc)})")
            self._emit(SupervisorEvent.TIMED_OUT, message)
            raise self.timeout_error(message) from exc

    def run(self, fn: Callable[[float | None], T], retry_on: tuple[type[BaseException], ...],
            recover: Callable[[BaseException], Any]) -> T:
        """Run :meth:`attempt` ``(fn)`` until it returns; after each failure in ``retry_on`` (a death),
        :meth:`restart` with ``recover(exc)`` as the hook. Other errors, timeouts included, propagate."""
        while True:
            try:
                return self.attempt(fn)
            except retry_on as exc:
                self.restart(exc, functools.partial(recover, exc))

    def _emit(self, event: SupervisorEvent, detail: str) -> None:
        if self.on_event is not None:
            self.on_event(event, detail)


def _one_line(cause: BaseException | str) -> str:
    """The first line of ``cause`` (its type name when it says nothing), at most ``CAUSE_CHARS`` long."""
    text = cause if isinstance(cause, str) else (str(cause).strip() or type(cause).__name__)
    first = text.strip().splitlines()[0] if text.strip() else "no reason given"
    return first if len(first) <= CAUSE_CHARS else first[: CAUSE_CHARS - 3] + "..."

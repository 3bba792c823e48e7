"""One way to call a service: ``handle.call(method, *args)`` (in-process here; Ray actors in
:mod:`infra.llm.service_plane`), and the handles of the three services one job calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class ServiceHandle(Protocol):
    """A service the job loop calls by method name."""

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on the service and return its result (raising its exception)."""
        ...

    def call_ref(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Run ``method``, which returns ``(payload, meta)``; return ``(payload reference, meta)``.

        Across processes the payload (a job's weights) stays where it was produced: the reference
        is passed on as an argument of another service's call, which receives the payload itself,
        and this process never fetches it. In-process the reference is the payload.
        """
        ...


@dataclass(frozen=True)
class JobServices:
    """The three services one job calls."""

    rollout: ServiceHandle
    reward: ServiceHandle
    trainer: ServiceHandle


class LocalHandle:
    """A service object in this process."""

    def __init__(self, service: object) -> None:
        self.service = service

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.service, method)(*args, **kwargs)

    def call_ref(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return self.call(method, *args, **kwargs)

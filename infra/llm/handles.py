"""One way to call a service, in-process or as a Ray actor: ``handle.call(method, *args)``."""

from __future__ import annotations

from typing import Any, Protocol


class ServiceHandle(Protocol):
    """A service the job loop calls by method name."""

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on the service and return its result (raising its exception)."""
        ...


class LocalHandle:
    """A service object in this process."""

    def __init__(self, service: object) -> None:
        self.service = service

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.service, method)(*args, **kwargs)


class RayHandle:
    """A service running as a Ray actor; every call is bounded by ``timeout_s``."""

    def __init__(self, actor: Any, timeout_s: float = 120.0) -> None:
        self.actor = actor
        self.timeout_s = timeout_s

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        return ray.get(getattr(self.actor, method).remote(*args, **kwargs), timeout=self.timeout_s)

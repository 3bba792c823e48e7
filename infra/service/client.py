"""The client of the scheduler service: submit gangs, wait, start actors on the placement, obey notices.

    client = connect()                                  # the service of the connected Ray cluster
    gang = client.submit(GangRequest("job", bundles), tenant="robot", priority=0, grace_s=30)
    gang.wait(timeout_s=600)                            # -> GangStatus with placement and groups
    backend = GangBackend(gang)
    actor = backend.start_actor(0, MyActor, arg, options={"max_restarts": 2})
    gang.on_notice(lambda status: ...)                  # preempted: checkpoint, then gang.stopped()
    gang.release()

``GangBackend`` remembers what it started on each bundle and starts it again, on the new groups,
whenever the gang is placed again (after a preemption, a node loss, a restart of the service
that lost the groups) or grows; actors of removed bundles stop with their groups. Actors ask Ray
for the bundle's own CPU and GPU amounts inside its group, so ``CUDA_VISIBLE_DEVICES`` and
``ray.get_gpu_ids()`` are the planned GPUs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.common.supervisor import Supervisor
from infra.scheduler.requests import GangRequest, RequestError
from infra.scheduler.resources import MILLI
from infra.service.actor import (
    NAMESPACE,
    SERVICE_NAME,
    TOKEN_FILE_ENV,
    ClusterStatus,
    GangStatus,
    HandleState,
    admin_token_path,
    ensure_admin_token,
    read_token,
    start,
    token_digest,
)

WATCH_S = 5.0
"""Long-poll period of a handle's watcher (also its heartbeat to the service)."""
CALL_TIMEOUT_S = 120.0
"""Longest wait for one call to the service, retries while Ray restarts it included."""


class GangFailed(RuntimeError):
    """The gang ended without running (timed out, cancelled, its owner gone); the message says why."""


def credential(token_file: str | Path | None = None) -> str:
    """The token this process presents to the service.

    ``token_file``, else the file ``$INFRA_SCHEDULER_TOKEN_FILE`` names, else this user's admin token
    file when it exists (the user who started the service); "" when there is none (every call is
    then refused with the fix).
    """
    path = token_file or os.environ.get(TOKEN_FILE_ENV)
    if path:
        if not Path(path).is_file():
            raise FileNotFoundError(f"scheduler token file {path} does not exist: write the one "
                                    "`python -m infra.service.cli token issue TENANT` printed there, or fix the path")
        return read_token(Path(path))
    admin = admin_token_path()
    return read_token(admin) if admin.is_file() else ""


def check_reachable(address: str | None, timeout_s: float) -> None:
    """Raise ``ConnectionError`` naming ``address`` and the fix when no process listens on the Ray
    address it resolves to within ``timeout_s``: ``ray.init`` itself retries for minutes."""
    from ray._private.services import canonicalize_bootstrap_address  # what ray.init resolves "auto" with

    try:
        target = canonicalize_bootstrap_address(address)
    except Exception:  # no cluster found or a malformed address: ray.init says so at once
        return
    if target is None:
        return
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        why = f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else exc.strerror or repr(exc)
        where = address if target == address else f"{address} (= {target})"
        raise ConnectionError(
            f"no Ray cluster answers at {where}: {why}; pass the head's address (`--address HOST:PORT`, "
            "as `ray status` prints it) or start one (`ray start --head`)"
        ) from None


def connect(
    address: str | None = None, *, start_service: bool = True, token_file: str | Path | None = None,
    timeout_s: float = CALL_TIMEOUT_S, **options: Any,
) -> SchedulerClient:
    """The client of the cluster's scheduler service (starting it on first use when ``start_service``).

    Args:
        address: Ray address to connect to when this process is not connected yet.
        start_service: start the service if it does not run (else raise ``ValueError``); a service
            started here has this user's admin token (``admin_token_path()``, made if absent) and starts
            fresh only: over a journal that holds a plan it is refused (``ServiceRefused``), since only
            ``python -m infra.service start`` by that plan's admin recovers one.
        token_file: the credential to present (see ``credential``).
        timeout_s: longest wait for the cluster and for each call (``TimeoutError``/``ConnectionError``).
        options: ``SchedulerService`` options for a service started here (policy, quotas, store ...).
    """
    import ray

    if not ray.is_initialized():
        check_reachable(address, timeout_s)
        ray.init(address=address, log_to_driver=False)
    try:
        actor = ray.get_actor(SERVICE_NAME, namespace=NAMESPACE)
        ray.get(actor.start.remote(), timeout=timeout_s)
    except ValueError:
        if not start_service:
            raise ValueError("no scheduler service runs; start one with `python -m infra.service start`") from None
        actor = start(admin_sha256=token_digest(ensure_admin_token()), fresh=True, **options)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"the scheduler service did not answer within {timeout_s:g} s: see `ray status` and "
                           "the actor's log, or restart it (`python -m infra.service stop` then `start`)") from None
    return SchedulerClient(actor, credential(token_file), timeout_s)


class SchedulerClient:
    """Verbs and queries of the service (see ``infra.service.SchedulerService``).

    Args:
        actor: the service actor.
        cred: the token presented with every call (``credential()``).
        timeout_s: longest wait for one call.
    """

    def __init__(self, actor: Any, cred: str = "", timeout_s: float = CALL_TIMEOUT_S) -> None:
        import ray

        self.actor = actor
        self.cred = cred
        self.timeout_s = timeout_s
        self.owner = ray.get_runtime_context().get_job_id()

    def _call(self, method: str, *args: Any, wait_s: float = 0.0) -> Any:
        """Call the service with this client's credential; while it restarts (it is restartable),
        retry for up to ``timeout_s`` (plus ``wait_s``, the time a long poll waits on purpose)."""
        import ray

        limit = self.timeout_s + wait_s
        end = time.monotonic() + limit
        while True:
            try:
                return ray.get(getattr(self.actor, method).remote(*args, cred=self.cred), timeout=limit)
            except ray.exceptions.RayActorError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.5)
                with contextlib.suppress(ValueError):
                    self.actor = ray.get_actor(SERVICE_NAME, namespace=NAMESPACE)

    def submit(
        self, req: GangRequest, *, tenant: str | None = None, priority: int | None = None,
        grace_s: float | None = None, timeout_s: float | None = None,
    ) -> GangHandle:
        """Submit ``req`` (the keyword arguments override its fields); raises ``RequestError`` with the reason."""
        changes = {k: v for k, v in {"tenant": tenant, "priority": priority, "grace_s": grace_s,
                                     "timeout_s": timeout_s}.items() if v is not None}
        req = dataclasses.replace(req, **changes)
        status = self._call("submit", req, self.owner)
        handle = GangHandle(self, req, status)
        handle.keep_alive()  # the service releases the gangs of owners it stops hearing from
        return handle

    def release(self, name: str, reason: str = "released") -> GangStatus:
        """Release gang ``name``."""
        return self._call("release", name, reason, self.owner)

    def cancel(self, name: str) -> GangStatus:
        """Cancel gang ``name``."""
        return self._call("cancel", name)

    def issue_token(self, tenant: str) -> str:
        """A new token for ``tenant`` (this client must hold the admin token)."""
        return self._call("issue_token", tenant)

    def revoke_tokens(self, tenant: str) -> int:
        """Void every token of ``tenant`` (admin only); how many there were."""
        return self._call("revoke_tokens", tenant)

    def prune_groups(self) -> int:
        """Remove the placement groups kept after a damaged journal (admin only); how many went."""
        return self._call("prune_groups")

    def gang(self, name: str) -> GangStatus:
        """The status of gang ``name``."""
        return self._call("gang", name, self.owner)

    def status(self) -> ClusterStatus:
        """Nodes, tenants, counts."""
        return self._call("status")

    def queue(self) -> list[GangStatus]:
        """Waiting gangs in service order."""
        return self._call("queue")

    def gangs(self) -> list[GangStatus]:
        """Every gang the plan holds."""
        return self._call("gangs")

    def events(self, since: int = -1, limit: int = 100) -> list:
        """Events after sequence number ``since``."""
        return self._call("events", since, limit)


class GangHandle:
    """One submitted gang: its status, waits, the preemption contract, release.

    Attributes:
        client: the client it was submitted with.
        request: the request as submitted.
        name: the gang's name.
    """

    def __init__(self, client: SchedulerClient, request: GangRequest, status: GangStatus) -> None:
        self.client = client
        self.request = request
        self.name = request.name
        self._status = status
        self._watchers: list[Callable[[GangStatus], None]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._cond = threading.Condition()

    @property
    def status(self) -> GangStatus:
        """The latest status known here (``refresh`` asks the service)."""
        return self._status

    def refresh(self) -> GangStatus:
        """Ask the service for the current status."""
        self._update(self.client.gang(self.name))
        return self._status

    def _update(self, status: GangStatus) -> None:
        with self._cond:
            if status.version >= self._status.version or status.state.terminal:
                self._status = status
            self._cond.notify_all()

    def wait(self, timeout_s: float | None = None, states: tuple[HandleState, ...] = (HandleState.PLACED,)) -> GangStatus:
        """Block until the gang is in one of ``states`` (placed by default); its status.

        Raises:
            GangFailed: it ended (timed out, cancelled, owner gone) before that.
            TimeoutError: not there after ``timeout_s``.
        """
        end = None if timeout_s is None else time.monotonic() + timeout_s
        status = self._status
        while status.state not in states:
            if status.state.terminal:
                raise GangFailed(f"gang {self.name!r} is {status.state.value}: {status.reason}")
            left = WATCH_S if end is None else min(WATCH_S, end - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"gang {self.name!r} is still {status.state.value} after {timeout_s} s: {status.reason}")
            if self._thread is not None:
                with self._cond:
                    self._cond.wait(left)
                status = self._status
            else:
                status = self.client._call("watch", self.name, status.version, left, self.client.owner, wait_s=left)
                self._update(status)
                status = self._status
        return status

    def on_change(self, callback: Callable[[GangStatus], None]) -> None:
        """Call ``callback(status)`` from the watcher thread on every change."""
        self._watchers.append(callback)
        self.keep_alive()

    def keep_alive(self) -> None:
        """Start the watcher thread (once): it follows the status and renews the owner's lease."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name=f"watch:{self.name}", daemon=True)
            self._thread.start()

    def on_notice(self, callback: Callable[[GangStatus], None]) -> None:
        """Call ``callback(status)`` once per preemption notice (state ``draining``, with its deadline)."""
        told: set[int] = set()

        def notice(status: GangStatus) -> None:
            if status.state is HandleState.DRAINING and status.preemptions not in told:
                told.add(status.preemptions)
                callback(status)

        self.on_change(notice)

    def _watch(self) -> None:
        import ray

        while not self._stop.is_set():
            if not ray.is_initialized():
                return  # the driver disconnected: never reconnect from here
            try:
                status = self.client._call("watch", self.name, self._status.version, WATCH_S, self.client.owner,
                                           wait_s=WATCH_S)
            except (KeyError, SystemExit):
                return
            except Exception:
                if not ray.is_initialized():
                    return
                raise
            changed = status.version != self._status.version or status.state != self._status.state
            self._update(status)
            if changed:
                for cb in list(self._watchers):
                    cb(status)
            if status.state.terminal:
                return

    def stopped(self) -> GangStatus:
        """Report that the gang checkpointed and stopped after a notice; it waits to run again."""
        self._update(self.client._call("stopped", self.name, self.client.owner))
        return self._status

    def resize(self, num_bundles: int) -> GangStatus:
        """Grow or shrink an elastic gang."""
        self._update(self.client._call("resize", self.name, num_bundles, self.client.owner))
        return self._status

    def release(self, reason: str = "released") -> GangStatus:
        """The gang is done: its groups go (stopping its actors); returns once the watcher has stopped."""
        self._stop.set()
        self._update(self.client.release(self.name, reason))
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # Its watch call returns on the release. A Ray call still in flight when the driver
            # shuts Ray down ends the whole process (exit status 1, "core worker has already been
            # shutdown"), so a caller that releases and then shuts down must not race it.
            thread.join(timeout=2 * WATCH_S)
        return self._status


class GangBackend:
    """Starts actors on a gang's groups and starts them again wherever the gang is placed next.

    Args:
        gang: the gang's handle (placed or not yet).
        on_restart: called with the backend after it restarted the actors on a new placement (or started
            those of bundles an elastic gang grew by).
        restart: start the actors again on new placements (False: a job that restarts itself).

    Attributes:
        supervisor: counts the restarts on new placements (``infra.common.supervisor.Supervisor``, no limit:
            the actors follow the gang wherever the scheduler places it; the relaunch is its recovery hook).
    """

    def __init__(
        self, gang: GangHandle, on_restart: Callable[[GangBackend], None] | None = None, restart: bool = True
    ) -> None:
        self.gang = gang
        self.on_restart = on_restart
        self.supervisor = Supervisor(f"gang {gang.name!r}'s actors", None, "GangBackend(restart=)")
        self._specs: dict[int, tuple[Any, tuple, dict, dict]] = {}
        self._actors: dict[int, Any] = {}
        self._epoch = gang.status.placement.epoch if gang.status.placement else 0
        self._lock = threading.RLock()
        if restart:
            gang.on_change(self._changed)

    def start_actor(self, bundle: int, actor_cls: Any, *args: Any, options: dict | None = None, **kwargs: Any) -> Any:
        """Start ``actor_cls`` (a ``@ray.remote`` class) on ``bundle``'s group; remembered for restarts.

        Returns the actor, or None when the bundle is not placed yet (an elastic gang's bundle): it
        starts when it is. ``options`` go to Ray's ``.options()`` (``max_restarts``,
        ``max_concurrency``, ``name`` ...); the placement keys (``scheduling_strategy``,
        ``num_cpus``, ``num_gpus``, ``resources``) are ours.
        """
        options = dict(options or {})
        ours = {"scheduling_strategy", "num_cpus", "num_gpus", "resources"} & set(options)
        if ours:
            raise ValueError(f"start_actor options {sorted(ours)} are set by the placement; drop them.")
        with self._lock:
            self._specs[bundle] = (actor_cls, args, kwargs, options)
            status = self.gang.status
            if status.state is HandleState.PLACED and bundle in status.groups:
                return self._launch(bundle, status)
            return None

    def actor(self, bundle: int) -> Any:
        """The current handle of the actor of ``bundle``."""
        return self._actors[bundle]

    def _launch(self, bundle: int, status: GangStatus) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if status.state is not HandleState.PLACED or bundle not in status.groups:
            raise RequestError(f"gang {self.gang.name!r} bundle {bundle} is not placed ({status.state.value}: {status.reason})")
        cls, args, kwargs, options = self._specs[bundle]
        b = self.gang.request.bundles[bundle]
        a = next(x for x in status.placement.assignments if x.bundle == bundle)
        options = dict(options)
        env = dict(options.pop("runtime_env", None) or {})
        env["env_vars"] = {**env.get("env_vars", {}), "CUDA_VISIBLE_DEVICES": ",".join(map(str, a.gpus))}
        handle = cls.options(
            num_cpus=b.cpu_milli / MILLI, num_gpus=b.total_gpu_milli / MILLI, runtime_env=env,
            scheduling_strategy=PlacementGroupSchedulingStrategy(status.groups[bundle], placement_group_bundle_index=0),
            **options,
        ).remote(*args, **kwargs)
        self._actors[bundle] = handle
        return handle

    def _changed(self, status: GangStatus) -> None:
        """Placed again (new epoch) or grown: start what was started before on the new groups."""
        if status.state is not HandleState.PLACED:
            return
        with self._lock:
            epoch = status.placement.epoch
            fresh = epoch != self._epoch
            todo = [b for b in self._specs if b in status.groups and (fresh or b not in self._actors)]
            self._epoch = epoch
            for b in [b for b in self._actors if fresh or b not in status.groups]:
                del self._actors[b]  # its group is gone, and the actor with it
            if not todo:
                return
            launch = functools.partial(self._launch_all, todo, status)
            if fresh:  # the old groups are gone with their actors: a restart
                self.supervisor.restart(f"placed again at epoch {epoch} ({status.reason})", launch)
            else:  # grown: the new bundles' actors start for the first time
                launch()
        if self.on_restart is not None:
            self.on_restart(self)

    def _launch_all(self, bundles: list[int], status: GangStatus) -> None:
        for b in bundles:
            self._launch(b, status)

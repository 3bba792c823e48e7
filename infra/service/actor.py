"""The scheduler service: one per Ray cluster, a detached named actor that owns the plan.

``python -m infra.service start|stop|reset`` (:mod:`infra.service.cli`) manages it;
``infra.service.client.connect`` starts it on first use over an empty journal. It

* discovers nodes and GPUs from Ray and follows joins and deaths (``ray.nodes()``, polled);
* serves ``submit`` / ``release`` / ``stopped`` / ``resize`` / ``cancel``, status, queue and events,
  and long polls (``watch``) that let jobs learn of placements and preemption notices;
* realises every ready placement as Ray placement groups on the planned node and GPUs
  (``infra.ray_cluster.realize.Realizer``), removes those of gangs stopped, preempted past their grace,
  released or lost, and so force-stops their actors;
* writes each verb to its journal before applying it (``infra.service.journal``), so that a restarted
  service recovers every placement and the queue, then adopts the placement groups it finds
  alive and removes the ones its plan does not hold (no double booking);
* releases the gangs of owners (drivers) not heard from for ``owner_lease_s``;
* checks the credential of every call (``Credentials``): a tenant's token submits only as that
  tenant (so spends only its quota) and releases, cancels, resizes or stops only that tenant's
  gangs; the admin token may do everything and issues tenant tokens (``issue_token``).

It listens nowhere: clients reach it as a Ray actor, so whoever can reach it is whoever Ray lets in
(Ray's token authentication, when it is on); its own tokens tell tenants apart among those.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import stat
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from infra.common.files import write_atomic
from infra.common.limits import short
from infra.common.plain_data import Codec
from infra.ray_cluster.realize import (
    BLOCKER_PREFIX,
    GROUP_PREFIX,
    BundleSpec,
    Realizer,
    discover_nodes,
    parse_group_name,
)
from infra.scheduler import Event, EventKind, GangRequest, GangState, Placement, Scheduler
from infra.scheduler.quota import Quota
from infra.scheduler.requests import RequestError, check_bounds
from infra.scheduler.resources import Cluster
from infra.service.journal import SCHEDULER_CLASSES, FileStore, Journal, KVStore

SERVICE_NAME = "infra-scheduler"
"""Name of the service actor."""
NAMESPACE = "infra"
"""Ray namespace of the service actor and of its placement groups."""
MAX_EVENTS = 100_000
"""Events the service keeps."""
MAX_NAME = 200
"""Longest tenant name."""


class ServiceRefused(RuntimeError):
    """A service was asked to start fresh over a journal that holds a plan (see ``connect``)."""


def _restarted_by_ray() -> bool:
    """Whether this process is a service actor that Ray restarted after a crash (it then recovers its plan)."""
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed
    except Exception:  # not inside an actor: a service built in-process is never a restart
        return False


class HandleState(StrEnum):
    """What a job sees of its gang."""

    WAITING = "waiting"
    PLACED = "placed"
    DRAINING = "draining"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (HandleState.FINISHED, HandleState.TIMED_OUT, HandleState.CANCELLED, HandleState.FAILED)


JOURNAL_CODEC = Codec(classes=(*SCHEDULER_CLASSES, HandleState), functions=(time.time,))
"""What the service's journal may hold: the scheduler's classes, the terminal states, the clock."""


@dataclass(frozen=True)
class GangStatus:
    """A gang as the service sees it.

    Attributes:
        name, tenant, priority: from the request.
        state: waiting, placed (its placement groups exist), draining (told to stop by
            ``deadline``), preempted (waits again after a preemption), or a terminal state.
        version: bumped on every change (``watch`` waits for a newer one).
        placement: node and GPUs per bundle once placed.
        groups: bundle -> Ray placement group (one bundle each) once placed.
        deadline: forced-stop time (wall clock) while draining, timeout while waiting.
        reason: why it waits, why it was stopped, or how it ended.
        preemptions: notices so far.
        owner: the driver that submitted it.
    """

    name: str
    state: HandleState
    tenant: str = "default"
    priority: int = 0
    version: int = 0
    placement: Placement | None = None
    groups: dict[int, Any] = field(default_factory=dict)
    deadline: float | None = None
    reason: str = ""
    preemptions: int = 0
    owner: str = ""


@dataclass(frozen=True)
class NodeStatus:
    """One node: capacity and what is free (milli-CPU, MiB, milli-GPU per GPU)."""

    name: str
    alive: bool
    cpu_milli: int
    cpu_free: int
    memory_mib: int
    memory_free: int
    gpu_model: str
    gpu_memory_mib: int
    gpu_free: tuple[int, ...]
    gangs: tuple[str, ...]


@dataclass(frozen=True)
class ClusterStatus:
    """The whole service: nodes, tenants' quota usage, gangs per state, the reservation."""

    nodes: tuple[NodeStatus, ...]
    tenants: dict[str, tuple[int, int | None]]
    counts: dict[str, int]
    reservation: str | None
    policy: str
    journal_seq: int
    problems: tuple[str, ...] = ()
    """Journal damage skipped at the last start, verbs that failed on replay, the background loop's last error."""


def check_state(state: Any) -> None:
    """``TypeError`` unless ``state`` has the shape of ``SchedulerService._state()`` (a snapshot whose checksum
    passed may still hold the wrong data: it is refused, not unpacked)."""
    kinds = (Scheduler, dict, dict, int, dict, str, dict)
    if not isinstance(state, tuple) or len(state) != len(kinds):
        raise TypeError(f"snapshot state is {short(type(state).__name__)} of length "
                        f"{len(state) if isinstance(state, tuple | list) else '-'}, expected a {len(kinds)}-tuple")
    for i, (value, kind) in enumerate(zip(state, kinds, strict=True)):
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"snapshot state item {i} is {type(value).__name__}, expected {kind.__name__}")
    terminal, tenants = state[1], state[6]
    if not all(isinstance(v, tuple) and len(v) == 3 and isinstance(v[0], HandleState) for v in terminal.values()):
        raise TypeError("snapshot state: a terminal gang is not (state, reason, tenant)")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in tenants.items()):
        raise TypeError("snapshot state: a token digest or tenant is not a string")


def make_store(spec: str) -> FileStore | KVStore:
    """``session`` (``infra-scheduler/`` in Ray's session directory on this node), ``kv`` (Ray's GCS) or a directory."""
    if spec == "kv":
        return KVStore()
    if spec == "session":
        import ray

        # the session directory of the node this process runs on; no public API names it
        spec = str(Path(ray._private.worker.global_worker.node.get_session_dir_path()) / SERVICE_NAME)
    return FileStore(spec)


TOKEN_FILE_ENV = "INFRA_SCHEDULER_TOKEN_FILE"
"""Environment variable naming the token file a client presents (default: ``admin_token_path()``)."""


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/infra-scheduler`` (``~/.config/infra-scheduler`` by default)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "infra-scheduler"


def admin_token_path() -> Path:
    """The admin token file of this user: made by the first ``connect`` or ``service start`` here."""
    return config_dir() / "admin.token"


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """sha256 hex of ``token``: the service keeps digests, never a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def write_token(path: Path, token: str) -> None:
    """Write ``token`` to ``path``, readable by its owner only (0600; a directory made here is 0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, token.encode() + b"\n")  # mkstemp makes the file 0600; the rename keeps the mode


def read_token(path: Path) -> str:
    """The token in ``path``; a file that others may read is refused (as ssh refuses such keys)."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(f"token file {path} is open to others ({stat.filemode(mode)}): run `chmod 600 {path}`")
    token = path.read_text().strip()
    if not token:
        raise PermissionError(f"token file {path} is empty: ask the admin for one (`python -m infra.service.cli token issue TENANT`)")
    return token


def ensure_admin_token() -> str:
    """The admin token of this user (``admin_token_path()``), made (0600) when there is none yet."""
    path = admin_token_path()
    if not path.exists():
        write_token(path, new_token())
    return read_token(path)


class Credentials:
    """Who presents a token: the admin (whose digest the service was first started with) or a tenant.

    Only digests are kept, in the service's own journal and snapshot (the ``admin``, ``issue`` and
    ``revoke`` records), never in Ray's KV store, which any job on the cluster may rewrite.

    Args:
        admin_sha256: ``token_digest`` of the admin token ("" : no admin, tenant tokens only).
        tenants: digest -> tenant of the tokens issued.
    """

    def __init__(self, admin_sha256: str = "", tenants: dict[str, str] | None = None) -> None:
        self.admin_sha256 = admin_sha256
        self.tenants = dict(tenants or {})

    def who(self, cred: str) -> str | None:
        """None for the admin, the tenant of a tenant token; ``PermissionError`` for anything else."""
        digest = token_digest(cred) if cred else ""
        if digest and self.admin_sha256 and secrets.compare_digest(digest, self.admin_sha256):
            return None
        tenant = self.tenants.get(digest) if digest else None
        if tenant is None:
            raise PermissionError(f"no valid scheduler credential presented: set {TOKEN_FILE_ENV} to your token file "
                                  "(`python -m infra.service.cli token issue TENANT` makes one; the admin's is "
                                  f"{admin_token_path()} on the machine that started the service)")
        return tenant


class SchedulerService:
    """The service's state and verbs (run as the async Ray actor ``SERVICE_NAME``; see the module docstring).

    Args:
        store: ``session`` (under Ray's session directory), ``kv`` or a directory for the journal and snapshots.
        policy: placement policy of a new plan.
        quotas: GPU quota per tenant of a new plan (None: no quotas).
        poll_s: period of the node, deadline and owner checks.
        owner_lease_s: gangs of an owner silent this long are released.
        realize_timeout_s: longest wait for one placement group.
        admin_sha256: ``token_digest`` of the admin token (see ``Credentials``); fixed by the journal's first
            start: a start under another admin is refused (``PermissionError``) until ``reset``.
        fresh: refuse (``ServiceRefused``) to start over a journal that holds records, unless Ray is
            restarting this actor after a crash (``connect`` starts services so: it never adopts a plan).
    """

    def __init__(
        self, store: str = "session", policy: str = "fgd-strand", quotas: dict[str, Quota] | None = None,
        poll_s: float = 0.5, owner_lease_s: float = 60.0, realize_timeout_s: float = 60.0, admin_sha256: str = "",
        fresh: bool = False,
    ) -> None:
        self.credentials = Credentials(admin_sha256)
        self.journal = Journal(make_store(store), JOURNAL_CODEC)
        self.realizer = Realizer(realize_timeout_s)
        self.poll_s, self.owner_lease_s = poll_s, owner_lease_s
        state, ops = self.journal.recover(check_state)
        if fresh and (state is not None or ops) and not _restarted_by_ray():
            raise ServiceRefused(f"the scheduler's journal ({store}) holds a plan up to record {self.journal.seq}: "
                                 "recover it with `python -m infra.service start` (as its admin) or forget it with "
                                 "`python -m infra.service reset`")
        if state is None:
            sched = Scheduler(Cluster(()), policy=policy, quotas=quotas, clock=time.time, max_events=MAX_EVENTS)
            state = (sched, {}, {}, -1, {}, None, {})
        self.sched, self.terminal, self.owner_of, self._seen_event, self.tenant_of, admin, tenants = state
        self.credentials.tenants = dict(tenants)
        self.problems: list[tuple[float, str]] = [(time.time(), d) for d in self.journal.damage]
        self._errors: dict[str, str] = {}
        self._replay(ops, admin)
        self.unplanned: list[Any] = []
        """Placement groups of ours found alive that the plan does not hold, kept after a damaged journal."""
        self._versions: dict[str, int] = {}
        self._last: dict[str, GangStatus] = {}
        self._owners_seen: dict[str, float] = {}
        self._lock: asyncio.Lock | None = None
        self._changed: asyncio.Condition | None = None
        self._task: asyncio.Task | None = None

    def _replay(self, ops: list[tuple[int, str, tuple]], admin: str | None) -> None:
        """Apply the journal's records; a verb that fails where it did not fail live is a problem, not a secret.
        The admin digest of the journal (``admin`` records included) must be this start's."""
        failed_live = {args[0] for _, op, args in ops if op == "failed"}
        for seq, op, args in ops:
            if op == "admin":
                admin = args[0] if args and isinstance(args[0], str) else admin
                continue
            if op == "failed":
                continue
            try:
                self._apply(op, *args)
            except Exception as exc:
                if seq not in failed_live:
                    self.problems.append((time.time(), f"journal record {seq} ({op}) failed on replay: {exc!r}"))
        mine = self.credentials.admin_sha256
        if admin is None:
            self._do("admin", mine)  # the first start of this journal fixes its admin
        elif not secrets.compare_digest(admin, mine):
            raise PermissionError(f"the scheduler's journal belongs to another admin (token digest {admin[:12]}...): "
                                  "start it with that admin's token file, or forget its plan and tokens with "
                                  "`python -m infra.service reset`")

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> bool:
        """Start the background loop (idempotent; every verb calls it); after a restart, adopt the
        groups found alive. Returns whether it started now."""
        if self._lock is not None:
            return False
        self._lock, self._changed = asyncio.Lock(), asyncio.Condition()
        async with self._lock:
            self._follow_nodes()
            self._adopt_groups()
            self._owners_seen = dict.fromkeys(self.owner_of.values(), time.time())
            await self._settle()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return True

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                async with self._lock:
                    self._follow_nodes()
                    now = time.time()
                    due = self.sched.next_deadline()
                    if due is not None and due <= now:
                        self._do("tick", now)
                    self._expire_owners(now)
                    await self._settle()
            except Exception as exc:  # keep serving; the error shows in status problems and events
                self._errors["service"] = f"background loop at {time.strftime('%H:%M:%S')}: {exc!r}"

    # ---------------------------------------------------------------- verbs
    async def submit(self, req: GangRequest, owner: str = "", cred: str = "") -> GangStatus:
        """Validate and submit ``req`` (``RequestError`` says why it can never run; nothing is placed).

        ``cred`` must be the admin's token or a token of ``req.tenant`` (``PermissionError``)."""
        if not isinstance(req, GangRequest):
            raise RequestError(f"submit takes a GangRequest, not {type(req).__name__}")
        check_bounds(req)  # before the journal stores it: a huge gang is refused, not written
        self._allow(cred, "submit as", req.tenant)
        await self.start()
        async with self._lock:
            self._seen(owner)
            if req.name in self.sched.gangs() and self.sched.request(req.name) == req:
                # The same submission again: a call Ray retried after a restart of this service that
                # had already journaled it. Submitting is idempotent, so the retry is answered, not refused.
                return self._status(req.name)
            if req.name in self.terminal:
                del self.terminal[req.name]
            self._do("submit", req, owner, time.time())
            await self._settle()
            return self._status(req.name)

    async def release(self, name: str, reason: str = "released", owner: str = "", cred: str = "") -> GangStatus:
        """The gang is done (or cancelled): its groups go, the queue is served (its tenant's or the admin's ``cred``)."""
        await self.start()
        async with self._lock:
            self._allow_gang(cred, "release", name)
            self._seen(owner)
            if name in self.sched.gangs():
                self._do("release", name, time.time(), reason)
                await self._settle()
            return self._status(name)

    async def cancel(self, name: str, cred: str = "") -> GangStatus:
        """``release`` with reason ``cancelled`` (``python -m infra.service.cli cancel``)."""
        return await self.release(name, "cancelled", cred=cred)

    async def stopped(self, name: str, owner: str = "", cred: str = "") -> GangStatus:
        """A draining gang has checkpointed and stopped: its groups go and it waits to run again."""
        await self.start()
        async with self._lock:
            self._allow_gang(cred, "report stopped for", name)
            self._seen(owner)
            if name in self.sched.gangs() and self.sched.gang_state(name) is GangState.DRAINING:
                self._do("stopped", name, time.time())
                await self._settle()
            return self._status(name)

    async def resize(self, name: str, num_bundles: int, owner: str = "", cred: str = "") -> GangStatus:
        """Grow or shrink an elastic gang; the added bundles' groups exist when this returns."""
        await self.start()
        async with self._lock:
            self._allow_gang(cred, "resize", name)
            self._seen(owner)
            self._do("resize", name, num_bundles, time.time())
            await self._settle()
            return self._status(name)

    async def issue_token(self, tenant: str, cred: str = "") -> str:
        """A new token for ``tenant`` (admin ``cred`` only); the service keeps only its digest."""
        self._allow(cred, "issue tokens for", None)
        if not isinstance(tenant, str) or not tenant or not tenant.isprintable() or len(tenant) > MAX_NAME:
            raise ValueError(f"tenant name {short(tenant)} is empty, unprintable or over {MAX_NAME} characters: "
                             "name a tenant, e.g. `token issue alice`")
        await self.start()
        async with self._lock:
            token = new_token()
            self._do("issue", token_digest(token), tenant)  # journaled: only this service writes identities
            return token

    async def revoke_tokens(self, tenant: str, cred: str = "") -> int:
        """Void every token of ``tenant`` (admin ``cred`` only); how many there were."""
        self._allow(cred, "revoke tokens of", None)
        await self.start()
        async with self._lock:
            count = sum(t == tenant for t in self.credentials.tenants.values())
            if count:
                self._do("revoke", tenant)
            return count

    async def prune_groups(self, cred: str = "") -> int:
        """Remove the placement groups kept after a damaged journal (admin only): the operator's decision
        that the plan as recovered is the one to follow. How many went."""
        from ray.util.placement_group import remove_placement_group

        self._allow(cred, "prune placement groups of", None)
        await self.start()
        async with self._lock:
            count = len(self.unplanned)
            for pg in self.unplanned:
                remove_placement_group(pg)
            self.unplanned.clear()
            self._errors.pop("unplanned", None)
            return count

    # ---------------------------------------------------------------- queries
    async def gang(self, name: str, owner: str = "", cred: str = "") -> GangStatus:
        """The status of one gang (KeyError if never seen); a tenant reads only its own gangs."""
        self._allow_read(cred, name)
        await self.start()
        self._seen(owner)
        return self._status(name)

    async def watch(
        self, name: str, version: int = -1, timeout_s: float = 5.0, owner: str = "", cred: str = ""
    ) -> GangStatus:
        """Wait up to ``timeout_s`` for the gang's status to move past ``version``; the status (own gangs only)."""
        self._allow_read(cred, name)
        await self.start()
        self._seen(owner)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        async with self._changed:
            while self._versions.get(name, 0) == version and loop.time() < end:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), end - loop.time())
        return self._status(name)

    async def queue(self, cred: str = "") -> list[GangStatus]:
        """Waiting gangs in service order (a tenant sees its own only)."""
        caller = self.credentials.who(cred)
        await self.start()
        return [self._status(n) for n in self.sched.queue if self._visible(caller, n)]

    async def gangs(self, cred: str = "") -> list[GangStatus]:
        """Every gang the plan holds (waiting, placed, draining); a tenant sees its own only."""
        caller = self.credentials.who(cred)
        await self.start()
        return [self._status(n) for n in self.sched.gangs() if self._visible(caller, n)]

    async def events(self, since: int = -1, limit: int = 100, cred: str = "") -> list:
        """Events with a sequence number above ``since`` (at most ``limit``, the latest); with ``since`` < 0 the
        service's problems come first (besides the limit), as ``service_problem`` events of sequence number -1.
        A tenant sees the events of its own gangs and of nodes, and no problems."""
        caller = self.credentials.who(cred)
        await self.start()
        events = self.sched.events_since(since)
        if caller is not None:
            events = [e for e in events if not e.gang or self._visible(caller, e.gang)]
        events = events[-limit:]
        if since >= 0 or caller is not None:
            return events
        return [*(Event(-1, EventKind.SERVICE_PROBLEM, "", t, {"problem": p}) for t, p in self._problem_list()), *events]

    async def status(self, cred: str = "") -> ClusterStatus:
        """Nodes (capacity and what is free, for everyone), and the tenants, gangs per state, reservation and
        problems the caller may see (a tenant: its own)."""
        caller = self.credentials.who(cred)
        await self.start()
        st, s = self.sched.state, self.sched
        nodes = tuple(
            NodeStatus(n.name, bool(st.alive[i]), n.cpu_milli, int(st.cpu_free[i]), n.memory_mib, int(st.mem_free[i]),
                       n.gpus[0].model if n.gpus else "", n.gpus[0].memory_mib if n.gpus else 0,
                       tuple(int(x) for x in st.gpu_free[i, : len(n.gpus)]),
                       tuple(g for g in s.gangs_on(n.name) if self._visible(caller, g)))
            for i, n in enumerate(s.cluster.nodes)
        )
        tenants = {t: (u, s.ledger.quotas[t].gpu_milli) for t, u in s.ledger.usage.items() if caller in (None, t)}
        counts: dict[str, int] = {}
        for name in s.gangs():
            if self._visible(caller, name):
                state = self._status(name).state.value
                counts[state] = counts.get(state, 0) + 1
        res = s.reservation.gang if s.reservation and self._visible(caller, s.reservation.gang) else None
        problems = tuple(p for _, p in self._problem_list()) if caller is None else ()
        return ClusterStatus(nodes, tenants, counts, res, s.policy.name, self.journal.seq, problems)

    # ---------------------------------------------------------------- internals
    def _allow(self, cred: str, verb: str, tenant: str | None) -> None:
        """Pass the admin, and a tenant acting as itself; ``PermissionError`` naming who and what otherwise.
        ``tenant`` None: an admin-only verb."""
        caller = self.credentials.who(cred)
        if caller is not None and caller != tenant:
            what = f"tenant {tenant!r}" if tenant is not None else "any tenant (admin only)"
            raise PermissionError(f"tenant {caller!r} may not {verb} {what}: present that tenant's token or the admin's")

    def _visible(self, caller: str | None, name: str) -> bool:
        """Whether ``caller`` (None: the admin) may read gang ``name``: the admin all, a tenant its own."""
        if caller is None:
            return True
        tenant = self.tenant_of.get(name)
        if tenant is None and name in self.terminal:
            tenant = self.terminal[name][2]
        return tenant == caller

    def _allow_read(self, cred: str, name: str) -> None:
        """``PermissionError`` unless ``cred`` may read gang ``name`` (a gang never seen: any valid credential,
        which then learns only that it is unknown)."""
        caller = self.credentials.who(cred)
        known = name in self.tenant_of or name in self.terminal
        if known and not self._visible(caller, name):
            raise PermissionError(f"tenant {caller!r} may not read gang {short(name)} of another tenant: "
                                  "present that tenant's token or the admin's")

    def _allow_gang(self, cred: str, verb: str, name: str) -> None:
        """``_allow`` for the tenant of gang ``name``; a gang the plan no longer holds needs a valid credential only."""
        if name in self.sched.gangs():
            self._allow(cred, f"{verb} gang {name!r} of", self.sched.request(name).tenant)
        else:
            self.credentials.who(cred)

    def _problem_list(self) -> list[tuple[float, str]]:
        """(time, text) of the problems at start, the background loop's last error, a snapshot not written and
        placement groups kept unplanned."""
        now = [(time.time(), self._errors[k]) for k in ("service", "snapshot", "unplanned") if self._errors.get(k)]
        return [*self.problems, *now]

    def _do(self, op: str, *args: Any) -> None:
        """Journal, then apply (write-ahead); a verb that fails is journaled as failed, so replay expects it."""
        seq = self.journal.log(op, *args)
        try:
            self._apply(op, *args)
        except Exception:
            self.journal.log("failed", seq)
            raise
        if self.journal.due():
            try:
                self.journal.snapshot(self._state())
                self._errors.pop("snapshot", None)
            except OSError as exc:  # the previous snapshot and every record since stay; tried again next verb
                self._errors["snapshot"] = f"snapshot not written, retried at the next verb: {exc}"

    def _state(self) -> tuple:
        """What a snapshot holds (``check_state`` reads it back)."""
        return (self.sched, self.terminal, self.owner_of, self._seen_event, self.tenant_of,
                self.credentials.admin_sha256, self.credentials.tenants)

    def _apply(self, op: str, *args: Any) -> None:
        s = self.sched
        if op == "submit":
            req, owner, now = args
            s.submit(req, now=now)  # a refused submit (a live gang's name, say) changes no one's gang
            self.owner_of[req.name] = owner
            self.tenant_of[req.name] = req.tenant
        elif op == "issue":
            self.credentials.tenants[args[0]] = args[1]
        elif op == "revoke":
            for digest in [d for d, t in self.credentials.tenants.items() if t == args[0]]:
                del self.credentials.tenants[digest]
        elif op == "admin":
            self.credentials.admin_sha256 = args[0]
        elif op == "release":
            name, now, reason = args
            s.release(name, now=now, reason=reason)
        elif op in ("stopped", "tick"):
            getattr(s, op)(*args)
        elif op == "resize":
            s.resize(args[0], args[1], now=args[2])
        elif op in ("add_node", "remove_node", "restore_node"):
            getattr(s, op)(*args)
        self._record_terminal()

    def _record_terminal(self) -> None:
        """Turn RELEASED events into the terminal states jobs see."""
        for e in self.sched.events_since(self._seen_event):
            self._seen_event = e.seq
            if e.kind is not EventKind.RELEASED:
                continue
            why = e.detail.get("reason", "")
            state = (HandleState.TIMED_OUT if why.startswith("timed out") else HandleState.CANCELLED
                     if why == "cancelled" else HandleState.FAILED if why.startswith("owner") else HandleState.FINISHED)
            self.terminal[e.gang] = (state, why, self.tenant_of.pop(e.gang, ""))
            self.owner_of.pop(e.gang, None)
            while len(self.terminal) > 10_000:
                self.terminal.pop(next(iter(self.terminal)))

    def _follow_nodes(self) -> None:
        """Journal node joins, returns, restarts and losses seen in ``ray.nodes()``."""
        import ray

        now = time.time()
        seen = discover_nodes(ray.nodes())
        for name, (node_id, node) in seen.items():
            st = self.sched.state
            idx = st.node_index.get(name)
            old = self.realizer.node_ids.get(name)
            if idx is None:
                self._do("add_node", node, now)
            else:
                if st.alive[idx] and old is not None and old != node_id:
                    self._do("remove_node", name, now)  # a restarted raylet: everything on it is gone
                if not self.sched.state.alive[idx]:
                    self._do("restore_node", name, now)
            if old != node_id:
                self.realizer.forget_node(name)
                self.realizer.set_node(name, node_id, len(node.gpus))
        st = self.sched.state
        for name, i in list(st.node_index.items()):
            if st.alive[i] and name not in seen:
                self._do("remove_node", name, now)
                self.realizer.forget_node(name)

    def _adopt_groups(self) -> None:
        """After a restart: keep the groups the plan holds, remove every other one of ours, unless the journal
        was damaged: then the plan may have lost gangs that still run, so the others are kept too
        (``unplanned``, reported) until the admin prunes them (``prune_groups``)."""
        from ray.util import placement_group_table
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        for pg_id, info in placement_group_table().items():
            name = info.get("name", "")
            if info.get("state") == "REMOVED" or not name.startswith((GROUP_PREFIX, BLOCKER_PREFIX)):
                continue
            pg = PlacementGroup(_pg_id(pg_id))
            spec = parse_group_name(name)
            if spec is not None and self._planned(spec):
                self.realizer.adopt(spec, pg)
            elif self.journal.damage:
                self.unplanned.append(pg)
            else:
                remove_placement_group(pg)
        if self.unplanned:
            self._errors["unplanned"] = (f"{len(self.unplanned)} placement groups not in the recovered plan are kept "
                                         "(the journal was damaged): `python -m infra.service.cli prune` removes them")

    def _planned(self, spec: BundleSpec) -> bool:
        """Whether the plan holds the bundle ``spec`` (placed there, or draining since it was)."""
        s = self.sched
        if spec.gang not in s.gangs():
            return False
        state = s.gang_state(spec.gang)
        if state is GangState.DRAINING:
            return True
        p = s.placement(spec.gang)
        if p is None or p.epoch != spec.epoch:
            return False
        return any(a.bundle == spec.bundle and a.node == spec.node and a.gpus == spec.gpus for a in p.assignments)

    async def _settle(self) -> None:
        """Make Ray's groups follow the plan, then publish the statuses that changed."""
        s = self.sched
        for gang in {g for g, _ in self.realizer.groups}:
            state = s.gang_state(gang) if gang in s.gangs() else None
            if state is GangState.DRAINING:
                continue
            p = s.placement(gang) if state is GangState.PLACED else None
            have = self.realizer.realized(gang)
            planned = {a.bundle for a in p.assignments} if p else set()
            stale = {b for b, (spec, _) in have.items() if p is None or spec.epoch != p.epoch or b not in planned}
            if stale:
                self.realizer.remove(gang, stale)
        for gang, p in s.placements.items():
            if not s.ready(gang):
                continue
            have = self.realizer.realized(gang)
            for a in p.assignments:
                if a.bundle in have:
                    continue
                spec = BundleSpec(gang, p.epoch, a.bundle, a.node, a.gpus, a.gpu_milli,
                                  s.request(gang).bundles[a.bundle].cpu_milli)
                try:
                    await self.realizer.create(spec)
                    self._errors.pop(gang, None)
                except Exception as exc:  # retried on the next pass
                    self._errors[gang] = f"placement group not created: {exc}"
                    break
        await self._publish()

    async def _publish(self) -> None:
        names = set(s for s in self.sched.gangs()) | set(self._last)
        changed = False
        for name in names:
            status = self._status(name, bump=False)
            if self._last.get(name) != status:
                self._versions[name] = self._versions.get(name, 0) + 1
                self._last[name] = status
                changed = True
        for name in [n for n, st in self._last.items() if st.state.terminal and n not in self.terminal]:
            del self._last[name]
        if changed:
            async with self._changed:
                self._changed.notify_all()

    def _status(self, name: str, bump: bool = True) -> GangStatus:
        version = self._versions.get(name, 0)
        s = self.sched
        if name not in s.gangs():
            if name not in self.terminal:
                raise KeyError(f"unknown gang {name!r}; it was never submitted (or long forgotten)")
            state, why, tenant = self.terminal[name]
            return GangStatus(name, state, tenant=tenant, version=version, reason=why)
        req = s.request(name)
        common = {"tenant": req.tenant, "priority": req.priority, "version": version,
                  "preemptions": s.preemptions(name), "owner": self.owner_of.get(name, "")}
        state = s.gang_state(name)
        if state is GangState.DRAINING:
            return GangStatus(name, HandleState.DRAINING, deadline=s.deadline(name), reason=f"{s.notice(name)}: "
                              f"checkpoint and report stopped within {s.request(name).grace_s:g} s", **common)
        if state is GangState.WAITING:
            waiting = HandleState.PREEMPTED if s.preemptions(name) else HandleState.WAITING
            return GangStatus(name, waiting, deadline=s.deadline(name), reason=s.why_waiting(name), **common)
        p = s.placement(name)
        groups = {b: pg for b, (_, pg) in self.realizer.realized(name).items()}
        if not s.ready(name) or len(groups) < len(p.assignments):
            why = (f"waiting for preempted gangs {sorted(s.blocked_by(name))} to stop" if not s.ready(name)
                   else self._errors.get(name, "creating placement groups"))
            return GangStatus(name, HandleState.WAITING, placement=p, reason=why, **common)
        return GangStatus(name, HandleState.PLACED, placement=p, groups=groups, **common)

    def _seen(self, owner: str) -> None:
        if owner:
            self._owners_seen[owner] = time.time()

    def _expire_owners(self, now: float) -> None:
        for name, owner in list(self.owner_of.items()):
            if owner and now - self._owners_seen.setdefault(owner, now) > self.owner_lease_s and name in self.sched.gangs():
                self._do("release", name, now, f"owner {owner} silent for {self.owner_lease_s:.0f} s")


def _pg_id(hex_id: str):
    from ray._raylet import PlacementGroupID

    return PlacementGroupID(bytes.fromhex(hex_id))


def actor_class():
    """The service as a Ray actor class (detached, named, restartable, using no CPU of the plan)."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000)(SchedulerService)


def start(address: str | None = None, **options: Any):
    """Start the service on the connected (or ``address``) Ray cluster, or return the running one."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    head = next((n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]), None)
    strategy = {}
    if head is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy["scheduling_strategy"] = NodeAffinitySchedulingStrategy(head, soft=True)
    actor = actor_class().options(
        name=SERVICE_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, **strategy
    ).remote(**options)
    try:
        ray.get(actor.start.remote())
    except ray.exceptions.RayActorError as exc:  # refused in __init__: say why in one line, not a traceback
        refusal = next((line for line in reversed(str(exc).splitlines())
                        if line.startswith(("infra.service.actor.ServiceRefused:", "PermissionError:",
                                            "infra.service.journal.JournalRefused:"))), None)
        if refusal is None:
            raise
        kind, _, text = refusal.partition(": ")
        raise (PermissionError if kind == "PermissionError" else ServiceRefused)(text) from None
    return actor

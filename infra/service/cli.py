"""The scheduler service's one command line (also ``python -m infra.service``)::

    python -m infra.service start [--address ADDR] [--policy fgd-strand] [--quota llm=4] [--store DIR]
    python -m infra.service stop | reset [--store DIR]
    python -m infra.service status|queue|events|gangs|cancel NAME|prune|token issue TENANT|token revoke TENANT

Connects to the Ray cluster (``--address``, default ``auto``). ``start`` starts the service (or finds
the running one) with this user's admin token (made 0600 if absent), recovering the journal of
``--store`` when that journal's admin is this user; ``stop`` kills the service and keeps its journal;
``reset`` kills it and forgets its journal, plan and tenant tokens. The other commands read the service
in tables and never start one. Memory in GiB, CPU in cores, GPU as free/total per node. Every call presents the token of
``--token-file`` (default: ``$INFRA_SCHEDULER_TOKEN_FILE``, else this user's admin token); ``token
issue`` (admin only) writes a new tenant token to a 0600 file for that tenant; ``prune`` (admin only)
removes the placement groups a service kept after recovering a damaged journal. The whole command is
bounded by ``--timeout``: past it, one line says what did not answer.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infra.scheduler.quota import Quota
from infra.scheduler.resources import MILLI
from infra.service.actor import (
    NAMESPACE,
    SERVICE_NAME,
    TOKEN_FILE_ENV,
    ClusterStatus,
    GangStatus,
    ServiceRefused,
    admin_token_path,
    config_dir,
    ensure_admin_token,
    make_store,
    start,
    token_digest,
    write_token,
)
from infra.service.client import check_reachable, connect
from infra.service.journal import JournalRefused

SERVICE_COMMANDS = ("start", "stop", "reset")
"""Commands that manage the service actor itself (the others talk to a running one)."""

TIMEOUT_S = 30.0
"""Default bound of a whole command (connecting included)."""


def status_table(st: ClusterStatus) -> Table:
    """Nodes: CPU and memory free of total, GPUs free, gangs on them."""
    t = Table(title=f"scheduler: policy {st.policy}, journal #{st.journal_seq}, "
                    f"gangs {dict(sorted(st.counts.items())) or 'none'}, reservation {st.reservation or '-'}")
    for col in ("node", "alive", "CPU free/total", "mem GiB free/total", "GPUs", "GPU free (milli)", "gangs"):
        t.add_column(col)
    for n in st.nodes:
        gpus = f"{len(n.gpu_free)} x {n.gpu_model}" if n.gpu_free else "-"
        free = " ".join(str(x) for x in n.gpu_free) or "-"
        t.add_row(n.name, "yes" if n.alive else "LOST", f"{n.cpu_free / MILLI:g}/{n.cpu_milli / MILLI:g}",
                  f"{n.memory_free / 1024:.1f}/{n.memory_mib / 1024:.1f}", gpus, free, ", ".join(n.gangs) or "-")
    return t


def tenants_table(st: ClusterStatus) -> Table | None:
    """GPU quota usage per tenant (None without quotas)."""
    if not st.tenants:
        return None
    t = Table(title="tenants (GPU)")
    for col in ("tenant", "used", "nominal", "borrowing"):
        t.add_column(col)
    for name, (used, nominal) in sorted(st.tenants.items()):
        t.add_row(name, f"{used / MILLI:g}", f"{nominal / MILLI:g}", "yes" if used > nominal else "")
    return t


def gangs_table(gangs: list[GangStatus], title: str) -> Table:
    """Gangs: state, tenant, priority, where or why not."""
    t = Table(title=title)
    for col in ("gang", "state", "tenant", "prio", "placement / reason"):
        t.add_column(col)
    for g in gangs:
        where = (", ".join(f"{a.bundle}:{a.node}{list(a.gpus) if a.gpus else ''}" for a in g.placement.assignments)
                 if g.placement and g.state.value == "placed" else g.reason)
        t.add_row(g.name, g.state.value, g.tenant, str(g.priority), where)
    return t


def events_table(events: list) -> Table:
    """The latest events."""
    t = Table(title="events")
    for col in ("seq", "time", "kind", "gang", "detail"):
        t.add_column(col)
    for e in events:
        detail = ", ".join(f"{k}={v}" for k, v in e.detail.items())
        t.add_row(str(e.seq), time.strftime("%H:%M:%S", time.localtime(e.time)), e.kind.value, e.gang, detail)
    return t


def _watchdog(timeout_s: float, address: str) -> threading.Timer:
    """End the process with one line after ``timeout_s``: ``ray.init`` to a port that accepts but
    never answers as Ray, or a hung service, blocks in native code where no Python timeout reaches."""

    def expire() -> None:
        print(f"error: no answer from the Ray cluster at {address} within {timeout_s:g} s: check --address "
              "(`ray status` on the head prints it) and that the scheduler service runs, or raise --timeout",
              file=sys.stderr, flush=True)
        os._exit(2)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def _token(client, verb: str | None, tenant: str | None, out: str | None, console: Console) -> int:
    """``token issue TENANT [--out FILE]`` / ``token revoke TENANT`` (admin only)."""
    if verb not in ("issue", "revoke") or not tenant:
        print("error: write `token issue TENANT [--out FILE]` or `token revoke TENANT`", file=sys.stderr)
        return 2
    if verb == "revoke":
        console.print(f"revoked {client.revoke_tokens(tenant)} token(s) of tenant {tenant!r}")
        return 0
    if out is None and not re.fullmatch(r"[A-Za-z0-9_.-]+", tenant):
        print(f"error: tenant {tenant!r} is no file name: pass --out FILE for its token", file=sys.stderr)
        return 2
    path = Path(out) if out else config_dir() / f"{tenant}.token"
    write_token(path, client.issue_token(tenant))
    console.print(f"token of tenant {tenant!r} written to {path} (0600): hand it to the tenant, "
                  f"who sets {TOKEN_FILE_ENV}={path}")
    return 0


def _parse_quota(text: str) -> tuple[str, Quota]:
    """``tenant=GPUS[:BORROW_GPUS]`` -> quota in milli-GPU."""
    try:
        tenant, amounts = text.split("=", 1)
        nominal, _, borrow = amounts.partition(":")
        return tenant, Quota(round(float(nominal) * 1000), round(float(borrow) * 1000) if borrow else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--quota {text!r}: write TENANT=GPUS or TENANT=GPUS:BORROW_GPUS") from None


def _manage(args: argparse.Namespace, console: Console) -> int:
    """``start``, ``stop`` or ``reset`` the service actor of the cluster at ``args.address``."""
    import ray

    check_reachable(args.address, args.timeout)
    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False)
    if args.command == "start":
        start(policy=args.policy, quotas=dict(args.quota) or None, store=args.store,
              admin_sha256=token_digest(ensure_admin_token()))
        console.print(f"scheduler service {SERVICE_NAME!r} running in namespace {NAMESPACE!r}; if this call started "
                      f"it, its admin token is {admin_token_path()}", highlight=False)
        return 0
    with contextlib.suppress(ValueError):  # none runs: stop has nothing to do, reset still clears the store
        ray.kill(ray.get_actor(SERVICE_NAME, namespace=NAMESPACE), no_restart=True)
    if args.command == "stop":
        console.print("stopped (its journal is kept: start recovers it; reset forgets it)")
    else:
        make_store(args.store).clear()
        console.print(f"journal, snapshot and tenant tokens cleared ({args.store})", highlight=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=[*SERVICE_COMMANDS, "status", "queue", "gangs", "events", "cancel", "prune",
                                            "token"])
    parser.add_argument("name", nargs="?", help="gang to cancel; issue or revoke after token")
    parser.add_argument("tenant", nargs="?", help="tenant of token issue / revoke")
    parser.add_argument("--address", default="auto")
    parser.add_argument("--limit", type=int, default=30, help="events shown")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help=f"seconds the whole command may take (default {TIMEOUT_S:g})")
    parser.add_argument("--token-file", default=None, help=f"credential to present (default ${TOKEN_FILE_ENV}, else the admin's)")
    parser.add_argument("--out", default=None, help="file for the token of token issue (default: config dir/TENANT.token)")
    parser.add_argument("--policy", default="fgd-strand", help="placement policy of a new plan (start)")
    parser.add_argument("--quota", action="append", type=_parse_quota, default=[],
                        help="TENANT=GPUS[:BORROW_GPUS], GPU quota of a new plan (start; repeat per tenant)")
    parser.add_argument("--store", default="session",
                        help="journal store (start, reset): session (Ray's session directory on the head node, "
                             "default), kv (Ray's GCS) or a directory")
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout {args.timeout} must be a positive number of seconds")
    if args.command == "cancel" and not args.name:
        parser.error("cancel needs the gang's name")
    timer = _watchdog(args.timeout, args.address)
    console = Console(width=160)
    try:
        if args.command in SERVICE_COMMANDS:
            return _manage(args, console)
        client = connect(args.address, start_service=False, token_file=args.token_file, timeout_s=args.timeout)
        return _run(client, args, console)
    except (ValueError, ConnectionError, TimeoutError, PermissionError, FileNotFoundError, ServiceRefused,
            JournalRefused) as exc:
        cause = getattr(exc, "cause", None) or exc  # a refusal by the service arrives wrapped by Ray
        print(f"error: {str(cause) or type(cause).__name__}", file=sys.stderr)
        return 2
    finally:
        timer.cancel()


def _run(client, args: argparse.Namespace, console: Console) -> int:
    """The command ``args.command`` on a connected client."""
    if args.command == "token":
        return _token(client, args.name, args.tenant, args.out, console)
    if args.command == "status":
        st = client.status()
        console.print(status_table(st))
        tenants = tenants_table(st)
        if tenants is not None:
            console.print(tenants)
        for problem in st.problems:  # journal damage skipped at start, replay and background errors
            console.print(f"[bold red]problem:[/] {problem}", highlight=False)
    elif args.command == "queue":
        console.print(gangs_table(client.queue(), "queue (service order)"))
    elif args.command == "gangs":
        console.print(gangs_table(client.gangs(), "gangs"))
    elif args.command == "events":
        console.print(events_table(client.events(limit=args.limit)))
    elif args.command == "prune":
        console.print(f"removed {client.prune_groups()} placement group(s) the recovered plan does not hold")
    else:
        console.print(gangs_table([client.cancel(args.name)], "cancelled"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

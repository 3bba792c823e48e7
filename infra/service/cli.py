"""``python -m infra.service.cli status|queue|events|gangs|cancel NAME|prune|token issue TENANT|token revoke TENANT``.

Connects to the Ray cluster (``--address``, default ``auto``) and reads the service in tables; it never
starts one. Memory in GiB, CPU in cores, GPU as free/total per node. Every call presents the token of
``--token-file`` (default: ``$INFRA_SCHEDULER_TOKEN_FILE``, else this user's admin token); ``token
issue`` (admin only) writes a new tenant token to a 0600 file for that tenant; ``prune`` (admin only)
removes the placement groups a service kept after recovering a damaged journal. The whole command is
bounded by ``--timeout``: past it, one line says what did not answer.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infra.scheduler.resources import MILLI
from infra.service.actor import TOKEN_FILE_ENV, ClusterStatus, GangStatus, config_dir, write_token
from infra.service.client import connect

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.service.cli", description=__doc__)
    parser.add_argument("command", choices=["status", "queue", "gangs", "events", "cancel", "prune", "token"])
    parser.add_argument("name", nargs="?", help="gang to cancel; issue or revoke after token")
    parser.add_argument("tenant", nargs="?", help="tenant of token issue / revoke")
    parser.add_argument("--address", default="auto")
    parser.add_argument("--limit", type=int, default=30, help="events shown")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help=f"seconds the whole command may take (default {TIMEOUT_S:g})")
    parser.add_argument("--token-file", default=None, help=f"credential to present (default ${TOKEN_FILE_ENV}, else the admin's)")
    parser.add_argument("--out", default=None, help="file for the token of token issue (default: config dir/TENANT.token)")
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout {args.timeout} must be a positive number of seconds")
    if args.command == "cancel" and not args.name:
        parser.error("cancel needs the gang's name")
    timer = _watchdog(args.timeout, args.address)
    console = Console(width=160)
    try:
        client = connect(args.address, start_service=False, token_file=args.token_file, timeout_s=args.timeout)
        return _run(client, args, console)
    except (ValueError, ConnectionError, TimeoutError, PermissionError, FileNotFoundError) as exc:
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

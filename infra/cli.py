"""``python -m infra.cli status|queue|events|gangs|cancel NAME``: the scheduler service in tables.

Connects to the Ray cluster (``--address``, default ``auto``) and reads the service; it never starts
one. Memory in GiB, CPU in cores, GPU as free/total per node.
"""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.table import Table

from infra.client import connect
from infra.resources import MILLI
from infra.service import ClusterStatus, GangStatus


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.cli", description=__doc__)
    parser.add_argument("command", choices=["status", "queue", "gangs", "events", "cancel"])
    parser.add_argument("name", nargs="?", help="gang to cancel")
    parser.add_argument("--address", default="auto")
    parser.add_argument("--limit", type=int, default=30, help="events shown")
    args = parser.parse_args(argv)
    console = Console(width=160)
    try:
        client = connect(args.address, start_service=False)
    except (ValueError, ConnectionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
    else:
        if not args.name:
            parser.error("cancel needs the gang's name")
        console.print(gangs_table([client.cancel(args.name)], "cancelled"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

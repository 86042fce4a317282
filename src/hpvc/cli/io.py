"""``hpvc io status|set``: the storage bandwidth coordinator (docs/io.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from hpvc.cli.common import console, print_json
from hpvc.errors import InputError, require_root

IO_HELP = """Share storage bandwidth among clusters by priority and demand; show who gets \
and uses how much.

The site file (/etc/hpvc/io.toml, or $HPVC_IO_SITE, or --site) declares each
shared disk's read and write bandwidth and the priorities per user or cluster.
Every NFS cluster whose data is on a declared disk gets a weighted max-min
fair share of it (proportional to its priority, never above its demand, the
rest to the others), written as throttles into its NFS server's cgroup
whenever a cluster comes or goes or an operator changes a priority or a
demand.

Examples:

  hpvc io status

  hpvc io status --json --interval 2

  hpvc io set analytics --priority 4

  hpvc io set analytics --demand-write 50MB/s --demand-read 100MB/s

  hpvc io set analytics --reset
"""

STATUS_HELP = """Per disk and cluster: priority, demand, allocation, limit held, measured use.

The allocation is what the coordinator computes now from the site file and the
clusters; the limit is what the kernel holds in the cluster's NFS-server
cgroup (none while the cluster may take the whole disk); writes says how its
server writes: buffered, sync (its loop file system, while a write limit is in
force) or through (a plain folder on a managed disk, for the server's life).
The use is measured from that cgroup's own counters over --interval seconds.
Rates in MB/s (10^6 bytes).

Examples:

  hpvc io status

  hpvc io status --json

  HPVC_IO_SITE=/tmp/io.toml hpvc io status --interval 0
"""

SET_HELP = """Set a cluster's priority or demand as an operator (root), then rebalance.

Overrides the site file's priority and the spec's demand for CLUSTER (kept in
the state directory until --reset, also across a down and up of that name).
Rates take the size notation: 50MB/s, 64MiB. The new throttles are written at
once, without restarting anything. A bad site file is refused first and
changes nothing.

Examples:

  hpvc io set analytics --priority 4

  hpvc io set analytics --demand-write 50MB/s

  hpvc io set analytics --reset --priority 2
"""

SITE_HELP = "Site file (default: $HPVC_IO_SITE, else /etc/hpvc/io.toml)."

io_app = typer.Typer(help=IO_HELP, no_args_is_help=True)


def _store() -> Any:
    from hpvc.store import Store

    return Store()


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f}"


def _pair(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    return f"{_mb(d.get('write'))} / {_mb(d.get('read'))}"


def _rate(option: str, text: str | None) -> int | None:
    if text is None:
        return None
    from hpvc.units import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise InputError(f"{option} {text!r}", str(e), "e.g. 50MB/s") from None


@io_app.command("status", help=STATUS_HELP)
def status_cmd(
    site: Path | None = typer.Option(None, "--site", help=SITE_HELP),
    interval: float = typer.Option(1.0, min=0, help="Seconds to measure use over (0: none)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    from rich.table import Table

    from hpvc.coordinator.status import status

    doc = status(_store(), site, interval)
    if as_json:
        print_json(doc)
        return
    if doc["site"] is None:
        console.print("no site file: no disk is shared out (see docs/io.md)")
    for d in doc["devices"]:
        cap = d["capacity"]
        console.print(
            f"device {d['name']} ({d['device']}): write {_mb(cap['write'])} MB/s,"
            f" read {_mb(cap['read'])} MB/s, {len(d['clusters'])} cluster(s)"
        )
    t = Table(title="storage bandwidth, MB/s, write / read")
    cols = ("cluster", "device", "priority", "demand", "allocation", "limit", "writes", "use")
    for col in cols:
        t.add_column(col)
    for r in doc["clusters"]:
        t.add_row(
            r["cluster"],
            r["device"] or "-",
            f"{r['priority']} ({r['priority_from']})",
            _pair(r["demand"]),
            _pair(r["allocation"]),
            _pair(r["limit"]),
            r["writes"],
            _pair(r["use"]),
        )
    if doc["clusters"]:
        console.print(t)
    for r in doc["clusters"]:
        for note in r["notes"]:
            console.print(f"{r['cluster']}: {note}")


@io_app.command("set", help=SET_HELP)
def set_cmd(
    cluster: str = typer.Argument(..., help="The cluster's name."),
    priority: int | None = typer.Option(None, min=1, max=1000, help="Its priority (weight)."),
    demand_write: str | None = typer.Option(None, help="Its write demand, e.g. 50MB/s."),
    demand_read: str | None = typer.Option(None, help="Its read demand, e.g. 100MB/s."),
    reset: bool = typer.Option(False, "--reset", help="Drop earlier overrides first."),
    site: Path | None = typer.Option(None, "--site", help=SITE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the new allocation as JSON."),
) -> None:
    from hpvc.coordinator.coordinator import set_cluster

    require_root("hpvc io set")
    write, read = _rate("--demand-write", demand_write), _rate("--demand-read", demand_read)
    if not reset and priority is None and write is None and read is None:
        raise InputError("hpvc io set", "nothing to set", "give --priority, --demand-*, --reset")
    doc = set_cluster(
        _store(), cluster, priority=priority, read=read, write=write, reset=reset, site_file=site
    )
    if as_json:
        print_json(doc)
        return
    row = doc["clusters"].get(cluster)
    if row is None:
        console.print(f"{cluster}: set; it runs no NFS server here now (applies when it does)")
    else:
        console.print(
            f"{cluster}: priority {row['priority']}, allocation write / read"
            f" {_pair(row['allocation'])} MB/s (rebalanced in {doc['seconds'] * 1000:.0f} ms)"
        )


def register(app: typer.Typer) -> None:
    """Add ``io`` to the app."""
    app.add_typer(io_app, name="io")

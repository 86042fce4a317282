"""``hpvc migrate``: move a running VM node into a new QEMU at a new place, live."""

from __future__ import annotations

import typer

from hpvc.cli.common import console, err_console, print_json
from hpvc.errors import InputError, require_root
from hpvc.units import format_cpulist, parse_cpulist

MIGRATE_HELP = """Move a running VM node to a new place, live (its guest keeps running).

The node is planned anew like a new node (pinned CPUs, emulator CPUs, guest
NUMA cells on the host's NUMA nodes, hugepages grown there, the cluster's
partition) while its guest sees no change: the same vCPUs, cells, memory,
MAC and address. A new QEMU process is started there, the guest's memory
and devices are copied over while it runs, then it switches over; the old
process is stopped and its CPUs and pages are given back. A node that does
not fit is refused before anything moves (exit 2). A migration that fails,
times out or is interrupted (Ctrl-C) is cancelled: the node keeps running
where it was, nothing of the new process is left (exit 1).

With neither --to nor --cpus the node is re-planned on its own host (it may
land on the CPUs it had). --cpus confines the new place to those CPUs (to
evacuate a socket). --to may only name this host: nodes of a Slurm job's
cluster move between hosts with hpvc node migrate (docs/slurm.md).

Examples:

  hpvc migrate demo compute0

  hpvc migrate demo compute0 --cpus 8-15

  hpvc migrate demo compute1 --downtime-ms 100 --bandwidth 1024 --json
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def migrate_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    node: str = typer.Argument(..., help="The node to move, e.g. compute0."),
    to: str = typer.Option(None, "--to", help="Target host (standalone clusters: this host)."),
    cpus: str = typer.Option(None, "--cpus", help="Host CPUs for the node, e.g. 8-15."),
    bandwidth: int = typer.Option(
        None, "--bandwidth", help="Migration bandwidth cap in MiB/s (0: none; default 4096)."
    ),
    downtime_ms: int = typer.Option(
        None, "--downtime-ms", help="Longest pause of the guest allowed at the switch (default 50)."
    ),
    multifd: int = typer.Option(
        None, "--multifd", help="Parallel migration channels (0: one stream; default 2)."
    ),
    postcopy: bool = typer.Option(
        False, "--postcopy", help="Switch to postcopy after two passes (one stream: no multifd)."
    ),
    auto_converge: bool = typer.Option(
        None,
        "--auto-converge/--no-auto-converge",
        help="Slow the vCPUs when memory changes faster than it is sent (default on).",
    ),
    timeout: float = typer.Option(
        None, "--timeout", help="Cancel after this many seconds (default 300)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what moved and the figures as JSON."),
) -> None:
    require_root("hpvc migrate")
    from hpvc.cluster.migrate import check_settings, migrate

    chosen = None
    if cpus is not None:
        try:
            chosen = parse_cpulist(cpus)
        except ValueError as e:
            raise InputError(f"--cpus {cpus}", str(e), "give a CPU list such as 0-3,8") from e
    settings = check_settings(
        bandwidth_mib_s=bandwidth,
        downtime_ms=downtime_ms,
        multifd=multifd if multifd is not None else (0 if postcopy else None),
        postcopy=postcopy or None,
        auto_converge=auto_converge,
        timeout_s=timeout,
    )
    out = migrate(name, node, to=to, cpus=chosen, settings=settings, progress=_progress)
    if as_json:
        print_json(out)
        return
    m = out["migration"]
    src, dst = out["from"], out["to"]
    console.print(
        f"cluster {name}: {node} moved from CPUs {format_cpulist(src['cpus'])}"
        f" (NUMA {src['numa']}) to CPUs {format_cpulist(dst['cpus'])} (NUMA {dst['numa']}),"
        f" QEMU PID {out['pid']}"
    )
    console.print(
        f"  total {m['total_ms']} ms, downtime {m['downtime_ms']} ms (QEMU's count),"
        f" {m['bytes_sent'] / 2**20:.1f} MiB sent in {m['passes']} pass(es)"
    )
    if out.get("answers_ping") is False:
        err_console.print(f"warning: {node} does not answer ping after the move (docs/vms.md)")


def register(app: typer.Typer) -> None:
    app.command("migrate", help=MIGRATE_HELP)(migrate_cmd)

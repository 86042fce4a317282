"""``hpvc node migrate``: move a VM node of a running Slurm job to another host of the job.

Also the steps it runs on the other hosts through the site's ``--via``
(hidden: ``migrate-in``, ``migrate-abort``, ``migrate-follow``). The work is
in ``hpvc.slurm.migrate``; docs/slurm.md "Moving a VM node to another host".
"""

from __future__ import annotations

import json
import os
import sys

import typer

from hpvc.cli.common import console, err_console, print_json
from hpvc.progress import quiet

MIGRATE_HELP = """Move a VM node of a running Slurm job to another host of the job, live.

Run as root on the host the node lives on (a site's drain). The guest keeps
running (memory, devices and its disk layer move over the fabric); its name,
address and MAC stay; every host of the job then sends its traffic to the new
host. Refused (exit 2) before anything moves when the node does not fit there;
a failed or interrupted move leaves it running here (exit 1).

The other hosts' hpvc is run through --via (default $HPVC_REMOTE, else
'ssh -o BatchMode=yes {host}').

Examples:

  hpvc node migrate --job 42 --node compute1 --to n1

  hpvc node migrate --job 42 --node compute1 --to n1 --via 'scripts/slurm/on.sh {host}' --json
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def _settings(bandwidth: int, downtime_ms: int, multifd: int, timeout: float) -> object:
    from hpvc.cluster.across import MigrationSettings

    return MigrationSettings(
        bandwidth_mib_s=bandwidth, downtime_ms=downtime_ms, multifd=multifd, timeout_s=timeout
    )


BANDWIDTH = typer.Option(4096, "--bandwidth", help="MiB/s the stream may take (0: no cap).")
DOWNTIME = typer.Option(50, "--downtime-ms", help="Longest pause of the guest QEMU aims for.")
MULTIFD = typer.Option(2, "--multifd", help="Parallel streams (0: one).")
TIMEOUT = typer.Option(300.0, "--timeout", help="Seconds before the move is cancelled.")


def migrate_cmd(
    job: int = typer.Option(..., min=1, help="Slurm job id."),
    vnode: str = typer.Option(..., "--node", help="The virtual node to move."),
    to: str = typer.Option(..., "--to", help="A host of the job's allocation."),
    via: str = typer.Option("", "--via", help="Command template reaching a host as root."),
    bandwidth: int = BANDWIDTH,
    downtime_ms: int = DOWNTIME,
    multifd: int = MULTIFD,
    timeout: float = TIMEOUT,
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    from hpvc.slurm import migrate

    settings = _settings(bandwidth, downtime_ms, multifd, timeout)
    remote = migrate.Remote(via or os.environ.get("HPVC_REMOTE") or migrate.DEFAULT_VIA)
    moved = migrate.migrate(job, vnode, to, settings, remote, progress=_progress)  # type: ignore[arg-type]
    if as_json:
        print_json({"job": job, "node": moved.node, "from": moved.source, "to": moved.target,
                    "stats": moved.stats.as_dict(), "forwarding": moved.followed})  # fmt: skip
        return
    s = moved.stats
    console.print(
        f"{moved.node} moved to {moved.target}: {s.total_ms} ms, downtime {s.downtime_ms} ms"
        f" (QEMU's), {s.bytes_sent / (1 << 20):.0f} MiB sent"
    )


def migrate_in_cmd(
    job: int = typer.Option(..., min=1),
    vnode: str = typer.Option(..., "--node"),
    mem_mib: int = typer.Option(0, "--mem-mib", min=0),
    source: str = typer.Option(..., "--source-address"),
    bandwidth: int = BANDWIDTH,
    downtime_ms: int = DOWNTIME,
    multifd: int = MULTIFD,
    timeout: float = TIMEOUT,
) -> None:
    """Target side: the node (its planned JSON on stdin) booked and listening."""
    from hpvc.slurm import migrate
    from hpvc.store import Store

    view = json.loads(sys.stdin.read())
    settings = _settings(bandwidth, downtime_ms, multifd, timeout)
    out = migrate.receive(Store(), job, vnode, view, settings, mem_mib, source, quiet)  # type: ignore[arg-type]
    print_json(out)


def migrate_abort_cmd(
    job: int = typer.Option(..., min=1), vnode: str = typer.Option(..., "--node")
) -> None:
    """Target side: undo migrate-in."""
    from hpvc.slurm import migrate
    from hpvc.store import Store

    errors, said = migrate.abandon(Store(), job, vnode)
    print(said)  # the target QEMU's last words, for the source's message
    if errors:
        err_console.print(f"left: {errors[0]}")
        raise typer.Exit(1)


def migrate_follow_cmd(
    job: int = typer.Option(..., min=1),
    name: str = typer.Option(..., "--name"),
    ip: str = typer.Option(..., "--ip"),
    mac: str = typer.Option(..., "--mac"),
    here: bool = typer.Option(False, "--here"),
    to: str = typer.Option("", "--to"),
    to_address: str = typer.Option("", "--to-address"),
) -> None:
    """Every host: point the node's MAC at its new host."""
    from hpvc.slurm import migrate
    from hpvc.store import Store

    where = None if here else (to, to_address)
    print(migrate.follow(Store(), job, (name, ip, mac), where))


def register(app: typer.Typer) -> None:
    app.command("migrate", help=MIGRATE_HELP)(migrate_cmd)
    app.command("migrate-in", hidden=True)(migrate_in_cmd)
    app.command("migrate-abort", hidden=True)(migrate_abort_cmd)
    app.command("migrate-follow", hidden=True)(migrate_follow_cmd)

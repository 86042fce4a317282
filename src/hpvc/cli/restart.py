"""``hpvc restart``: bring back nodes of a running cluster whose container or VM died."""

from __future__ import annotations

import time

import typer

from hpvc.cli.common import console, err_console, print_json
from hpvc.cli.status_view import show_status
from hpvc.cluster import ops
from hpvc.cluster.restart import restart
from hpvc.errors import InputError, require_root

RESTART_HELP = """Bring back nodes whose container or VM died.

Each node is started again from the cluster's plan, with the same name,
address, MAC, CPU pinning, hugepages and limits; it boots from the image
again, so what it wrote to its own root or disk is gone (/shared stays).
The other nodes are not touched. With no NODE, every node that does not
run is restarted; a named node that runs is left as it is, unless --force.
If a node cannot start, the nodes being restarted are left stopped and
the command fails (exit 1): run it again, or hpvc down.

Examples:

  hpvc restart demo                      (every node that died)

  hpvc restart demo compute1

  hpvc restart demo compute0 compute1 --force --json
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def restart_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    nodes: list[str] = typer.Argument(
        None, help="Nodes to restart, e.g. compute1 (default: every node that does not run)."
    ),
    force: bool = typer.Option(
        False, "--force", help="Restart the named nodes even if they run (their work is lost)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print what was done and the cluster's status as JSON."
    ),
) -> None:
    require_root("hpvc restart")
    if force and not nodes:
        raise InputError("hpvc restart --force", "names no node", "name the nodes to restart")
    t0 = time.perf_counter()
    done = restart(name, list(nodes or []), progress=_progress, force=force)
    seconds = time.perf_counter() - t0
    if as_json:
        print_json(
            {
                "cluster": name,
                "seconds": seconds,
                "nodes": [d.to_json() for d in done],
                "status": ops.status(name),
            }
        )
        return
    back = [d.node for d in done if d.restarted]
    if back:
        console.print(f"cluster {name}: restarted {', '.join(back)} in {seconds:.2f} s")
    elif nodes:
        console.print(f"cluster {name}: nothing restarted, {', '.join(nodes)} running")
    else:
        console.print(f"cluster {name}: every node runs, nothing restarted")
    show_status(ops.status(name))


def register(app: typer.Typer) -> None:
    app.command("restart", help=RESTART_HELP)(restart_cmd)

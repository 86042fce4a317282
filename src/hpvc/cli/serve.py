"""``hpvc serve``: this host's resident hpvc (hpvc.resident)."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

import typer

from hpvc.errors import InputError, require_root

HELP = """Keep hpvc loaded on this host: commands start from a warm fork.

Every hpvc command spends most of its time starting (the interpreter,
pydantic, pyroute2, hpvc itself): about 0.45 s of the 0.6 s a one-node
`hpvc up` takes. With `hpvc serve` running, `hpvc ...` on this host sends its
arguments, environment, terminal and working directory to the server, which
runs the command in a fork of itself as the calling user (its uid and
groups, from the socket), passes Ctrl-C and SIGTERM on, and returns the exit
status. The command runs in the caller's cgroups and under its resource
limits (ulimit), read from the kernel; root itself reads nothing a client
sends. A user has at most --per-user connections at a time (more run in the
caller's own process), and a client that sends nothing for --idle-timeout
seconds is dropped. exec, run, node enter and bench always run in the
caller's process.
HPVC_RESIDENT=0 runs a command without the server. Run it as root, one per
state directory (systemd, or the Slurm test cluster's scripts); it stops on
SIGTERM. Each request is logged on stderr.

Examples:

  hpvc serve &

  HPVC_STATE_DIR=/var/lib/hpvc-n1 hpvc serve --socket /run/hpvc/n1.sock
"""

# What commands load when they run (hpvc.cli.tree imports a command's module
# when it is named; the modules import these when a command starts).
PRELOAD = (
    "rich.console",
    "rich.table",
    "hpvc.cluster.lifecycle",
    "hpvc.cluster.ops",
    "hpvc.cluster.teardown",
    "hpvc.cluster.restart",
    "hpvc.slurm.node",
    "hpvc.slurm.policy",
    "hpvc.host.net",
    "hpvc.host.vxlan",
)


def _preload() -> None:
    import contextlib

    from hpvc.cli import tree

    with contextlib.suppress(ImportError):  # typer's help, where rich is there
        importlib.import_module("typer.rich_utils")

    modules = {module for name, (module, _) in tree.COMMANDS.items() if name != "bench"}
    for module in sorted(modules):
        importlib.import_module(f"hpvc.cli.{module}")
    for module in PRELOAD:
        importlib.import_module(module)
    from hpvc.cluster import backends

    backends.load_all()  # every registered one (the registry's table)


def _run(argv: list[str]) -> int:
    """In the forked child: run one command as ``hpvc ARGV`` would."""
    import hpvc.cli

    hpvc.cli.STARTED = time.perf_counter()
    code = 0
    try:
        hpvc.cli.run_here(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def serve_cmd(
    socket: Path | None = typer.Option(
        None, "--socket", help="Where to listen (default: /run/hpvc/<hash of the state dir>.sock)."
    ),
    per_user: int = typer.Option(
        16, "--per-user", help="Connections one user may have open at a time (root: no limit)."
    ),
    idle_timeout: float = typer.Option(
        10.0, "--idle-timeout", help="Seconds a client may take to send its request."
    ),
) -> None:
    from hpvc import resident, resident_server

    if per_user < 1:
        raise InputError("--per-user", f"{per_user} is not a count", "give 1 or more, e.g. 16")
    if not 0 < idle_timeout <= 3600:
        raise InputError(
            "--idle-timeout", f"{idle_timeout:g} s is out of range", "give 0 < s <= 3600, e.g. 10"
        )
    require_root("hpvc serve")
    path = socket or Path(resident.socket_path())
    _preload()

    def log(line: str) -> None:
        print(f"hpvc serve: {line}", file=sys.stderr, flush=True)

    resident_server.serve(
        str(path),
        _run,
        lambda: log(f"listening on {path} (pid {os.getpid()})"),
        log,
        per_user=per_user,
        idle=idle_timeout,
    )


def register(app: typer.Typer) -> None:
    app.command("serve", help=HELP)(serve_cmd)

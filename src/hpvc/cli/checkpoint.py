"""``hpvc checkpoint`` (take, ls, show, rm) and ``hpvc restore`` (docs/checkpoint.md)."""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer vendors click from 0.2x on; before, it used click itself
    from typer._click.core import Command, Context
except ImportError:  # pragma: no cover - older typer
    from click import Command, Context  # type: ignore[no-redef, import-not-found, unused-ignore]

from hpvc.cli.common import console, err_console, print_json

CHECKPOINT_HELP = """\
Save a whole running cluster as files, one consistent cut: list, show, remove them.

Every node is frozen first (VMs: vCPUs stopped; containers: cgroups frozen),
then each is saved (VMs: QEMU's own state stream and their disk; containers:
CRIU), then all run on again, or with --stop the cluster is taken down.
hpvc restore DIR brings it back, here or on another host, and the job inside
goes on from where it was. A checkpoint is a folder: manifest.json (nodes,
sizes, sha256, image digests, hpvc version) and nodes/<node>/.

Examples:

  hpvc checkpoint demo        (into /var/lib/hpvc/checkpoints/)

  hpvc checkpoint demo --out /scratch/ck1 --stop

  hpvc checkpoint ls

  hpvc checkpoint show /scratch/ck1

  hpvc checkpoint rm /scratch/ck1

A cluster named ls, show, rm or take: hpvc checkpoint take NAME.
"""

RESTORE_HELP = """Bring a checkpointed cluster back and let it run on from where it was.

The checkpoint is checked first (sizes, sha256, hpvc version, architecture,
image digests): a bad one is refused in one line (exit 2) and nothing is
changed. The cluster is planned anew for this host (CPUs, NUMA nodes,
hugepages) with its saved names, addresses and MACs; its name and subnet must
be free here (--name gives it another name; the subnet stays). If a node
cannot be brought back, everything restore made is removed (exit 1).

Examples:

  hpvc restore /var/lib/hpvc/checkpoints/demo-20261126T050000Z

  hpvc restore /scratch/ck1 --name demo2 --json
"""


class _TakeByDefault(TyperGroup):
    """``hpvc checkpoint NAME`` is ``hpvc checkpoint take NAME``."""

    def resolve_command(
        self, ctx: Context, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["take", *args]
        return super().resolve_command(ctx, args)


checkpoint_app = typer.Typer(help=CHECKPOINT_HELP, cls=_TakeByDefault, no_args_is_help=True)


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return str(n)


@checkpoint_app.command("take", help="Checkpoint the running cluster NAME (the default action).")
def take_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    out: Path = typer.Option(None, "--out", help="A new or empty folder for the checkpoint."),
    stop: bool = typer.Option(False, "--stop", help="Take the cluster down after the cut."),
    as_json: bool = typer.Option(False, "--json", help="Print the checkpoint's summary as JSON."),
) -> None:
    from hpvc.cluster import checkpoint as ck

    t0 = time.perf_counter()
    dest, m = ck.checkpoint(name, out, stop=stop, progress=_progress)
    row = ck.summary(dest, m) | {"seconds": time.perf_counter() - t0}
    if as_json:
        print_json(row)
        return
    console.print(
        f"cluster {name}: checkpoint {dest} ({_size(m.size())}, {len(m.nodes)} nodes, frozen"
        f" {m.frozen_s:.2f} s{', cluster stopped' if stop else ''})"
    )


@checkpoint_app.command("ls", help="List checkpoints (default: the state folder's).")
def ls_cmd(
    dirs: list[Path] = typer.Argument(None, help="Checkpoint folders, or folders of them."),
    as_json: bool = typer.Option(False, "--json", help="Print them as JSON."),
) -> None:
    from hpvc.cluster import checkpoint as ck

    rows = ck.listing(list(dirs or []))
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no checkpoints")
        return
    for r in rows:
        if "error" in r:
            console.print(f"{r['dir']}  (unreadable: {r['error']})")
            continue
        console.print(
            f"{r['dir']}  {r['cluster']}  {_when(r['created'])}  {len(r['nodes'])} nodes"
            f"  {_size(r['size'])}"
        )


@checkpoint_app.command("show", help="Size, nodes, time and image digests of one checkpoint.")
def show_cmd(
    directory: Path = typer.Argument(..., help="The checkpoint's folder."),
    as_json: bool = typer.Option(False, "--json", help="Print it as JSON."),
) -> None:
    from hpvc.cluster import checkpoint as ck
    from hpvc.cluster import checkpoint_format as cf

    row: dict[str, Any] = ck.summary(directory, cf.read_manifest(directory, check_version=False))
    if as_json:
        print_json(row)
        return
    console.print(f"checkpoint {row['dir']}")
    console.print(
        f"  cluster {row['cluster']}, subnet {row['subnet']}, taken {_when(row['created'])}"
    )
    console.print(
        f"  {_size(row['size'])}, nodes frozen {row['frozen_s']:.2f} s,"
        f" hpvc {row['hpvc_version']} on {row['arch']}"
        f"{', cluster stopped after' if row['stopped'] else ''}"
    )
    for n in row["nodes"]:
        console.print(
            f"  {n['name']:<12} {n['kind']:<9} {n['backend']:<6} {n['ip']:<15}"
            f" {_size(n['size']):>10}  image {n['image_digest'] or '(unknown)'}"
        )


@checkpoint_app.command("rm", help="Remove checkpoints (their folders).")
def rm_cmd(directories: list[Path] = typer.Argument(..., help="Checkpoint folders.")) -> None:
    from hpvc.cluster import checkpoint as ck

    for d in directories:
        ck.remove(d)
        console.print(f"removed {d}")


def restore_cmd(
    directory: Path = typer.Argument(..., help="The checkpoint's folder."),
    name: str = typer.Option(None, "--name", help="Restore under another cluster name."),
    as_json: bool = typer.Option(False, "--json", help="Print the cluster's status as JSON."),
) -> None:
    from hpvc.cli.status_view import show_status
    from hpvc.cluster import ops
    from hpvc.cluster.restore import restore

    t0 = time.perf_counter()
    rec = restore(directory, name, progress=_progress)
    seconds = time.perf_counter() - t0
    if as_json:
        print_json({"cluster": rec.name, "seconds": seconds, "status": ops.status(rec.name)})
        return
    console.print(f"cluster {rec.name}: restored from {directory} in {seconds:.2f} s")
    show_status(ops.status(rec.name))


def register(app: typer.Typer) -> None:
    app.add_typer(checkpoint_app, name="checkpoint")
    app.command("restore", help=RESTORE_HELP)(restore_cmd)

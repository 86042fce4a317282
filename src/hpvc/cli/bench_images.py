"""``hpvc bench images``: importing Docker/OCI images against Podman, tar and umoci."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hpvc.bench import common
from hpvc.bench.images import report as images_report
from hpvc.bench.images import runner as images
from hpvc.cli.common import console, err_console, print_json

IMAGES_HELP = """Image import against podman load, tar and umoci (root, Podman, skopeo, umoci).

Makes two docker-archives with Podman (a private storage root in a temporary
folder; the host's Podman store is not touched) from this host's files: base,
the root filesystem of an hpvc image (--base, default hpc, about 300 MB),
and big, base plus a layer of --extra-mib MiB of incompressible files. Every
repetition, the archives and the ways alternated: `hpvc image import` into an
empty store (the whole CLI) and the same import a second time; `podman load`;
tar of the archive and its layers; skopeo copy + umoci unpack. Then an
--nodes container cluster up and down from the imported base and from the
hpvc image it came from, alternated; last, the disk used by a store holding
each image alone and both. Goals: import <= 1.0x podman load (median ratio),
a second import <= 0.1 s, up within 10%. Writes results.json, report.md and
images.png. With the defaults about 2 minutes per repetition on 2 CPUs.

Examples:

  hpvc bench images

  hpvc bench images --repeat 3 --extra-mib 100 --nodes 4 --out /tmp/images --json
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def images_cmd(
    repeat: int = typer.Option(5, min=1, help="Repetitions (each times every way on both)."),
    base: str = typer.Option("hpc", help="The hpvc image whose root filesystem is the base."),
    extra_mib: int = typer.Option(700, min=1, help="MiB the big image adds to the base."),
    nodes: int = typer.Option(8, min=1, help="Nodes of the cluster brought up."),
    out: Path = typer.Option(Path("bench/results/images"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    doc = images.run(repeat, base, extra_mib, nodes, progress=_progress)
    common.write_results(out, doc, images_report.report_md(doc))
    images_report.plot(doc, out / "images.png")
    if as_json:
        print_json(doc)
        return
    t = Table(title=f"image import, {repeat} repetitions (seconds, min / median / max)")
    t.add_column("archive")
    for c in images_report.CONFIGS:
        t.add_column(c)
    for label, d in doc["imports"].items():
        s = d["seconds"]
        t.add_row(
            label, *(images_report.mmm(s[c]) if c in s else "" for c in images_report.CONFIGS)
        )
    console.print(t)
    for g in doc["goals"]:
        console.print(f"goal ({g['what']}): {'met' if g['met'] else 'NOT met'} ({g['value']})")
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


def register(app: typer.Typer) -> None:
    app.command("images", help=IMAGES_HELP)(images_cmd)

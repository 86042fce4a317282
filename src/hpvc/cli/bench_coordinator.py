"""``hpvc bench coordinator``: the storage bandwidth coordinator with fio (docs/io.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from hpvc.bench import common
from hpvc.bench.coordinator import report as coordinator_report
from hpvc.bench.coordinator import runner as coordinator_bench
from hpvc.cli.common import console, err_console, print_json
from hpvc.errors import InputError
from hpvc.units import parse_size

COORDINATOR_HELP = """The storage bandwidth coordinator measured with fio (root, fio, Ganesha).

In a throw-away state directory whose disk a site file of the run declares, one-node
container clusters serve their shared directories over NFS and write to them
flat out (fio, direct I/O, 1 MiB). Per repetition, in a rotating order: the
overhead uncontended (one cluster alone: unmanaged, managed (alone it may take
the whole disk: no throttle, buffered writes; goal < 2% loss), and enforced (a
demand below the capacity: a throttle that never bites, synchronous writes:
what enforcing costs)); shares
of three clusters with priorities 1:2:4 against 1/7, 2/7, 4/7 of --capacity
and their sum against it, then the 4 leaving (the others' throttles change:
rebalance time; their rates after against 1/3, 2/3); and a demand below its
share (hpvc io set). Writes results.json, report.md and coordinator.png.
About a minute per repetition.

Examples:

  hpvc bench coordinator

  hpvc bench coordinator --repeat 3 --capacity 70MB/s --out docs/results/coordinator --json
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def coordinator_cmd(
    repeat: int = typer.Option(3, min=1, help="Repetitions (each runs every part)."),
    seconds: int = typer.Option(6, min=3, help="Length of every fio run, in seconds."),
    capacity: str = typer.Option("70MB/s", help="The declared write capacity to share out."),
    out: Path = typer.Option(Path("bench/results/coordinator"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    try:
        cap = parse_size(capacity)
    except ValueError as e:
        raise InputError(f"--capacity {capacity!r}", str(e), "e.g. 70MB/s") from None
    doc = coordinator_bench.run(repeat, seconds, cap, progress=_progress)
    common.write_results(out, doc, coordinator_report.report_md(doc))
    coordinator_report.plot(doc, out / "coordinator.png")
    if as_json:
        print_json(doc)
        return
    for g in doc["goals"]:
        console.print(f"goal ({g['what']}): {'met' if g['met'] else 'NOT met'} ({g['value']})")
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


def register(app: typer.Typer) -> None:
    app.command("coordinator", help=COORDINATOR_HELP)(coordinator_cmd)

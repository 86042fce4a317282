"""`hpvc doctor`: what this host offers and lacks for hpvc, each with a fix hint."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from hpvc.cli.common import console, err_console, print_json
from hpvc.cluster.doctor import run_checks
from hpvc.host.doctor import Report
from hpvc.sysroot import SysRoot

_STYLE = {"ok": "green", "warn": "yellow", "missing": "red"}

HELP = (
    "Report what this host offers and lacks for hpvc: accelerator (KVM or TCG), NUMA,"
    " hugepages, cgroups, bfq, network devices and the tools later commands need,"
    " each with a fix hint. Read-only: it changes nothing on the host.\n\n"
    "Exit code 0 (it is a report), or 1 with --strict when anything is missing.\n\n"
    "Examples:\n\n"
    "  hpvc doctor\n\n"
    "  hpvc doctor --json\n\n"
    "  hpvc doctor --strict && echo ready\n\n"
    "  hpvc doctor --root /tmp/snapshot   # probe an extracted host snapshot"
)


def summary_line(report: Report) -> str:
    """``N ok, N warn, N missing; accelerator: kvm|tcg``."""
    s = report.summary()
    return (
        f"{s['ok']} ok, {s['warn']} warn, {s['missing']} missing; accelerator: {report.accelerator}"
    )


def render_table(report: Report) -> Table:
    """The report as a rich table; cells are Text so sysfs brackets are not markup."""
    table = Table(show_header=True, header_style="bold")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=3)
    table.add_column("fix", overflow="fold", ratio=2)
    for c in report.checks:
        table.add_row(
            Text(c.name), Text(c.status, style=_STYLE[c.status]), Text(c.detail), Text(c.fix)
        )
    return table


def doctor(
    json_out: bool = typer.Option(
        False, "--json", help="Print JSON: checks, accelerator and summary. Example: --json"
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Exit 1 when any check is missing. Example: --strict"
    ),
    root: Path = typer.Option(
        Path("/"),
        "--root",
        metavar="DIR",
        help=(
            "Probe an extracted snapshot instead of / (for testing); tools are then looked"
            " up in DIR's bin directories. Example: --root /tmp/snapshot"
        ),
    ),
) -> None:
    """Report what this host offers and lacks for hpvc."""
    report = run_checks(SysRoot(root))
    if json_out:
        print_json(report.as_dict())
    else:
        console.print(render_table(report))
        console.print(summary_line(report), markup=False)
    missing = [c.name for c in report.checks if c.status == "missing"]
    if strict and missing:
        err_console.print(
            f"hpvc: doctor --strict: missing {', '.join(missing)} (see the fix column)",
            markup=False,
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``doctor`` to the app."""
    app.command("doctor", help=HELP)(doctor)

"""``hpvc bench scale``: how hpvc's costs grow with hosts and nodes (issue 33)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import typer

from hpvc.cli.common import err_console, show_results
from hpvc.errors import HpvcError, InputError

SCALE_HELP = """How hpvc's costs grow with the number of hosts (root; Slurm, crun).

--part slurm: on a private Slurm test cluster of as many simulated hosts as
the largest --hosts count (its own fabric and directory: a `make slurm-up`
cluster is not disturbed), once with a resident hpvc (`hpvc serve`) on every
host and once without, per host count h: `srun -N<h> --hpvc=SPEC` (two
container nodes per host, one network, VXLAN across hosts) against plain
`srun -N<h>`, alternated; time to the first task, its phases, the epilog's
teardown per host, hpvc's CPU seconds per host and each host's resident
memory. Jobs are submitted by an ordinary user (--user). --kind vm: one
VM node per host instead, at most 4 hosts (VMs run under TCG emulation on
this machine: the figures and growth words are the emulator's too), QEMU's
memory per host measured as well. --part planner: the planner on simulated
inventories of 100 to 10,000 hosts. --part all: both.

Writes results.json, report.md (tables, the fitted growth in words, the
goals) and PNG plots against the host count into --out.

Examples:

  hpvc bench scale --hosts 1,2,4,8 --reps 3

  hpvc bench scale --hosts 1,2,4,8,16,32 --reps 3 --out /tmp/scale --json

  hpvc bench scale --part slurm --kind vm --hosts 1,2,4 --reps 3 --resident yes
"""

PARTS = ("slurm", "planner", "all")


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def parse_hosts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(
            f"--hosts {text}", "not a comma-separated list of numbers", "--hosts 1,2,4,8,16,32"
        ) from None
    if not counts:
        raise InputError("--hosts", "no host count given", "--hosts 1,2,4,8,16,32")
    return counts


def planner_module() -> ModuleType:
    """The planner half (hpvc.bench.scale.planner), imported when asked for."""
    try:
        return importlib.import_module("hpvc.bench.scale.planner")
    except ModuleNotFoundError as e:
        if e.name != "hpvc.bench.scale.planner":
            raise
        raise HpvcError(
            "bench scale --part planner",
            "the planner half (hpvc.bench.scale.planner) is not in this hpvc yet",
            "run --part slurm",
        ) from None


def scale_cmd(
    hosts: str = typer.Option("1,2,4,8,16,32", help="Host counts, comma-separated (1 to 32)."),
    reps: int = typer.Option(3, min=1, help="Repetitions of each measurement."),
    part: str = typer.Option("all", help="slurm, planner or all."),
    user: str = typer.Option("nobody", help="The ordinary user who submits the jobs."),
    resident: str = typer.Option(
        "both", help="both: with and without a resident hpvc; yes or no: one of them."
    ),
    kind: str = typer.Option(
        "container", help="container, or vm: one VM per host, 1 to 4 hosts (TCG)."
    ),
    out: Path = typer.Option(Path("bench/results/scale"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    if part not in PARTS:
        raise InputError(f"--part {part}", "unknown", "--part slurm, planner or all")
    modes = {"both": (True, False), "yes": (True,), "no": (False,)}
    if resident not in modes:
        raise InputError(f"--resident {resident}", "unknown", "--resident both, yes or no")
    counts = parse_hosts(hosts)
    if kind != "container" and part != "slurm":
        raise InputError(f"--kind {kind}", "only --part slurm has VM nodes", "--part slurm")
    if part in ("slurm", "all"):
        from hpvc.bench.scale.slurm import check_hosts

        check_hosts(counts, kind)  # refused before anything starts
    planner = planner_module() if part in ("planner", "all") else None
    doc: dict[str, Any] = {}
    lines: list[str] = []
    if part in ("slurm", "all"):
        from hpvc.bench.scale import report
        from hpvc.bench.scale import slurm as scale_slurm

        sdoc = scale_slurm.run(
            counts, reps, _progress, user=user, residents=modes[resident], kind=kind
        )
        sdoc["plots"] = report.plots(sdoc, out)
        doc["slurm"] = sdoc
        lines.append(report.report_md(sdoc))
        lines += [f"![{p}]({p})" for p in sdoc["plots"]]
    if planner is not None:
        result = planner.run(out, reps)
        doc["planner"] = result
        lines += ["", *planner.report_lines(result)]
    show_results(out, doc, "\n".join(lines) + "\n", as_json)


def register(app: typer.Typer) -> None:
    app.command("scale", help=SCALE_HELP)(scale_cmd)

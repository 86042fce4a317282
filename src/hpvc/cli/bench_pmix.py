"""``hpvc bench pmix``: Slurm as MPI's launcher in hpvc's nodes (issue 30, Figures)."""

from __future__ import annotations

from pathlib import Path

import typer

from hpvc.bench import common
from hpvc.bench.pmix import report as pmix_report
from hpvc.bench.pmix import runner as pmix_bench
from hpvc.cli.common import console, err_console, print_json

PMIX_HELP = """MPI under srun --mpi=pmix against mpirun in the same nodes, and step launch (root).

On a private Slurm test cluster (three hosts in namespaces, jobs submitted by
--user), per repetition, the order rotated: an MPI ping-pong and an 8-rank
HPCC (N=1024) in one virtual node, launched by srun --mpi=pmix (tasks join the
node, PMIx through hpvc's forwarder) and by mpirun run inside that node; and
the launch time of srun -N2 -n4 --mpi=pmix true in a salloc -N2 allocation
with --hpvc and without. Reports min/median/max and srun/mpirun paired per
repetition. --kind vm: the same in VM guests (1 vCPU each, HPCC N=256 for
TCG), the programs carried into each guest's /tmp in the command line.

Examples:

  hpvc bench pmix --repeat 3

  hpvc bench pmix --repeat 3 --out docs/results/pmix --json
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def pmix_cmd(
    repeat: int = typer.Option(3, min=1, help="Repetitions."),
    out: Path = typer.Option(Path("bench/results/pmix"), help="Where results go."),
    user: str = typer.Option("nobody", help="The ordinary user who submits the jobs."),
    kind: str = typer.Option("container", help="Node kind: container or vm."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    doc = pmix_bench.run(repeat, progress=_progress, user=user, kind=kind)
    common.write_results(out, doc, pmix_report.report_md(doc))
    if as_json:
        print_json(doc)
        return
    for row in doc["mpi"]:
        r = row["ratio_srun_mpirun"]
        console.print(
            f"{row['what']} {row['metric']}: srun/mpirun"
            f" {r['min']:.3f} / {r['median']:.3f} / {r['max']:.3f} (min/median/max)"
        )
    launch = doc["step_launch"]
    console.print(f"step launch added by --hpvc (median): {launch['added_median_s']:+.3f} s")
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


def register(app: typer.Typer) -> None:
    app.command("pmix", help=PMIX_HELP)(pmix_cmd)

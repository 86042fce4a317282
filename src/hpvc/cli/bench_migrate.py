"""``hpvc bench migrate``: live migration figures (issue 27)."""

from __future__ import annotations

from pathlib import Path

import typer

from hpvc.cli.common import err_console, show_results
from hpvc.errors import InputError
from hpvc.units import parse_size

MIGRATE_HELP = """Live migration of a VM node: total time, downtime, data sent (root; QEMU).

One host (default): per guest size a cluster of two 1-vCPU guests; compute1
moves into a new QEMU (re-planned on this host) --reps times, idle,
under a memory-writing load and under an MPI ping-pong across both guests
(loads alternated). Reports QEMU's total time and downtime, the longest gap
between ping replies from the host (the guest seen from outside), MiB sent,
wall time and the MPI loop's slowdown, min / median / max. Sizes that do not
fit in the host's free memory now are left out (said in the report). Under
TCG the figures are emulation's.

--hosts 2: the same between two hosts of a private Slurm test cluster
(python -m hpvc.bench.migrate.slurm; idle and MPI).

--region: a node that shares n1's ivshmem region moves to n2 under an MPI
ping-pong (python -m hpvc.bench.migrate.region; one job per repetition, the
first size): the loop's rate on the region, through the move, after it over
the module's TCP, and in a new step over UCX's own TCP.

Writes results.json and report.md into --out.

Examples:

  hpvc bench migrate --sizes 1GiB,2GiB,4GiB --reps 3

  hpvc bench migrate --hosts 2 --sizes 1GiB --reps 3

  hpvc bench migrate --region --sizes 512MiB --reps 3 --seconds 20
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def parse_sizes(text: str) -> list[int]:
    try:
        return [parse_size(x.strip()) >> 20 for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise InputError(f"--sizes {text}", str(e), "--sizes 1GiB,2GiB") from None


def migrate_cmd(
    sizes: str = typer.Option("1GiB,2GiB,4GiB", help="Guest memory sizes, comma-separated."),
    reps: int = typer.Option(3, help="Repetitions per size (each load once in each)."),
    seconds: int = typer.Option(10, help="Length of each load (MPI loop, memory writer)."),
    hosts: int = typer.Option(1, help="1: on this host; 2: across two Slurm test hosts."),
    slurm: bool = typer.Option(False, "--slurm", help="Same as --hosts 2."),
    region: bool = typer.Option(False, "--region", help="A region node leaves its host."),
    user: str = typer.Option("nobody", help="--hosts 2: the user who submits the job."),
    out: Path = typer.Option(Path("bench/results/migrate"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    mibs = parse_sizes(sizes)
    if hosts not in (1, 2):
        raise InputError(f"--hosts {hosts}", "1 or 2 hosts", "--hosts 2")
    if region:
        from hpvc.bench.migrate import region as leave

        doc = leave.run(mibs[0], reps, max(seconds, 5), user, progress=_progress)
        text = leave.report(doc)
    elif slurm or hosts == 2:
        from hpvc.bench.migrate import slurm as across

        doc = across.run(mibs, reps, max(seconds, 10), user, progress=_progress)
        text = across.report(doc)
    else:
        from hpvc.bench.migrate import report, runner

        out.mkdir(parents=True, exist_ok=True)
        doc = runner.run(mibs, reps, seconds, _progress, partial=out / "results.partial.json")
        text = report.report_md(doc)
    show_results(out, doc, text, as_json)


def register(app: typer.Typer) -> None:
    app.command("migrate", help=MIGRATE_HELP)(migrate_cmd)

"""``hpvc bench spark``: TeraSort on the Spark virtual cluster vs native Spark."""

from __future__ import annotations

from pathlib import Path

import typer

from hpvc.bench import common
from hpvc.bench.spark import report as spark_report
from hpvc.bench.spark import runner as spark_bench
from hpvc.cli.common import console, err_console, print_json
from hpvc.errors import InputError
from hpvc.units import parse_size

SPARK_HELP = """TeraSort on a Spark virtual cluster against native Spark (root).

Builds the spark image if needed, brings up two Spark clusters (head + 2
compute containers: one with its shared directory a host folder, as native
Spark's data is, one with it over NFS) and a native Spark standalone on the
host with the same workers, JRE and jar, then per size and repetition
generates, sorts and validates TeraSort data on each, the order rotating.
Reports TeraSort's sort time and the whole sort step's wall time,
min/median/max, ratios native/config paired per repetition, and NFS against
the host folder. Goal: container/native >= 0.95 on the sort (sizes of 1 GiB
and up). The vm configuration runs the same cluster as VMs; under TCG (no
usable KVM) give it a small size.

The nodes fit the host it runs on: compute containers of 8 GiB (VMs 4 GiB)
and a head of 2 GiB where the host's free memory allows, smaller otherwise
(and, under 4 GiB nodes, smaller workers on both sides); default sizes the
workers cannot hold are left out. What was scaled down is printed and kept
in results.json ("scaled_down") and report.md. Time on a 2-CPU host
(docs/benchmarks.md): about 50 minutes for the defaults (1 and 4 GiB, 3
configurations, 3 repetitions), 20 without container-nfs
(--configs native,container), about a fifth of that with --sizes 1.

Examples:

  hpvc bench spark --sizes 1 --repeat 3

  hpvc bench spark --sizes 1,4 --repeat 3 --out docs/results/spark --json

  hpvc bench spark --sizes 16MiB --configs native,container-nfs,vm --repeat 3

  hpvc bench spark --slurm --sizes 256MiB,1 --repeat 3 --user hpvct1

With --slurm: a private three-host Slurm test cluster; TeraSort as an
sbatch job of a head and three compute containers (NFS from head0, a
worker per host) against native Spark in the three hosts' namespaces,
unpinned (native) and held to the CPUs Slurm gave the job on each host
(native-pinned), and a job's time to its first task with NFS and Spark
against without (docs/benchmarks.md, "Spark as a Slurm job").
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def _sizes(text: str) -> list[int]:
    """Bytes of each size: a bare number is GiB (``1,4``), else a size (``64MiB``)."""
    try:
        sizes = [
            int(x) << 30 if x.strip().isdigit() else parse_size(x.strip())
            for x in text.split(",")
            if x.strip()
        ]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 << 20 or any(s % (1 << 20) for s in sizes):
        raise InputError(
            f"--sizes {text!r}", "want GiB or whole MiB, comma-separated", "e.g. 1,4 or 16MiB"
        )
    return sizes


def spark_cmd(
    sizes: str | None = typer.Option(
        None,
        "--sizes",
        help="Data sizes, comma-separated: GiB when bare, or e.g. 16MiB"
        " (default 1,4, kept to what this host's workers hold).",
    ),
    repeat: int = typer.Option(3, min=1, help="Repetitions per size and configuration."),
    configs: str | None = typer.Option(
        None,
        help=f"Configurations to run, from {', '.join(spark_bench.CONFIGS)} (default"
        f" {','.join(spark_bench.DEFAULT_CONFIGS)}); with --slurm from native, native-pinned,"
        " slurm-nfs, slurm-bind (default native,native-pinned,slurm-nfs).",
    ),
    out: Path = typer.Option(Path("bench/results/spark"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
    slurm: bool = typer.Option(
        False, "--slurm", help="TeraSort as a Slurm job across 3 test hosts vs native there."
    ),
    user: str = typer.Option("nobody", help="With --slurm: the ordinary user who submits."),
) -> None:
    if slurm:
        _slurm(sizes, repeat, out, as_json, user, configs)
        return
    configs = configs or ",".join(spark_bench.DEFAULT_CONFIGS)
    chosen = tuple(c for c in configs.split(",") if c)
    unknown = [c for c in chosen if c not in spark_bench.CONFIGS]
    if unknown or "native" not in chosen:
        raise InputError(f"--configs {configs!r}", "needs native and known configurations",
                         f"from: {', '.join(spark_bench.CONFIGS)}")  # fmt: skip
    given = _sizes(sizes) if sizes is not None else None
    doc = spark_bench.run(given, repeat, chosen, progress=_progress)
    common.write_results(out, doc, spark_report.report_md(doc))
    if as_json:
        print_json(doc)
        return
    for metric, met, r in spark_report.verdicts(doc):
        cell = "n/a" if r is None else f"{r['min']:.3f} / {r['median']:.3f} / {r['max']:.3f}"
        verdict = {True: "met", False: "NOT met", None: "n/a"}[met]
        console.print(f"container/native {metric}: {cell} (min/median/max), goal: {verdict}")
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


def _slurm(
    sizes: str | None, repeat: int, out: Path, as_json: bool, user: str, configs: str | None
) -> None:
    from hpvc.bench.spark import slurm as spark_slurm

    given = _sizes(sizes) if sizes is not None else [1 << 30, 4 << 30]
    chosen = tuple(c for c in configs.split(",") if c) if configs else spark_slurm.DEFAULT_CONFIGS
    doc = spark_slurm.run(given, repeat, _progress, user, chosen, out / "results.partial.json")
    common.write_results(out, doc, spark_report.slurm_report_md(doc))
    if as_json:
        print_json(doc)
        return
    console.print(spark_report.slurm_report_md(doc).split("## A job's")[0], markup=False)
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


def register(app: typer.Typer) -> None:
    app.command("spark", help=SPARK_HELP)(spark_cmd)

"""``hpvc bench run``, ``report`` and ``compare``: the suites in one go, and their results.

``run`` runs the suites (hpcc, isolation, io, startup) against native,
container and VM targets and writes results.json, report.md and plots;
``report`` re-renders a run from its results.json; ``compare`` puts two runs
side by side. Parse, call, print: the work is in ``hpvc.bench.harness`` and
``hpvc.bench.report``.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from hpvc.bench import harness
from hpvc.bench import report as bench_report
from hpvc.cli.common import console, err_console, print_json
from hpvc.errors import HpvcError, InputError

RUN_HELP = """Run the benchmark suites against native, container and VM targets (needs root).

Suites: hpcc (HPC Challenge: native, container and the container without
pinning, hugepages or NUMA; vm when asked), isolation (an HPC node beside a
CPU-hungry tenant: idle, partitioned, shared), io (block-I/O throttles,
weights and overhead of container nodes), startup (hpvc up/down of 1, 4, 8
container nodes; VMs 1, 2, 4). --targets picks the sides: native -> hpcc
native; container -> hpcc container and its ablations, isolation, io,
container start-up; vm -> hpcc vm and VM start-up. io and isolation need
container (they are skipped, with a note, without it).

Everything goes to --out: results.json (every sample, host facts, each
suite's document), report.md (goal table, then per suite min/median/max per
config and metric with ratios to the baseline paired per repetition) and one
PNG per suite. A suite that fails is recorded there and the others still
run; the command then exits 1. `hpvc bench report DIR` redraws a run,
`hpvc bench compare A B` compares two.

hpcc sizes HPL's N for the machine it runs on: from the last-level cache
(the matrix at least 4x it), capped so that a node of 4x the matrix fits
in the host's free memory and so that one native run fits --time-budget
(default 60 s; a short probe run at N=2048 gives the flop rate); --hpl-n
sets N by hand. report.md and results.json ("sizing") say what was scaled
down and why. Every side runs the same BLAS with one thread per rank:
Debian's OpenBLAS by default (LD_LIBRARY_PATH to its directory; the host's
alternatives are left alone; the nodes use the image hpc-openblas), and
the results name the library each side had mapped ("blas").

Time on a 2-CPU machine with the defaults (all suites, native,container,
--repeat 3): about 20 minutes: hpcc up to 16 (a probe, then 5 configs x 3
runs within the 60 s budget each, plus bringing up 4 clusters), isolation
~4 (3 configs x 3 visits x 3 hpcc samples), io ~2.5 (36 fio runs of 3 s),
startup under 1. vm adds VM start-up (~1.5 min) and hpcc in a VM (a
smaller problem under TCG). results.json records each suite's wall time.

Examples:

  hpvc bench run

  hpvc bench run --suite hpcc,io --repeat 5 --out /tmp/run-a

  hpvc bench run --suite hpcc --repeat 1 --time-budget 30

  hpvc bench run --suite hpcc --hpl-n 8192 --blas system

  hpvc bench run --suite startup --targets container,vm --json
"""


def _stamp_dir() -> Path:
    return Path("bench/results") / time.strftime("run-%Y%m%d-%H%M%S", time.gmtime())


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _goal_table(results: list[bench_report.GoalResult]) -> None:
    t = Table(title="goals (computed from the samples)")
    for col in ("suite", "goal", "figure", "met"):
        t.add_column(col)
    for g in results:
        met = "n/a" if g.met is None else "yes" if g.met else "[red]no[/red]"
        t.add_row(g.suite, g.text, g.figure, met)
    console.print(t)


def _goals_json(results: list[bench_report.GoalResult]) -> list[dict[str, Any]]:
    return [
        {
            "suite": g.suite,
            "goal": g.text,
            "figure": g.figure,
            "value": _finite(g.value),
            "met": g.met,
        }
        for g in results
    ]


def run_cmd(
    ctx: typer.Context,
    suite: str = typer.Option("all", help="hpcc, isolation, io, startup or all; comma list ok."),
    targets: str = typer.Option("native,container", help="native, container, vm; comma list."),
    repeat: int = typer.Option(3, min=1, help="Repetitions of every suite."),
    out: Path | None = typer.Option(
        None, help="Where results go (default bench/results/run-TIME)."
    ),
    io_seconds: int = typer.Option(3, min=1, help="io: runtime of every fio run, in seconds."),
    startup_nodes: str = typer.Option("1,4,8", help="startup: container cluster sizes."),
    vm_nodes: str = typer.Option("1,2,4", help="startup: VM cluster sizes (with --targets vm)."),
    procs: int | None = typer.Option(
        None, min=1, help="hpcc: MPI ranks per run (default: this host's CPUs)."
    ),
    samples: int = typer.Option(3, min=1, help="isolation: hpcc samples per config visit."),
    hpl_n: int | None = typer.Option(
        None, min=1, help="hpcc: HPL's N (default: sized from the cache, memory and budget)."
    ),
    time_budget: float = typer.Option(
        60.0, min=1.0, help="hpcc: seconds one native run may take; N is capped to fit."
    ),
    blas: str = typer.Option(
        "openblas", help="hpcc: openblas (Debian's, on every side) or system (alternatives)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    suites, tgts = harness.parse_suites(suite), harness.parse_targets(targets)
    settings = harness.Settings(
        repeat=repeat,
        io_seconds=io_seconds,
        startup_nodes=harness.parse_sizes(startup_nodes, "--startup-nodes"),
        vm_nodes=harness.parse_sizes(vm_nodes, "--vm-nodes"),
        procs=procs or os.cpu_count() or 1,
        samples=samples,
        hpl_n=hpl_n,
        time_budget_s=time_budget,
        blas=harness.parse_list(blas, ("openblas", "system"), "--blas", "openblas")[0],
    )
    if hpl_n is not None and "hpcc" in suites:  # bad input: exit 2 before anything runs
        from hpvc.bench.hpcc import runner as hpcc_runner
        from hpvc.bench.hpcc import sizing as hpcc_sizing

        hpcc_sizing.check_asked(hpl_n, hpcc_runner.host_memory_mib(), settings.procs)
    plans = harness.plan_suites(suites, tgts)
    if not any(p.configs for p in plans):
        why = "; ".join(f"{p.suite}: {p.note}" for p in plans)
        raise InputError(
            f"--suite {suite} --targets {targets}",
            f"nothing to run ({why})",
            "add container to --targets",
        )
    out = out or _stamp_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(
            f"--out {out}", e.strerror or str(e), "give a writable directory"
        ) from None
    given = ctx.params | {"out": out, "procs": settings.procs}
    argv = ["hpvc", "bench", "run"]
    names = [p.name for p in ctx.command.params if p.name and p.name != "as_json"]
    argv += [f"--{k.replace('_', '-')}={given[k]}" for k in names if k in given]
    doc = harness.run(plans, settings, tgts, out, argv, _bench_progress)
    report, plots = bench_report.render(out, doc)
    if as_json:
        print_json(doc)
    else:
        _goal_table(bench_report.goal_results(doc))
        console.print(
            f"results: {out / 'results.json'}, report: {report}"
            + (f", plots: {', '.join(plots.values())}" if plots else "")
        )
    failed = harness.failed_suites(doc)
    if failed:
        name, why = next(iter(failed.items()))
        raise HpvcError(
            f"bench run: {len(failed)} suite(s) failed ({', '.join(failed)})",
            f"{name}: {why}",
            f"the other suites' results are in {out}",
        )


def _bench_progress(msg: str) -> None:
    err_console.print(msg, style="dim", markup=False, highlight=False)


REPORT_HELP = """Re-render report.md and the plots of a `hpvc bench run` from its results.json.

Measures nothing: goals, tables and plots are computed again from the
samples in DIR/results.json and written next to it.

Examples:

  hpvc bench report bench/results/run-20261122-101500

  hpvc bench report /tmp/run-a --json
"""


def report_cmd(
    directory: Path = typer.Argument(..., metavar="DIR", help="A directory of `hpvc bench run`."),
    as_json: bool = typer.Option(False, "--json", help="Print the goals and files as JSON."),
) -> None:
    doc = harness.load(directory)
    report, plots = bench_report.render(directory, doc)
    results = bench_report.goal_results(doc)
    if as_json:
        print_json(
            {
                "report": str(report),
                "plots": {k: str(directory / v) for k, v in plots.items()},
                "goals": _goals_json(results),
            }
        )
        return
    _goal_table(results)
    console.print(f"report: {report}" + (f", plots: {', '.join(plots.values())}" if plots else ""))


COMPARE_HELP = """Compare two `hpvc bench run` results: B against A, per suite, config and metric.

For every suite, config and metric measured in both runs: the medians of A
and B and B vs A, direction-aware (> 1: B is better, whether the metric is
a rate or a time; 1.0 = the same).

Examples:

  hpvc bench compare bench/results/run-a bench/results/run-b

  hpvc bench compare /tmp/run-a /tmp/run-b --json
"""


def compare_cmd(
    dir_a: Path = typer.Argument(..., metavar="DIR_A", help="The reference run (A)."),
    dir_b: Path = typer.Argument(..., metavar="DIR_B", help="The run compared with it (B)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    rows = bench_report.compare(harness.load(dir_a), harness.load(dir_b))
    if as_json:
        print_json([r | {"b_vs_a": _finite(r["b_vs_a"])} for r in rows])
        return
    t = Table(title=f"B ({dir_b}) vs A ({dir_a}); B vs A > 1: B is better")
    for col in ("suite", "config", "metric", "unit", "n A / B", "median A", "median B"):
        t.add_column(col)
    t.add_column("B vs A", justify="right")
    for r in rows:
        ratio = r["b_vs_a"]
        color = "green" if ratio > 1.02 else "red" if ratio < 0.98 else ""
        cell = f"[{color}]{ratio:.3f}[/{color}]" if color else f"{ratio:.3f}"
        t.add_row(
            r["suite"],
            r["config"],
            r["metric"],
            r["unit"],
            f"{r['n_a']} / {r['n_b']}",
            bench_report.num(r["median_a"]),
            bench_report.num(r["median_b"]),
            cell,
        )
    console.print(t)


def register(bench_app: typer.Typer) -> None:
    """Add ``run``, ``report`` and ``compare`` to ``hpvc bench``, in that order."""
    bench_app.command("run", help=RUN_HELP)(run_cmd)
    bench_app.command("report", help=REPORT_HELP)(report_cmd)
    bench_app.command("compare", help=COMPARE_HELP)(compare_cmd)

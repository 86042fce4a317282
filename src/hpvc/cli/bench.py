"""``hpvc bench``: measured claims. ``plan`` times the planner at scale,
``locality`` MPI ping-pong native vs containers, ``startup`` cluster up/down,
``io`` block-I/O throttles, weights and their overhead with fio; ``run`` runs
the suites (hpcc, isolation, io, startup) in one go, ``report`` re-renders a
run, ``compare`` puts two runs side by side."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from hpvc.bench import common, harness, io, locality, planning, startup
from hpvc.bench import report as bench_report
from hpvc.bench import slurm as slurm_bench
from hpvc.cli.common import console, err_console, print_json
from hpvc.errors import HpvcError, InputError

bench_app = typer.Typer(
    help="Benchmarks that back hpvc's claims; each writes results.json and report.md.",
    no_args_is_help=True,
)

PLAN_HELP = """Time the planner on a big inventory (default 1,000 hosts, 10,000 nodes).

Hosts replicate the topology snapshots found in --topologies (tarballs from
hwloc-gather-topology or extracted roots). Runs pinned to one CPU; the goal
is under 10 s per plan.

Examples:

  hpvc bench plan

  hpvc bench plan --hosts 100 --nodes 1000 --repeat 3 --out /tmp/planbench --json
"""


def _default_topologies() -> Path:
    env = os.environ.get("HPVC_TOPOLOGIES")
    candidates = [Path(env)] if env else []
    repo = Path(__file__).resolve().parents[3]
    candidates += [repo.parent / "shared" / "topologies", Path.cwd().parent / "shared/topologies"]
    for c in candidates:
        if c.is_dir():
            return c
    raise InputError(
        "bench plan",
        "no topology snapshots found",
        "give --topologies DIR (hwloc-gather-topology tarballs or extracted roots)",
    )


@bench_app.command("plan", help=PLAN_HELP)
def plan_cmd(
    hosts: int = typer.Option(1000, min=1, help="Hosts in the inventory."),
    nodes: int = typer.Option(10000, min=2, help="Virtual nodes in the cluster."),
    repeat: int = typer.Option(5, min=1, help="Runs per scenario."),
    topologies: Path | None = typer.Option(None, help="Directory of topology snapshots."),
    out: Path = typer.Option(Path("bench/results/plan"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    source = topologies or _default_topologies()
    if not source.is_dir():
        raise InputError(str(source), "not a directory", "give --topologies DIR")
    doc = planning.run(
        source, hosts, nodes, repeat, progress=lambda m: err_console.print(f"[dim]{m}[/dim]")
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "report.md").write_text(planning.report_md(doc))
    if as_json:
        print_json(doc)
        return
    t = Table(title=f"plan {nodes:,} nodes on {hosts:,} hosts, one CPU, {repeat} runs")
    for col in ("scenario", "hosts used", "min s", "median s", "max s", "goal s"):
        t.add_column(col)
    for s in doc["scenarios"]:
        w = s["wall"]
        t.add_row(
            s["name"],
            str(s["hosts_used"]),
            f"{w['min']:.3f}",
            f"{w['median']:.3f}",
            f"{w['max']:.3f}",
            f"{s['goal_s']:.0f}",
        )
    console.print(t)
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


LOCALITY_HELP = """MPI ping-pong between two processes: native vs containers (needs root).

Three configurations in one run, alternated every repetition: two processes
on the host; two co-resident containers (locality "shm": shared memory
between them); two isolated containers (locality "none": TCP over the
bridge). Reports latency (4 B, 1 KiB) and bandwidth (1 MiB, 4 MiB) with
min/median/max, and per-repetition ratios to native (higher is better,
1.0 = as fast as native). Goal: shm within 10% of native (ratio >= 0.90).
Clusters live in a temporary state directory and are torn down at the end.

Examples:

  hpvc bench locality

  hpvc bench locality --repeat 10 --out /tmp/locality --json
"""

STARTUP_HELP = """Time `hpvc up` and `hpvc down` of container clusters (needs root).

Each size N is one head + N-1 compute nodes, 1 vCPU (shared), 128 MiB, no
hugepages, locality "shm"; the image is built first if it is missing. Every
repetition brings each size up and down in turn. Goal: 8 nodes up in under
2 s (median). Clusters live in a temporary state directory.

Examples:

  hpvc bench startup

  hpvc bench startup --nodes 1,2,16 --repeat 3 --out /tmp/startup --json
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def _sizes(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--nodes {text}", "not a list of numbers", "--nodes 1,4,8") from None


def _written(out: Path, doc: dict[str, Any], report: str, as_json: bool) -> bool:
    """Write results.json and report.md; with --json also print the results (True)."""
    common.write_results(out, doc, report)
    if as_json:
        print_json(doc)
    return as_json


@bench_app.command("locality", help=LOCALITY_HELP)
def locality_cmd(
    repeat: int = typer.Option(5, min=1, help="Repetitions (each runs all three configs)."),
    out: Path = typer.Option(Path("bench/results/locality"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    doc = locality.run(repeat, progress=_progress)
    if _written(out, doc, locality.report_md(doc), as_json):
        return
    t = Table(title=f"MPI ping-pong, {repeat} repetitions; ratio: 1.0 = native, higher is better")
    for col in ("metric", "config", "min", "median", "max", "ratio min/median/max"):
        t.add_column(col)
    for m in locality.METRICS:
        for c, cfg in doc["configs"].items():
            v = cfg["metrics"][m.key]
            r = doc["ratios"].get(c, {}).get(m.key)
            ratio = f"{r['min']:.2f} / {r['median']:.2f} / {r['max']:.2f}" if r else "(ref)"
            t.add_row(
                f"{m.key} ({m.unit})",
                c,
                *(locality.fmt(v[k], m) for k in ("min", "median", "max")),
                ratio,
            )
    console.print(t)
    verdict = "met" if doc["meets_goal"] else "NOT met"
    console.print(f"goal (shm median ratio >= {locality.GOAL_RATIO:.2f}): {verdict}")
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


SLURM_HELP = """Launch latency of `srun --hpvc` against plain `srun` (needs root, Slurm).

Starts a private local Slurm cluster (3 slurmd on this machine, own ports,
the SPANK plugin of native/spank) and measures, alternated every repetition:
`srun -N1 true` and `srun -N3 true` as new jobs with and without --hpvc (the
virtual nodes come up inside the measured srun), and four `srun -N3 true`
steps in one `salloc -N3` allocation with and without --hpvc (the first step
is the time to a usable virtual cluster, the later ones what every further
step costs). About 1 minute for 5 repetitions.

Examples:

  hpvc bench slurm

  hpvc bench slurm --repeat 10 --out /tmp/slurmbench --json
"""


@bench_app.command("slurm", help=SLURM_HELP)
def slurm_cmd(
    repeat: int = typer.Option(5, min=1, help="Repetitions."),
    out: Path = typer.Option(Path("bench/results/slurm"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    doc = slurm_bench.run(repeat, progress=_progress)
    if _written(out, doc, slurm_bench.report_md(doc), as_json):
        return
    t = Table(title=f"srun --hpvc vs plain srun, {repeat} repetitions (seconds)")
    for col in ("what", "plain min/median/max", "--hpvc min/median/max", "added (median)"):
        t.add_column(col)
    for row in doc["table"]:
        p, h = row["plain"], row["hpvc"]
        t.add_row(
            row["describe"],
            f"{p['min']:.3f} / {p['median']:.3f} / {p['max']:.3f}",
            f"{h['min']:.3f} / {h['median']:.3f} / {h['max']:.3f}",
            f"{row['added_median_s']:+.3f}",
        )
    console.print(t)
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


@bench_app.command("startup", help=STARTUP_HELP)
def startup_cmd(
    nodes: str | None = typer.Option(
        None, help="Cluster sizes, comma-separated (default 1,4,8; VMs 1,2,4)."
    ),
    repeat: int = typer.Option(5, min=1, help="Up/down cycles per size."),
    kind: str = typer.Option("container", help="container or vm."),
    out: Path | None = typer.Option(
        None, help="Where results go (default bench/results/startup[-vm])."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    if kind not in ("container", "vm"):
        raise InputError("--kind", f"{kind!r} is not container or vm", "--kind vm")
    sizes = _sizes(nodes or ("1,2,4" if kind == "vm" else "1,4,8"))
    out = out or Path("bench/results/startup" + ("-vm" if kind == "vm" else ""))
    doc = startup.run(sizes, repeat, progress=_progress, kind=kind)
    if _written(out, doc, startup.report_md(doc), as_json):
        return
    t = Table(title=f"hpvc up / down, {doc['shape']}, {repeat} repetitions")
    for col in ("nodes", "up min s", "up median s", "up max s", "down min s", "down median s"):
        t.add_column(col)
    t.add_column("down max s")
    for s in doc["sizes"]:
        u, d = s["up"], s["down"]
        t.add_row(
            str(s["nodes"]), *(f"{x[k]:.3f}" for x in (u, d) for k in ("min", "median", "max"))
        )
    console.print(t)
    for s in doc["sizes"]:
        if "meets_goal" in s:
            verdict = "met" if s["meets_goal"] else "NOT met"
            console.print(f"goal ({s['nodes']} nodes up, median < {s['goal_s']:g} s): {verdict}")
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


IO_HELP = """Block-I/O limits of container nodes, measured with fio (needs root, fio).

Makes a 2 GiB loop device (ext4) as a throw-away state directory and brings
up one container cluster on it. fio (direct I/O, psync) then measures, in
every repetition and in a rotating order: throttle accuracy (read 10 MB/s,
write 5 MB/s, and 20 MB/s: measured vs target, goal within 5%); the split
between two nodes with bfq weights 100 and 900 reading at once (sequential
256 KiB and random 4 KiB, target 1:9); and the overhead of limits that do
not bite (a node without limits and one throttled at 10 GB/s vs fio on the
host, same file system), as ratios with min/median/max. Everything made is
undone at the end: cluster, mount, loop device.

Examples:

  hpvc bench io

  hpvc bench io --repeat 5 --seconds 10 --out /tmp/io --json
"""


@bench_app.command("io", help=IO_HELP)
def io_cmd(
    repeat: int = typer.Option(3, min=1, help="Repetitions (each runs all three parts)."),
    seconds: int = typer.Option(5, min=1, help="Runtime of every fio run, in seconds."),
    out: Path = typer.Option(Path("bench/results/io"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    doc = io.run(repeat, seconds, progress=_progress)
    if _written(out, doc, io.report_md(doc), as_json):
        return
    t = Table(title=f"block I/O, fio {seconds} s runs, {repeat} repetitions (medians)")
    for col in ("part", "what", "target", "measured", "min / max"):
        t.add_column(col)
    for r in io.summary_rows(doc):
        t.add_row(*r)
    console.print(t)
    verdict = "met" if doc["meets_goal"] else "NOT met"
    console.print(f"goal (throttles within {io.GOAL_ERROR_PCT:g}% of target): {verdict}")
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


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

Time on a 2-CPU machine with the defaults (all suites, native,container,
--repeat 3): about 15 minutes: hpcc ~8 (5 configs x 3 runs of ~25 s, plus
bringing up 4 clusters), isolation ~4 (3 configs x 3 visits x 3 hpcc
samples), io ~2.5 (36 fio runs of 3 s), startup under 1. vm adds VM
start-up (~1.5 min) and hpcc in a VM (a smaller problem under TCG).
results.json records each suite's wall time.

Examples:

  hpvc bench run

  hpvc bench run --suite hpcc,io --repeat 5 --out /tmp/run-a

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


@bench_app.command("run", help=RUN_HELP)
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
    )
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


@bench_app.command("report", help=REPORT_HELP)
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


@bench_app.command("compare", help=COMPARE_HELP)
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


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")

"""``hpvc bench``: measured claims. ``plan`` times the planner at scale,
``locality`` MPI ping-pong native vs containers, ``startup`` cluster up/down,
``io`` block-I/O throttles, weights and their overhead with fio, ``network``
the cluster network across hosts against the fabric; ``run``,
``report`` and ``compare`` (the suites in one go, and their results) are in
``hpvc.cli.bench_run``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from hpvc.bench import common
from hpvc.bench.io import jobs as io_jobs
from hpvc.bench.io import report as io_report
from hpvc.bench.io import runner as io
from hpvc.bench.locality import runner as locality
from hpvc.bench.planning import runner as planning
from hpvc.bench.slurm import runner as slurm_bench
from hpvc.bench.startup import podman
from hpvc.bench.startup import runner as startup
from hpvc.cli import (
    bench_checkpoint,
    bench_coordinator,
    bench_images,
    bench_migrate,
    bench_network,
    bench_pmix,
    bench_run,
    bench_scale,
    bench_spark,
)
from hpvc.cli.common import console, err_console, print_json
from hpvc.errors import InputError

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
    candidates += [repo / "tests" / "data" / "topologies", repo.parent / "shared" / "topologies"]
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

--mpi mpich measures MPICH instead of Open MPI: mpiexec.mpich on the host,
an image of Debian's mpich package in the nodes (built first if missing).

--kind vm measures two co-resident VM guests instead (docs/vms.md): hpvc run's
choice (UCX over their ivshmem region) against TCP between the same guests and
two processes on the host, every size from 4 B to 4 MiB, ratios to TCP; under
TCG (no KVM) the figures are emulation's and say so. Default --repeat 3.

Examples:

  hpvc bench locality

  hpvc bench locality --kind vm --out docs/results/locality-vm-DATE

  hpvc bench locality --repeat 10 --out /tmp/locality --json

  hpvc bench locality --mpi mpich --out /tmp/locality-mpich
"""

STARTUP_HELP = """Time `hpvc up` and `hpvc down` of container clusters (needs root).

Each size N is one head + N-1 compute nodes, 1 vCPU (shared), 128 MiB, no
hugepages, locality "shm"; the image is built first if it is missing. Every
repetition brings each size up and down in turn. Goal: 8 nodes up in under
2 s (median). Clusters live in a temporary state directory.

With --peer (the default for containers) every repetition also starts N
Podman containers (crun, the hpc image imported from hpvc's rootfs, the same
limits, an internal bridge network made for the run) in parallel and one by
one, and removes them, alternated with hpvc; results get hpvc/Podman ratios
of the same repetition. Podman missing skips that side, unless
HPVC_REQUIRE_ALL=1. Image, network and containers are removed at the end.

Examples:

  hpvc bench startup

  hpvc bench startup --nodes 1,2,16 --repeat 3 --out /tmp/startup --json

  hpvc bench startup --nodes 8 --no-peer
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
    repeat: int | None = typer.Option(
        None, min=1, help="Repetitions, each runs all three configs (default 5; --kind vm 3)."
    ),
    out: Path = typer.Option(Path("bench/results/locality"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
    mpi: str = typer.Option("openmpi", help="The MPI measured: openmpi or mpich."),
    kind: str = typer.Option("container", help="Nodes measured: container or vm."),
) -> None:
    if mpi not in locality.MPIS:
        raise InputError(f"--mpi {mpi}", "is not an MPI measured here", "--mpi openmpi or mpich")
    if kind not in ("container", "vm"):
        raise InputError(f"--kind {kind}", "is not a kind of node", "--kind container or vm")
    if kind == "vm":
        _locality_vm(repeat or 3, out, as_json, mpi)
        return
    repeat = repeat or 5
    doc = locality.run(repeat, progress=_progress, mpi=mpi)
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


def _locality_vm(repeat: int, out: Path, as_json: bool, mpi: str) -> None:
    """``--kind vm``: two co-resident guests (``hpvc.bench.locality.vm``), Open MPI."""
    from hpvc.bench.locality import vm

    if mpi != "openmpi":
        raise InputError(f"--mpi {mpi} --kind vm", "is not measured", "--mpi openmpi")
    doc = vm.run(repeat, progress=_progress)
    if _written(out, doc, vm.report_md(doc), as_json):
        return
    console.print(vm.report_md(doc))
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


RESIDENT_HELP = "hpvc commands through a resident hpvc (hpvc serve) started for the run."

SLURM_HELP = """Launch latency of `srun --hpvc` against plain `srun` (needs root, Slurm).

Starts a private local Slurm cluster (3 slurmd on this machine, own ports,
the SPANK plugin of native/spank) and measures, alternated every repetition:
`srun -N1` and `srun -N3` of one short task per host as new jobs with and
without --hpvc (the virtual nodes come up inside the measured srun), and four
such `srun -N3` steps in one `salloc -N3` allocation with and without --hpvc
(the first step is the time to a usable virtual cluster, the later ones what
every further step costs). The steps that bring nodes up are broken down into
phases (the check in srun, `hpvc node up` on the slowest host and its own
phases, Slurm's rest). Every job is submitted by an ordinary user (--user,
default nobody), as on a site. About 2 minutes for 5 repetitions.

With --kind vm the nodes are two VMs (the site allows kinds=container,vm):
`srun -N1` boots both on one host, `srun -N2` one on each, and the steps in a
`salloc -N2` allocation run in the running guests through their agents; the
phases then show QEMU's start and the guests' boot. The accelerator (KVM, or
TCG where KVM cannot run) is in the report.

Examples:

  hpvc bench slurm

  hpvc bench slurm --kind vm --repeat 5 --out bench/results/slurm-vm

  hpvc bench slurm --repeat 10 --user alice --out /tmp/slurmbench --json
"""


@bench_app.command("slurm", help=SLURM_HELP)
def slurm_cmd(
    repeat: int = typer.Option(5, min=1, help="Repetitions."),
    out: Path = typer.Option(Path("bench/results/slurm"), help="Where results go."),
    user: str = typer.Option("nobody", help="The ordinary user who submits the jobs."),
    resident: bool = typer.Option(True, "--resident/--no-resident", help=RESIDENT_HELP),
    kind: str = typer.Option("container", help="Node kind: container or vm."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    doc = slurm_bench.run(repeat, progress=_progress, user=user, resident=resident, kind=kind)
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
    peer: bool = typer.Option(
        True,
        "--peer/--no-peer",
        help="Also start and remove as many Podman containers, alternated (containers only).",
    ),
    resident: bool = typer.Option(False, "--resident/--no-resident", help=RESIDENT_HELP),
    out: Path | None = typer.Option(
        None, help="Where results go (default bench/results/startup[-vm])."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    if kind not in ("container", "vm"):
        raise InputError("--kind", f"{kind!r} is not container or vm", "--kind vm")
    sizes = _sizes(nodes or ("1,2,4" if kind == "vm" else "1,4,8"))
    out = out or Path("bench/results/startup" + ("-vm" if kind == "vm" else ""))
    peer = peer and kind == "container"
    skipped = peer and not podman.available() and os.environ.get("HPVC_REQUIRE_ALL") != "1"
    if skipped:
        _progress("podman not found (apt-get install podman): the Podman side is skipped")
    doc = startup.run(
        sizes, repeat, progress=_progress, kind=kind, peer=peer and not skipped, resident=resident
    )
    if skipped:
        doc["peer"] = {"skipped": "podman not found (apt-get install podman)"}
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
    for s in doc["sizes"]:
        for name, r in s.get("peer", {}).get("ratios", {}).items():
            console.print(f"{s['nodes']} nodes, hpvc/podman {name}: median {r['median']:.2f}")
        for goal, met in s.get("peer", {}).get("goals", {}).items():
            console.print(f"goal ({s['nodes']} nodes, {goal}): {'met' if met else 'NOT met'}")
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
    if _written(out, doc, io_report.report_md(doc), as_json):
        return
    t = Table(title=f"block I/O, fio {seconds} s runs, {repeat} repetitions (medians)")
    for col in ("part", "what", "target", "measured", "min / max"):
        t.add_column(col)
    for r in io_report.summary_rows(doc):
        t.add_row(*r)
    console.print(t)
    verdict = "met" if doc["meets_goal"] else "NOT met"
    console.print(f"goal (throttles within {io_jobs.GOAL_ERROR_PCT:g}% of target): {verdict}")
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


def register(app: typer.Typer) -> None:
    for sub in (bench_run, bench_spark, bench_coordinator, bench_network, bench_images):
        sub.register(bench_app)
    for sub in (bench_pmix, bench_scale, bench_checkpoint, bench_migrate):
        sub.register(bench_app)
    app.add_typer(bench_app, name="bench")

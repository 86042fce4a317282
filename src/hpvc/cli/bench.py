"""``hpvc bench``: measured claims. ``plan`` times the planner at scale."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.table import Table

from hpvc.bench import planning
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


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")

"""``hpvc bench checkpoint``: checkpoint and restore of whole clusters (issue 28)."""

from __future__ import annotations

from pathlib import Path

import typer

from hpvc.cli.common import err_console, show_results
from hpvc.errors import InputError
from hpvc.units import parse_size

CHECKPOINT_HELP = """Checkpoint and restore time and size of clusters (root; QEMU, CRIU, Podman).

Per kind and size (--nodes x --memory), one cluster of the `hpc` image whose
job holds --fill of each node's memory and runs a TCP ping-pong between two
nodes; per repetition, methods alternated: hpvc's checkpoint (every node
frozen, saved, all thawed), `down` and restore of it; against, for VMs,
pcocc's method (each node paused, saved and resumed in turn) and, for
containers, Podman's checkpoint and restore (runc with CRIU) of as many
containers of the same image. Reports checkpoint time, the time the job is
paused, the longest pause of one node, size, restore time and whether the
job went on, min / median / max. The fill is sized down where the host's
memory cannot hold it (said in the report). --locality shm: hpvc's container
nodes share the cluster's PID and IPC namespaces and /dev/shm (the default of
container clusters; the figures before 2026-11-28 are "none").

Writes results.json and report.md into --out.

Examples:

  hpvc bench checkpoint --nodes 2,4 --memory 1GiB,4GiB --reps 3

  hpvc bench checkpoint --kind container --nodes 2 --memory 1GiB --reps 1

  hpvc bench checkpoint --kind container --locality shm --nodes 2,4 --memory 1GiB
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def parse_counts(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--nodes {text}", "not a comma-separated list of numbers",
                         "--nodes 2,4") from None  # fmt: skip


def parse_memories(text: str) -> list[int]:
    """Sizes per node in MiB ("1GiB,4GiB" -> [1024, 4096])."""
    try:
        return [parse_size(x.strip()) >> 20 for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise InputError(f"--memory {text}", str(e), "--memory 1GiB,4GiB") from None


def checkpoint_cmd(
    nodes: str = typer.Option("2,4", help="Cluster sizes in nodes, comma-separated (2 to 8)."),
    memory: str = typer.Option("1GiB,4GiB", help="Memory per node, comma-separated."),
    reps: int = typer.Option(3, help="Repetitions of each method per size."),
    fill: float = typer.Option(0.5, help="Fraction of each node's memory the job holds."),
    kind: str = typer.Option("vm,container", help="vm, container or both, comma-separated."),
    locality: str = typer.Option("none", help="none, or shm: nodes sharing memory."),
    out: Path = typer.Option(Path("bench/results/checkpoint"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
) -> None:
    from hpvc.bench.checkpoint import report, runner

    sizes, memories = parse_counts(nodes), parse_memories(memory)
    kinds = [k.strip() for k in kind.split(",") if k.strip()]
    runner.preflight(kinds, sizes, memories, reps, fill, locality)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "results.partial.json"
    doc = runner.run(kinds, sizes, memories, reps, fill, _progress, partial, locality)
    show_results(out, doc, report.report_md(doc), as_json)


def register(app: typer.Typer) -> None:
    app.command("checkpoint", help=CHECKPOINT_HELP)(checkpoint_cmd)

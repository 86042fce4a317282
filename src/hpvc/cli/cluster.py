"""``hpvc up | ls | status | exec | run | scale | down``: running clusters.

``hpvc jobs``, which follows what ``run --detach`` started, is hpvc.cli.jobs.
"""

from __future__ import annotations

import time
from typing import Any

import typer

from hpvc.cli.common import console, err_console, print_json
from hpvc.cli.listings import image_text as image_text
from hpvc.cli.listings import show_clusters
from hpvc.cli.status_view import show_status
from hpvc.errors import HpvcError, InputError, SpecError, require_root

# Each command imports what it uses when it runs (issue 16: `hpvc ls` reads
# records only; `up` and `status` load the planner, backends and rich tables).

UP_HELP = """Bring a cluster up on this host: plan, then start every node.

Checks the spec, the image and the host first and changes nothing if any is
wrong (exit 2). Any failure half-way undoes what was done; `hpvc down NAME`
cleans up after a crash.

Examples:

  hpvc image build hpc && hpvc up examples/demo.toml

  hpvc up examples/vm-cluster.toml        (VMs: KVM where usable, TCG otherwise)

  hpvc up examples/small.toml --json

  hpvc up examples/small.toml --quiet      (one line, nothing read back)
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def refuse_reserved_name(spec_path: str, name: str) -> None:
    """A user's cluster may not take a name of the shape Slurm's shares have
    (``j<job>-<index>``, hpvc.slurm.policy): ``hpvc node down`` of that job
    would take it down, and the job's share could not come up."""
    from hpvc.slurm.policy import parse_share_name

    if parse_share_name(name) is not None:
        raise SpecError(
            spec_path,
            "name",
            f"{name!r} has the shape of a Slurm job's share (j<job>-<index>), kept for them",
            "give the cluster another name",
        )


def up_cmd(
    spec: str = typer.Argument(..., help="Cluster spec (TOML)."),
    as_json: bool = typer.Option(False, "--json", help="Print the cluster's status as JSON."),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="No progress and no status read back from the kernel: one line (with --json,"
        " the planned nodes and the phases).",
    ),
) -> None:
    from pathlib import Path

    from hpvc.cluster import lifecycle, ops
    from hpvc.spec import read_spec

    t0 = time.perf_counter()
    parsed, doc = read_spec(spec)  # the file is read once, here
    refuse_reserved_name(spec, parsed.name)
    where = str(Path(spec).resolve())
    if quiet:
        rec = lifecycle.up_spec(parsed, doc, where)
        took = time.perf_counter() - t0
        if as_json:
            print_json(_planned(rec, took))
        else:
            console.print(
                f"cluster {rec.name} up: {len(rec.the_plan().nodes)} nodes in {took:.2f} s"
            )
        return
    with err_console.status("bringing the cluster up"):
        rec = lifecycle.up_spec(parsed, doc, where, progress=_progress)
    if as_json:
        print_json(ops.status(rec.name))
        return
    console.print(f"cluster {rec.name} up in {time.perf_counter() - t0:.2f} s")
    show_status(ops.status(rec.name))


def _planned(rec: Any, seconds: float) -> dict[str, Any]:
    """What ``up --quiet --json`` prints: the record's view, no kernel reads."""
    plan = rec.the_plan()
    return {
        "cluster": rec.name,
        "status": rec.status,
        "seconds": seconds,
        "phases": rec.phases,
        "subnet": plan.network.subnet,
        "nodes": [
            {"name": n.name, "role": n.role, "ip": n.ip, "cpus": list(n.cpuset)} for n in plan.nodes
        ],
    }


def status_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    as_json: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Nodes, states, IPs, CPUs and limits, read back from the kernel.

    Example: hpvc status small --json
    """
    from hpvc.cli.status_view import run_status

    run_status(name, as_json)


def ls_cmd(as_json: bool = typer.Option(False, "--json", help="JSON output.")) -> None:
    """List the clusters on this host.

    Example: hpvc ls --json
    """
    show_clusters(as_json)


def exec_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    node: str = typer.Argument(..., help="Node name, e.g. compute0."),
    cmd: list[str] = typer.Argument(None, help="Command to run (after --)."),
    interactive: bool = typer.Option(
        False, "-i", "--interactive", help="Keep stdin open (it always is; as docker exec -i)."
    ),
    tty: bool = typer.Option(
        False, "-t", "--tty", help="Give the command a terminal in the node (stdin must be one)."
    ),
) -> None:
    """Run a command inside one node.

    Example: hpvc exec small compute0 -- ip -br addr; hpvc exec -it small compute0 -- bash
    """
    from hpvc.cluster import ops

    raise typer.Exit(ops.exec_node(name, node, list(cmd or []), tty=tty))


def console_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    node: str = typer.Argument(..., help="Node name, e.g. compute0."),
) -> None:
    """Open an interactive login shell in one node (hpvc exec -it with root's shell).

    Example: hpvc console small compute0
    """
    from hpvc.cluster import ops

    raise typer.Exit(ops.console(name, node))


def run_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    cmd: list[str] = typer.Argument(None, help="Program and arguments (after --)."),
    n: int | None = typer.Option(None, "-n", help="Ranks (default: one per vCPU)."),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Say which transport each pair of nodes' ranks uses."
    ),
    detach: bool = typer.Option(
        False,
        "--detach",
        "-d",
        help="Run the image's launcher in the first MPI node, in the background, and"
        " return: the job can be checkpointed with the cluster (hpvc jobs follows it).",
    ),
    as_json: bool = typer.Option(False, "--json", help="With --detach: the job as JSON."),
) -> None:
    """Launch an MPI job over the cluster's compute nodes, one rank per vCPU.

    A cluster without compute nodes runs it on the nodes it has (the head's
    included), and says so on stderr. VM guests on one host talk through their
    shared ivshmem region (UCX) where their image has hpvc's module; --verbose
    says so per pair of nodes, and has each rank's UCX name its transports.

    With --detach the image's own mpirun or mpiexec runs inside the first MPI
    node (in /shared when the nodes have it, else in root's home) and reaches
    the other nodes through their hpvc-agent; its output goes to a file in that
    node. `hpvc jobs NAME` lists such jobs, `hpvc jobs NAME ID --wait` waits for
    one and prints its output. Nothing stays attached, so `hpvc checkpoint`
    cuts the running job with the cluster (docs/checkpoint.md).

    Examples:

      hpvc run small -n 2 -- hostname

      hpvc run small --detach -- ./pingpong 1000     (prints the job's number)

      hpvc jobs small 1 --wait
    """
    from hpvc.cluster import ops

    if as_json and not detach:
        raise InputError("hpvc run --json", "is for --detach", "add --detach, or drop --json")
    if detach:
        job = ops.run_detached(name, list(cmd or []), n, progress=_progress, verbose=verbose)
        if as_json:
            print_json({"cluster": name, **job.to_json()})
        else:
            console.print(f"job {job.job} started in {job.node}: hpvc jobs {name} {job.job} --wait")
        return
    rc = ops.run(name, list(cmd or []), n, progress=_progress, verbose=verbose)
    raise typer.Exit(rc if isinstance(rc, int) else rc.returncode)


def scale_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    counts: list[str] = typer.Argument(..., help="ROLE=COUNT, e.g. compute=4."),
) -> None:
    """Add or remove nodes while the cluster runs.

    Example: hpvc scale small compute=3
    """
    from hpvc.cluster import lifecycle, ops

    require_root("hpvc scale")
    changes: dict[str, int] = {}
    for c in counts:
        role, _, num = c.partition("=")
        if not num.isdigit():
            raise InputError(f"scale {c!r}", "not ROLE=COUNT", "e.g. compute=4")
        changes[role] = int(num)
    lifecycle.scale(name, changes, progress=_progress)
    show_status(ops.status(name))


def down_cmd(name: str = typer.Argument(..., help="Cluster name.")) -> None:
    """Stop the cluster and remove everything it made on this host.

    Example: hpvc down small
    """
    from hpvc.cluster import teardown  # not the planner: down reads journals only

    require_root("hpvc down")
    t0 = time.perf_counter()
    teardown.down(name, progress=lambda m: None, on_wait=_progress)
    console.print(f"cluster {name} down in {time.perf_counter() - t0:.2f} s")


def gc_cmd(
    prefix: str = typer.Option("", help="Only clusters whose names start with this."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List, remove nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print what was found as JSON."),
) -> None:
    """Remove what hpvc left on this host that no cluster here owns any more.

    Containers, network namespaces, bridges, veths and taps, cgroups, QEMU
    processes, NFS server processes (Ganesha, rpcbind), libvirt domains and
    mounts named by hpvc for a cluster that has
    no record in the state directory (e.g. after the state directory was
    deleted by hand); without --prefix, also the image store's interrupted
    imports. Running clusters and running imports are never touched.

    Examples:

      hpvc gc --dry-run

      hpvc gc --prefix test --json
    """
    from hpvc.cluster import gc

    found, errors = gc.sweep(prefix=prefix, dry_run=dry_run, progress=_progress)
    if as_json:
        print_json(
            {
                "removed": [] if dry_run else [vars(o) for o in found],
                "found": [vars(o) for o in found],
                "errors": errors,
            }
        )
    else:
        verb = "would remove" if dry_run else "removed"
        for o in found:
            console.print(f"{verb} {o.kind} {o.name} {o.detail}".rstrip())
        console.print(f"{len(found)} orphan(s){' found' if dry_run else ''}")
    if errors:
        raise HpvcError("gc", f"{len(errors)} could not be removed, first: {errors[0]}", "")


def register(app: typer.Typer) -> None:
    app.command("gc")(gc_cmd)
    app.command("up", help=UP_HELP)(up_cmd)
    app.command("ls")(ls_cmd)
    app.command("status")(status_cmd)
    app.command("exec")(exec_cmd)
    app.command("console")(console_cmd)
    app.command("run")(run_cmd)
    app.command("scale")(scale_cmd)
    app.command("down")(down_cmd)

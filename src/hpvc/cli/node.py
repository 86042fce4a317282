"""``hpvc node``: one host's share of a Slurm job's virtual cluster.

The SPANK plugin (native/spank, docs/slurm.md) calls these; an administrator
can call them by hand to look at or clean up a job's nodes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hpvc.cli.common import console, err_console, print_json
from hpvc.errors import InputError
from hpvc.progress import quiet

if TYPE_CHECKING:
    from hpvc.slurm import policy

# hpvc.slurm.node (host changes: cgroups, netlink, crun) is imported by the
# commands that need it: `hpvc node check` runs in every srun and sbatch and
# must start fast.

node_app = typer.Typer(
    help="Node-level commands for Slurm jobs (called by the hpvc SPANK plugin).",
    no_args_is_help=True,
)

SITE_HELP = (
    "Site rule key=value (images=a,b | kinds=container | subnets=CIDR,... |"
    " user_subnets=yes|no | io_weight=yes|no | binds=DIR,...); repeatable."
)


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def _site(items: list[str] | None) -> policy.Site:
    from hpvc.slurm import policy

    return policy.Site.parse(items or [])


CHECK_HELP = """Check a spec against the site's rules; print it encoded for the job.

A second line, `mem N1 N2 ...`, gives the MiB the biggest host share needs
in a job of 1, 2, ... hosts: the plugin holds the job's memory to it.

Run by the plugin as the submitting user in srun/sbatch/salloc, so a bad spec
stops the job before it is queued.

Examples:

  hpvc node check examples/slurm.toml

  hpvc node check examples/slurm.toml --site images=hpc --site subnets=10.88.0.0/16

  hpvc node check examples/slurm.toml --hosts 2 --mem-mib 1024   # fits the allocation?
"""


@node_app.command("check", help=CHECK_HELP)
def check_cmd(
    spec: Path = typer.Argument(
        ..., readable=False, help="The cluster spec (TOML)."
    ),  # unreadable: one line from check_spec, not a usage box
    site: list[str] = typer.Option(None, "--site", help=SITE_HELP),
    hosts: int = typer.Option(0, min=0, help="The job's node count, once it is known."),
    mem_mib: int = typer.Option(
        0, "--mem-mib", min=0, help="The job's memory per host in MiB (0: not allocated)."
    ),
) -> None:
    from hpvc.slurm import policy

    encoded, parsed = policy.check_spec(spec, _site(site), hosts, mem_mib)
    print(encoded)
    print("mem " + " ".join(map(str, policy.memory_row(parsed))))


UP_HELP = """Bring this host's share of a job's virtual cluster up (idempotent).

The spec comes from $HPVC_SPEC_B64 (set by the plugin at submit time) or
--spec. Prints, for each local task, how it joins its node:

  node <local id> <pid> <start time> <namespaces> <node>
  cgroup <local id> <cgroup.procs file>
  env <local id> KEY=VALUE

Examples:

  hpvc node up --job 42 --index 0 --hosts 2 --spec examples/slurm.toml

  HPVC_SPEC_B64=... hpvc node up --job 42 --index 1 --hosts 2 --mpi pmix --nodelist 'n[1-2]'
"""


@node_app.command("up", help=UP_HELP)
def up_cmd(
    job: int = typer.Option(..., min=1, help="Slurm job id."),
    index: int = typer.Option(..., min=0, help="This host's place in the job's node list."),
    hosts: int = typer.Option(..., min=1, help="The job's node count."),
    cpus: str = typer.Option("", help="The job's CPUs on this host (e.g. 0-3); default all."),
    mpi: str = typer.Option("", help="The step's MPI plugin (SLURM_MPI_TYPE)."),
    nodelist: str = typer.Option(
        "", help="The job's hosts, as Slurm writes them (SLURM_JOB_NODELIST)."
    ),
    mem_mib: int = typer.Option(
        0, "--mem-mib", min=0, help="The job's memory on this host in MiB (S_JOB_ALLOC_MEM)."
    ),
    uid: int = typer.Option(-1, min=-1, help="The job's user (S_JOB_UID); -1: not known."),
    gid: int = typer.Option(-1, min=-1, help="The job's group (S_JOB_GID)."),
    spec: Path | None = typer.Option(
        None, readable=False, help="Spec file (default: $HPVC_SPEC_B64)."
    ),
    site: list[str] = typer.Option(None, "--site", help=SITE_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Progress on stderr."),
    restarts: int = typer.Option(0, min=0, help="Slurm's restart count (a requeued job: > 0)."),
    checkpoint_every: int = typer.Option(
        0, "--checkpoint-every", min=0, help="Seconds between checkpoints (--hpvc-checkpoint)."
    ),
) -> None:
    from hpvc.cli import STARTED  # now: a resident hpvc's fork sets it anew
    from hpvc.slurm import node, policy
    from hpvc.store import Store

    if os.geteuid() != 0:
        raise InputError("hpvc node up", "needs root", "it is run by the SPANK plugin as root")
    if spec is not None:
        try:
            text = spec.read_text()
        except OSError as e:
            raise InputError(f"--spec {spec}", e.strerror or str(e), "give a spec file") from None
    else:
        value = os.environ.get(policy.SPEC_ENV)
        if not value:
            raise InputError(
                "hpvc node up", f"no spec: ${policy.SPEC_ENV} is not set", "give --spec FILE"
            )
        text = policy.decode_spec(value)
    req = node.Request(
        job=job,
        index=index,
        hosts=hosts,
        cpus=cpus,
        mpi=mpi,
        nodelist=nodelist,
        mem_mib=mem_mib,
        uid=uid,
        gid=gid,
        restarts=restarts,
        checkpoint_every=checkpoint_every,
    )
    from hpvc.slurm.checkpoint_timer import check_every

    check_every(checkpoint_every, _site(site))  # before anything changes
    began = time.perf_counter()
    joins = node.up(req, text, _site(site), progress=_progress if verbose else quiet)
    times = node.up_times(Store(), req, began - STARTED, time.perf_counter() - began)
    for j in joins:
        for line in j.lines():
            print(line)
        print(f"env {j.slot} HPVC_UP_TIMES={times}")  # not in the join cache


DOWN_HELP = """Take every share of a job on this host down (idempotent).

Examples:

  hpvc node down --job 42
"""


@node_app.command("down", help=DOWN_HELP)
def down_cmd(
    job: int = typer.Option(..., min=1, help="Slurm job id."),
    as_json: bool = typer.Option(False, "--json", help="Print what was taken down as JSON."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Every undo step on stderr."),
    site: list[str] = typer.Option(None, "--site", help=SITE_HELP),
    ended: bool = typer.Option(
        False, "--ended", help="The job ended for good: remove its checkpoints (the epilog)."
    ),
) -> None:
    from hpvc.slurm import checkpoint_timer, node
    from hpvc.store import Store

    names = node.down(job, progress=_progress if verbose else quiet)
    if not node.job_shares(Store(), job):
        checkpoint_timer.forget(Store(), job)
    if ended and (gone := checkpoint_timer.remove(_site(site), job)) is not None:
        err_console.print(f"job {job}: removed its checkpoints {gone}")
    if as_json:
        print_json({"job": job, "removed": names})
    elif names:
        console.print(f"job {job}: took down {', '.join(names)}")
    else:
        console.print(f"job {job}: nothing on this host")


PREPARE_HELP = """Make this host ready for jobs across hosts: hold the VXLAN port (UDP 4789).

A VXLAN link of hpvc's (hpvc-vxport, VNI 0, joined to nothing) owns the
host's kernel socket on the port, which every job's VXLAN link shares, so no
user can bind the port first and keep jobs across hosts from starting. Run it
as root when the host starts, before slurmd and before users log in (a
site's unit for slurmd: ExecStartPre). Doing it again changes nothing.
`hpvc doctor` says who holds the port.

Examples:

  hpvc node prepare
"""


@node_app.command("prepare", help=PREPARE_HELP)
def prepare_cmd() -> None:
    from hpvc.cluster import ops
    from hpvc.errors import require_root
    from hpvc.store import Store

    require_root("hpvc node prepare")
    made = ops.hold_vxlan_port(Store())
    console.print("VXLAN port held for hpvc" + ("" if made else " (already)"))


LS_HELP = """Shares of Slurm jobs on this host.

Examples:

  hpvc node ls

  hpvc node ls --json
"""


@node_app.command("ls", help=LS_HELP)
def ls_cmd(as_json: bool = typer.Option(False, "--json", help="JSON output.")) -> None:
    from hpvc.cli.listings import show_shares

    show_shares(as_json)


ENTER_HELP = """Run a command inside a virtual node of a job on this host.

Examples:

  hpvc node enter --job 42 --node compute0 -- hostname
"""


@node_app.command("enter", help=ENTER_HELP)
def enter_cmd(
    job: int = typer.Option(..., min=1, help="Slurm job id."),
    vnode: str = typer.Option(..., "--node", help="Virtual node name."),
    argv: list[str] = typer.Argument(None, help="Command (after --)."),
) -> None:
    from hpvc.cluster import ops
    from hpvc.slurm import node
    from hpvc.store import Store

    store = Store()
    for name in node.job_shares(store, job):
        if vnode in {n.name for n in store.get(name).the_plan().nodes}:
            raise typer.Exit(ops.exec_node(name, vnode, list(argv or ["/bin/sh"]), store))
    raise InputError(f"node {vnode!r}", f"no share of job {job} on this host has it", "")


def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node")


# hpvc node migrate and its steps on the other hosts (issue 27): a module of their own.
from hpvc.cli import node_migrate  # noqa: E402

node_migrate.register(node_app)

# hpvc node checkpoint and its steps (issue 28): a module of their own.
from hpvc.cli import node_checkpoint  # noqa: E402

node_checkpoint.register(node_app)

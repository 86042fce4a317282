"""A detached Open MPI job over nodes that share memory: one host to Open MPI.

Container nodes with ``locality = "shm"`` share the cluster's PID and IPC
namespaces and ``/dev/shm``, so ranks in different nodes can use Open MPI's
shared-memory transport (vader, with CMA), as ``hpvc run``'s host mpirun
lets them (hpvc.cluster.ops). A launcher run inside a node, given the nodes
as hosts of their own (hpvc.cluster.jobs), would send every message over
TCP instead: measured 16x the latency and a fifth of the bandwidth of the
attached job (docs/benchmarks.md "hpvc run --detach").

So here the image's mpirun in the first node is told that every rank is its
own (``--host NODE:N``) and starts each through ``RANK_SCRIPT``, which runs
a rank of that node as it is and sends the others to their node through its
agent (``hpvc-rsh -a``: the argv as it is, the rank's MPI variables, the
working directory). The ranks reach mpirun's PMIx server over the cluster
network (its TCP listener on eth0; ``gds=hash``: the job's data over that
connection, no shared store to find), and each other through ``/dev/shm``,
where the session folder is too. Every process of the job stays in its
node's tree (the rank under its node's agent, hpvc-rsh beside mpirun), so
``hpvc checkpoint`` takes it as it takes any detached job.
"""

from __future__ import annotations

from hpvc.backends.base import InNodeLaunch
from hpvc.image.mpi import ImageMpi
from hpvc.plan import PlannedNode

RANKEXEC = "@RANKEXEC@"  # the rank script's path in the job's folder (jobs.START puts it)
SELF = "self"

# POSIX sh, builtins and env only: rank $OMPI_COMM_WORLD_RANK's line of the ranks
# file beside it says where it runs ("self", or a node's address).
RANK_SCRIPT = r"""# hpvc: start MPI rank $OMPI_COMM_WORLD_RANK in its node (hpvc run --detach)
here=${0%/*}
i=0 target=
while IFS= read -r line; do
  if [ "$i" -eq "$OMPI_COMM_WORLD_RANK" ]; then target=$line; break; fi
  i=$((i + 1))
done < "$here/ranks"
if [ -z "$target" ]; then echo "hpvc: no node for rank $OMPI_COMM_WORLD_RANK" >&2; exit 1; fi
if [ "$target" = self ]; then exec "$@"; fi
n=$#
IFS='
'
for kv in $(env); do
  case $kv in
    OMPI_*|PMIX_*|OPAL_*|ORTE_*|HPVC_*|PATH=*|LD_LIBRARY_PATH=*|HOME=*) set -- "$@" -e "$kv" ;;
  esac
done
unset IFS
set -- "$@" -C "$(pwd)" "$target"
while [ "$n" -gt 0 ]; do set -- "$@" "$1"; shift; n=$((n - 1)); done
exec {rsh} -a "$@"
"""

# What mpirun's PMIx server needs to serve ranks in other nodes.
PMIX_ENV = (
    "PMIX_MCA_ptl_tcp_remote_connections=1",
    "PMIX_MCA_ptl_tcp_if_include=eth0",
    "PMIX_MCA_gds=hash",
)


def ranks_text(layout: list[tuple[PlannedNode, int]], first: PlannedNode) -> str:
    """A line per rank, in order: ``self`` for the first node's, else its node's address."""
    lines = [SELF if n.name == first.name else n.ip for n, c in layout for _ in range(c)]
    return "".join(x + "\n" for x in lines)


def rank_script(launch: InNodeLaunch) -> str:
    return RANK_SCRIPT.replace("{rsh}", launch.rsh)


def launcher_argv(
    mpi: ImageMpi,
    launch: InNodeLaunch,
    layout: list[tuple[PlannedNode, int]],
    first: PlannedNode,
    argv: list[str],
) -> list[str]:
    """The image's mpirun with every rank its own, each started by the rank script."""
    n = str(sum(c for _, c in layout))
    mca = ["--mca", "orte_tmpdir_base", "/dev/shm", "--mca", "btl_tcp_if_include", "eth0"]
    return [
        "env", *launch.env, *PMIX_ENV, mpi.launcher, "--allow-run-as-root", "--bind-to", "none",
        "-np", n, "--host", f"{first.name}:{n}", *mca, "/bin/sh", RANKEXEC, *argv,
    ]  # fmt: skip

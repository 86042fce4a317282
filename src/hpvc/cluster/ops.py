"""Working with a running cluster: status (read back from the kernel), exec, run.

``status`` reads what runs, never what the record hopes: node processes from
the runtime, pools from the kernel, and whether the ``up``/``scale``/``down``
a record says is under way still runs (its holder of the cluster's lock). A
record stuck in ``creating`` with nobody holding the lock is an interrupted
``up``: its nodes may run, and ``hpvc down NAME`` takes them away. It lives in
hpvc.cluster.status, which loads less than this module (issue 33 item 4).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpvc.backends.base import ClusterEnv
from hpvc.cluster import hydra, jobs, pmi, ucx
from hpvc.cluster.status import open_cluster as _open
from hpvc.cluster.status import open_env
from hpvc.cluster.status import status as status
from hpvc.errors import HpvcError, InputError, MissingDependency, require_root
from hpvc.host import cgroupfs, procfs, vxlan
from hpvc.image import resolve_image
from hpvc.image.mpi import MPICH, ImageMpi, find_mpi
from hpvc.plan import Plan, PlannedNode
from hpvc.progress import Progress, quiet
from hpvc.render.files import mpi_nodes
from hpvc.store import ClusterRecord, Store

MPIRUN = "mpirun.openmpi"


def _node(plan: Plan, name: str, node: str) -> PlannedNode:
    try:
        return plan.node(node)
    except KeyError:
        known = ", ".join(n.name for n in plan.nodes)
        raise InputError(f"node {node!r}", f"not in cluster {name!r}", f"one of: {known}") from None


def exec_argv(
    name: str, node: str, argv: list[str], store: Store | None = None, tty: bool = False
) -> list[str]:
    """The command that runs ``argv`` inside one node of a cluster, stdio passed
    through (``tty``: on a terminal of its own there). A node that does not
    run is refused at once, by name (not after an ssh timeout or with the
    runtime's own message)."""
    backend, env, plan = _open(name, store)
    target = _node(plan, name, node)
    state = backend.node_state(env, plan, target)
    if state != "running":
        raise HpvcError(
            f"node {node} of {name}",
            f"is {state}, not running",
            f"bring it back: hpvc restart {name} {node}",
        )
    return backend.exec_argv(env, plan, target, argv, tty=tty)


def not_running(name: str, store: Store | None = None) -> dict[str, str]:
    """The cluster's MPI nodes that do not run, with their state."""
    backend, env, plan = _open(name, store)
    states = {n.name: backend.node_state(env, plan, n) for n in mpi_nodes(plan)}
    return {n: s for n, s in states.items() if s != "running"}


def exec_node(
    name: str, node: str, argv: list[str], store: Store | None = None, tty: bool = False
) -> int:
    """Run a command inside one node, stdio attached; return its exit code.
    ``tty`` (``hpvc exec -t``, ``hpvc console``): on a pty in the node, the
    caller's terminal relayed to it (raw) by the backend's own exec (crun exec
    --tty, ssh -t, hpvc-rsh -t), so Ctrl-C and Ctrl-Z reach the node's
    foreground job and window sizes follow."""
    if not argv:
        raise InputError("hpvc exec", "no command given", "hpvc exec NAME NODE -- CMD")
    if tty and not os.isatty(0):
        raise InputError(
            "hpvc exec -t", "stdin is not a terminal", "run it from a terminal, or drop -t"
        )
    rc = subprocess.run(exec_argv(name, node, argv, store, tty), check=False).returncode
    if rc == 0:
        return rc
    backend, env, plan = _open(name, store)
    return backend.exec_status(env, plan, _node(plan, name, node), argv, rc)


# `hpvc console`: root's login shell in the node (its passwd entry, else
# /bin/sh), started in its home, on a terminal (exec_node's tty).
CONSOLE_ARGV = [
    "/bin/sh",
    "-c",
    'pw=$(getent passwd root 2>/dev/null || grep "^root:" /etc/passwd); '
    'sh=$(echo "$pw" | cut -d: -f7); home=$(echo "$pw" | cut -d: -f6); '
    '[ -x "$sh" ] || sh=/bin/sh; cd "${home:-/}" 2>/dev/null || cd /; '
    'HOME=${home:-/} exec "$sh" -l',
]


def console(name: str, node: str, store: Store | None = None) -> int:
    """An interactive login shell in one node on the caller's terminal
    (``hpvc exec -it NAME NODE -- <root's shell> -l``); its exit code."""
    return exec_node(name, node, CONSOLE_ARGV, store, tty=True)


# The cgroup v1 hierarchies whose limits make a node (hpvc writes them); a
# task that joins a node from Slurm moves only into these, and stays where
# Slurm put it in the others (freezer for proctrack/cgroup, name=systemd ...).
NODE_CONTROLLERS = frozenset(("cpuset", "cpu", "cpuacct", "memory", "blkio", "pids", "hugetlb"))


@dataclass(frozen=True)
class NodeProcess:
    """A running node's main process, as a task that joins it must find it."""

    pid: int
    start: str  # its start time (field 22 of /proc/PID/stat): the PID is this process
    cgroup_procs: tuple[str, ...]  # the cgroup.procs of the hierarchies it limits


def node_process(name: str, node: str, store: Store | None = None) -> NodeProcess:
    """Where a task that joins ``node`` goes (the Slurm plugin)."""
    pid = node_pid(name, node, store)
    start = procfs.start_time(pid)
    if start is None:
        raise HpvcError(f"node {node} of {name}", f"its process {pid} is gone", "hpvc down it")
    m = cgroupfs.find_manager()
    return NodeProcess(pid, start, m.procs_files(pid, NODE_CONTROLLERS) if m else ())


def node_pid(name: str, node: str, store: Store | None = None) -> int:
    """The host PID of a running node's main process (container init, QEMU)."""
    backend, env, plan = _open(name, store)
    return backend.node_pid(env, plan, _node(plan, name, node))


def rank_layout(plan: Plan, n: int, targets: dict[str, str]) -> list[str]:
    """Each rank's line of the ranks file: nodes in order, one rank per vCPU."""
    slots = [(targets[x.name], len(x.vcpus)) for x in mpi_nodes(plan)]
    total = sum(s for _, s in slots)
    if n > total:
        raise InputError(f"-n {n}", f"the cluster's MPI nodes have {total} vCPUs", f"-n {total}")
    out: list[str] = []
    for target, s in slots:
        out += [target] * s
    return out[:n]


def mpirun_argv(env: ClusterEnv, n: int, argv: list[str], shared_memory: bool) -> list[str]:
    """Host mpirun, each rank exec'd into its node (the PMIx server on the bridge).

    With shared memory the nodes share IPC, PID namespace and /dev/shm, so
    Open MPI's shared-memory transport (and CMA) works between them; without
    it only the network path is allowed.
    """
    mpirun = shutil.which(MPIRUN)
    if mpirun is None:
        raise MissingDependency("hpvc run", f"{MPIRUN} not found", "apt-get install openmpi-bin")
    out = [mpirun, "--allow-run-as-root", "-n", str(n), "--host", f"localhost:{n}"]
    out += ["--bind-to", "none", "--mca", "orte_tmpdir_base", str(env.dir / "mpi")]
    out += ["--mca", "btl_tcp_if_include", "eth0"]
    if not shared_memory:
        out += ["--mca", "btl", "tcp,self"]
    return [*out, str(env.dir / "rankexec"), *argv]


def image_mpi(image: str) -> ImageMpi:
    """The MPI in the nodes' image (``hpvc.image.mpi``), looked for in the image's own
    root; InputError, before anything runs, when it has no MPI launcher."""
    img = resolve_image(image)
    mpi = find_mpi(img.rootfs, img.env)
    if mpi is None:
        raise InputError(
            f"image {image!r}",
            "has no MPI launcher (mpiexec or mpirun of MPICH or Open MPI) on its PATH",
            "install MPICH or Open MPI in the image",
        )
    return mpi


def node_counts(plan: Plan, n: int) -> list[tuple[PlannedNode, int]]:
    """How many of ``n`` ranks each MPI node runs (``rank_layout``'s order), busy ones only."""
    layout = rank_layout(plan, n, {x.name: x.name for x in plan.nodes})
    return [(x, layout.count(x.name)) for x in mpi_nodes(plan) if x.name in layout]


def no_compute_notice(plan: Plan) -> str | None:
    """What ``run`` says when the cluster has no compute node: its ranks then
    run on every node there is (``mpi_nodes``), the head's included."""
    if any(n.role == "compute" for n in plan.nodes):
        return None
    where = ", ".join(n.name for n in mpi_nodes(plan))
    return f"cluster {plan.cluster} has no compute nodes: the ranks run on {where}"


def _job(
    store: Store, name: str, argv: list[str], n: int | None, progress: Progress
) -> tuple[ClusterRecord, Plan, ImageMpi, int]:
    """What every job checks first: a running cluster, a command, ranks that fit."""
    require_root("hpvc run")
    rec = store.get(name)
    if rec.status != "running":
        raise InputError(f"cluster {name!r}", f"is {rec.status}", "wait for it, or hpvc up")
    if not argv:
        raise InputError("hpvc run", "no command given", "hpvc run NAME -n 2 -- CMD")
    if n is not None and n < 1:
        raise InputError(
            f"-n {n}", "a job needs at least one rank", "leave -n out for one per vCPU"
        )
    down = not_running(name, store)
    if down:
        listed = ", ".join(f"{n} ({s})" for n, s in sorted(down.items()))
        raise HpvcError(
            f"hpvc run {name}",
            f"nodes that do not run: {listed}",
            f"bring them back: hpvc restart {name}",
        )
    plan = rec.the_plan()
    mpi = image_mpi(plan.image)
    total = sum(len(x.vcpus) for x in mpi_nodes(plan))
    rank_layout(plan, n or total, {x.name: x.name for x in plan.nodes})  # -n fits, or refused
    progress(f"mpi: {mpi.describe(plan.image)}")
    notice = no_compute_notice(plan)
    if notice is not None:
        progress(notice)
    return rec, plan, mpi, total


def run(
    name: str,
    argv: list[str],
    n: int | None = None,
    store: Store | None = None,
    capture: bool = False,
    progress: Progress = quiet,
    verbose: bool = False,
) -> int | subprocess.CompletedProcess[str]:
    """Launch ``argv`` as an MPI job over the cluster's nodes; return its exit code
    (or, with ``capture``, the finished process with its stdout and stderr).
    A cluster without compute nodes runs the job on the nodes it has, and
    says so (``progress``). Co-resident VM guests talk through their ivshmem
    region where they can (``hpvc.cluster.ucx``); ``verbose`` says which
    transport each pair of the job's nodes uses, and has UCX say it too."""
    store = store or Store()
    rec, plan, mpi, total = _job(store, name, argv, n, progress)
    backend, env = open_env(store, rec)
    # whether co-resident nodes share memory: the backend says (architecture rule 3)
    shm = backend.capabilities.shared_memory
    shm = shm and rec.spec.get("tuning", {}).get("locality", "shm") == "shm"
    # Co-resident guests' ivshmem region, through UCX (the VM rank script forwards
    # only MPI's own variables: the region's go in front of the program).
    argv = ucx.job_argv(store.root, plan, node_counts(plan, n or total), argv, verbose, progress)
    if mpi.kind == MPICH and shm:  # co-resident nodes one host to MPICH (hpvc.cluster.pmi)
        launch = backend.mpi_launch(env, plan)
        counts = node_counts(plan, n or total)
        return pmi.run(launch, env.dir, counts, argv, plan.network.gateway, capture)
    if mpi.kind == MPICH:  # the image's hydra, in the nodes (hpvc.cluster.hydra)
        return hydra.run(
            lambda node, a: backend.exec_argv(env, plan, node, a),
            mpi.launcher,
            node_counts(plan, n or total),
            argv,
            capture,
        )
    launch = backend.mpi_launch(env, plan)
    layout = rank_layout(plan, n or total, launch.targets)
    (env.dir / "ranks").write_text("".join(c + "\n" for c in layout))
    script = env.dir / "rankexec"
    script.write_text(launch.script)
    script.chmod(0o755)
    cmd = mpirun_argv(env, len(layout), argv, shm)
    child_env = {
        **os.environ,
        # Ranks sit in other network namespaces: the PMIx server must listen on
        # the cluster bridge, not on the host's loopback.
        "PMIX_MCA_ptl_tcp_remote_connections": "1",
        "PMIX_MCA_ptl_tcp_if_include": plan.network.bridge,
        **launch.env,
    }
    if capture:
        return subprocess.run(cmd, env=child_env, capture_output=True, text=True, check=False)
    return subprocess.run(cmd, env=child_env, check=False).returncode


def run_detached(
    name: str,
    argv: list[str],
    n: int | None = None,
    store: Store | None = None,
    progress: Progress = quiet,
    verbose: bool = False,
) -> jobs.Job:
    """Start ``argv`` as an MPI job whose launcher runs in the cluster's first MPI
    node, in the background (``hpvc run --detach``, hpvc.cluster.jobs); its record."""
    store = store or Store()
    rec, plan, mpi, total = _job(store, name, argv, n, progress)
    backend, env = open_env(store, rec)
    layout = node_counts(plan, n or total)
    return jobs.start(backend, env, plan, mpi, layout, argv, shlex.join(argv), verbose, progress)


def rank_file(store: Store, name: str) -> Path:
    return store.cluster_dir(name) / "ranks"


def hold_vxlan_port(store: Store) -> bool:
    """Hold the VXLAN port on this host for every cluster across hosts (``hpvc node
    prepare``, at host start-up; ``up`` does it too). Its journal is its own, which no
    cluster's down undoes, so an idle host keeps the port. True when made now."""
    return vxlan.hold_port(store.vxlan_port_journal())

"""Node-level commands for Slurm: one host's share of a job's virtual cluster.

The SPANK plugin (native/spank) calls these as root on every allocated host:
``hpvc node up`` when a step of the job starts there (idempotent: the first
step brings the share up, later ones find it running), ``hpvc node down`` from
the job epilog (after the job ended, was cancelled or failed). Policy lives
here, the plugin only carries it out: which virtual nodes go to which host,
which node each task runs in, which namespaces a task joins, what a site
allows.

A job's virtual cluster is split over its hosts in spec order, in blocks as
even as possible (the head, first in most specs, lands on the first host).
Each host plans only its share (``plan_cluster(only=...)``) on its own
topology restricted to the CPUs Slurm gave the job, so names and addresses
are those of the whole cluster and shares planned on different hosts fit
together. A share is an ordinary hpvc cluster record named ``j<job>-<index>``;
shares of one job on one machine (the local test cluster runs three slurmd on
one machine) use one bridge. Everything a job's shares change is undone by
``node down``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpvc.cluster import backends, images, lifecycle, ops, ucx
from hpvc.errors import HpvcError, InputError
from hpvc.host import fabric
from hpvc.locks import file_lock
from hpvc.paths import private_dir
from hpvc.plan.addresses import bridge_name
from hpvc.plan.overlay import Overlay
from hpvc.plan.planner import expand
from hpvc.progress import Progress, quiet
from hpvc.slurm.cpus import os_cpus
from hpvc.slurm.policy import (
    Site,
    check_memory,
    for_job,
    hosts_text,
    job_hosts,
    job_user,
    load,
    parse_share_name,
    share_name,
    share_overlay,
    split,
    task_pool,
)
from hpvc.slurm.shares import share_planner
from hpvc.spec import Spec
from hpvc.store import ClusterRecord, Store
from hpvc.sysroot import HOST
from hpvc.topology import read_topology
from hpvc.units import parse_cpulist

# Namespaces a task joins: all of its node's. Under --mpi=pmix too: the
# plugin forwards the node's 127.0.0.1:<port> to the step's PMIx server on the
# host's loopback (native/spank/pmixfwd.c; docs/slurm.md, "MPI").
JOIN_BASE = ("cgroup", "ipc", "uts", "pid", "mnt")
JOIN_NAMESPACES = (*JOIN_BASE, "net")


# ---- what the plugin reads back --------------------------------------------


@dataclass(frozen=True)
class Join:
    """How a task enters node ``slot`` of the pool (printed for the plugin)."""

    slot: int
    node: str
    pid: int
    start: str  # the process's start time: the plugin enters only this process
    namespaces: tuple[str, ...]
    cgroup_procs: tuple[str, ...]
    env: tuple[str, ...]
    ip: str = ""  # a node whose tasks relay (VMs): its agent's address
    key: str = ""  # and the root-only file of the key the relay proves it holds
    # Where a task starts when the node lacks the job's directory: the image's
    # WorkingDir ("" or "/": the node's root).
    workdir: str = ""

    def lines(self) -> list[str]:
        ns = ",".join(self.namespaces)
        if self.ip:
            out = [f"vm {self.slot} {self.pid} {self.start} {self.ip} {self.node}"]
        else:
            out = [f"node {self.slot} {self.pid} {self.start} {ns} {self.node}"]
        out += [f"cgroup {self.slot} {p}" for p in self.cgroup_procs]
        out += [f"env {self.slot} {kv}" for kv in self.env]
        out += [f"cwd {self.slot} {self.workdir}"] if self.workdir not in ("", "/") else []
        out += [f"agentkey {self.slot} {self.key}"] if self.key else []
        return out


def joins(
    store: Store,
    job: int,
    index: int,
    share: Sequence[str],
    roles: dict[str, str],
    mpi: str,
) -> list[Join]:
    """One Join per node of the task pool."""
    name = share_name(job, index)
    pmix = mpi.startswith("pmix")
    rec = store.get(name)
    plan = rec.the_plan()
    # hpvc node migrate moves nodes between a job's hosts: the share's nodes are
    # its plan's now, the split's first (docs/slurm.md "Moving a VM node").
    here = [n.name for n in plan.nodes]
    share = [n for n in share if n in here] + [n for n in here if n not in share]
    if not share:
        raise InputError(
            f"job {job} on this host",
            "its virtual nodes were moved to the job's other hosts (hpvc node migrate)",
            "run the step on the job's other hosts (srun -x this host)",
        )
    entry = backends.cluster_task_entry(store, name, mpi)
    # An imported image's Env and WorkingDir (nothing for a built image), over
    # the task's own environment; hpvc's variables and then Slurm's go on top.
    # A VM's relay sends them to the guest's agent (native/spank/vm.c).
    image = images.task_images(store, name)
    pool = task_pool(share, roles)
    # Guests of the share that map one ivshmem region: MPI over it, through UCX
    # (hpvc.cluster.ucx), as hpvc run gives it; nothing where there is no region.
    shm = ucx.for_job(store.root, plan, [(plan.node(n), 1) for n in pool]).env_list()
    # Slurm's PMI calls every task of this host local, but each guest is a machine
    # of its own: Open MPI took its shared memory (btl vader) between two guests
    # and crashed; where the region is not chosen, its BTLs stay self and TCP.
    # MPICH failed sharing start-up memory (MPIDU_Init_shm): each rank its own node.
    many = entry.relay and len(pool) > 1
    apart: tuple[str, ...] = ("MPIR_CVAR_NOLOCAL=1",) if many else ()
    apart += ("OMPI_MCA_btl=self,tcp",) if many and not shm else ()
    out = []
    for t, node in enumerate(pool):
        proc = ops.node_process(name, node, store)
        env = [f"HPVC_NODE={node}", f"HPVC_JOB_CLUSTER={name}"]
        mine = image[node]
        if entry.relay:  # the task relays to the agent in the node (a VM's guest)
            env = [*mine.env, *env, *entry.env, *shm, *apart]
            key = str(store.cluster_dir(name) / entry.key) if entry.key else ""
            ip = plan.node(node).ip
            join = Join(t, node, proc.pid, proc.start, (), (), tuple(env), ip, key)
            out.append(replace(join, workdir=mine.workdir))
            continue
        if pmix:
            # The PMIx server's shared-memory store lives in the host's spool
            # directory, which tasks in the node do not see: ask it over the socket.
            env.append("PMIX_MCA_gds=hash")
        env = [*mine.env, *env]
        join = Join(t, node, proc.pid, proc.start, JOIN_NAMESPACES, proc.cgroup_procs, tuple(env))
        out.append(replace(join, workdir=mine.workdir))
    return out


# ---- up and down ------------------------------------------------------------


def jobs_dir(store: Store) -> Path:
    """Root's alone: the join records and locks name every job's shares."""
    return private_dir(store.layout.jobs(), tighten=True)


@contextmanager
def job_lock(store: Store, job: int) -> Iterator[None]:
    """Every command on one job's shares on this machine runs under this lock."""
    with file_lock(jobs_dir(store) / f"{job}.lock"):
        yield


def job_shares(store: Store, job: int) -> list[str]:
    """The job's shares on this host, also half-made ones (no record yet)."""
    base = store.layout.clusters()
    names = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    return [n for n in names if (p := parse_share_name(n)) and p[0] == job]


def _other_subnets(store: Store, job: int) -> dict[str, str]:
    """Subnets of the clusters on this host that are not this job's shares."""
    mine = set(job_shares(store, job))
    out: dict[str, str] = {}
    for n in store.names():
        if n in mine:
            continue
        rec = store.load(n)
        if rec is not None:
            out[n] = str(rec.plan.get("network", {}).get("subnet", ""))
    return out


@dataclass(frozen=True)
class Request:
    """What the plugin knows about the step on this host."""

    job: int
    index: int  # this host's place in the job's node list
    hosts: int  # the job's node count
    cpus: str = ""  # the job's CPUs on this host (Slurm's list), "" = all
    mpi: str = ""
    nodelist: str = ""  # the job's hosts as Slurm writes them (SLURM_JOB_NODELIST)
    mem_mib: int = 0  # the job's memory on this host (S_JOB_ALLOC_MEM), 0 = not allocated
    uid: int = -1  # the job's user (S_JOB_UID), -1 = not known (an older plugin)
    gid: int = -1
    restarts: int = 0  # Slurm's restart count: above 0, a requeued job (restored if it can be)
    checkpoint_every: int = 0  # --hpvc-checkpoint: seconds between cuts, 0 none


def up(
    req: Request, text: str, site: Site, store: Store | None = None, progress: Progress = quiet
) -> list[Join]:
    """Bring this host's share up (or find it running); return how tasks join."""
    store = store or Store()
    spec, doc = load(text, f"job {req.job} spec", site)
    if not 0 <= req.index < req.hosts:
        raise InputError(f"--index {req.index}", f"not a host of a {req.hosts}-host job", "")
    index = req.index
    # Its backend refuses an MPI its nodes' tasks cannot use (VMs: Slurm's PMI).
    backends.task_entry(spec, req.mpi, f"job {req.job} spec")
    shares = split(spec, req.hosts)
    # Nothing on the host changes for a job that asks more than Slurm gave it.
    check_memory(spec, req.hosts, req.mem_mib, "on this host")
    spec, doc = for_job(spec, doc, site, req.job, req.hosts)
    share = shares[index]
    roles = {w.name: w.role for w, _ in expand(spec)}
    name = share_name(req.job, index)
    with job_lock(store, req.job):
        rec = store.load(name)
        if rec is not None and rec.status != "running":
            progress(f"share {name} is {rec.status}: taking it down first")
            _teardown(store, name, progress)
            rec = None
        if rec is None:
            # Only root imports, into the site's store: a job never imports or copies
            # an image, it finds the one the site put there (docs/slurm.md).
            images.require_stored(spec.image)
            clash = [
                (n, s)
                for n, s in _other_subnets(store, req.job).items()
                if s and ipaddress.ip_network(s).overlaps(spec.network.network)
            ]
            if clash:
                fix = (
                    "give this job's spec another network.subnet"
                    if site.user_subnets
                    else "the site's subnet pool has fewer blocks than jobs running here:"
                    " give plugstack.conf a larger subnets="
                )
                raise InputError(
                    f"job {req.job}: subnet {spec.network.network}",
                    f"cluster {clash[0][0]!r} on this host uses {clash[0][1]}",
                    fix,
                )
            # Slurm's abstract core numbers, as slurmd maps them: over the whole host.
            cpus = (
                os_cpus(
                    read_topology(HOST, whole_system=True),
                    parse_cpulist(req.cpus),
                    1 if site.threads_as_cores else None,
                )
                if req.cpus
                else None
            )
            # A requeued job's share comes back from its last cut, if any; the first
            from hpvc.slurm import checkpoint_share, checkpoint_timer  # host times cuts

            if not checkpoint_share.restore(store, spec, doc, req, share, cpus, site, progress):
                _up_share(store, spec, doc, req, index, share, cpus, site.binds, progress,
                          console_mib=site.limits.max_console_mib)  # fmt: skip
            checkpoint_timer.start(store, req, site, req.checkpoint_every)
        out = joins(store, req.job, index, share, roles, req.mpi)
        if (jobs_dir(store) / f"{name}.restored").exists():  # checkpoint_share.restore's
            out = [replace(j, env=(*j.env, "HPVC_RESTORED=1")) for j in out]
        _write_cache(store, name, req.mpi, out)
        return out


def up_times(store: Store, req: Request, cli_s: float, spent: float) -> str:
    """Where ``hpvc node up``'s time went, for the step's tasks (HPVC_UP_TIMES,
    read by hpvc bench slurm): ``cli`` (``cli_s``: from the CLI's first line to
    the call of ``up``: typer, imports), then, when this call of ``spent``
    seconds brought the share up, the phases of ``up`` (image, plan, host,
    nodes; ``share`` is the rest: spec checks, locks, topology, join records);
    ``running`` when it found the share up. Seconds, ``k=v`` joined by commas."""
    parts = {"cli": cli_s}
    rec = store.load(share_name(req.job, req.index))
    if rec is not None and rec.created >= time.time() - spent:
        phases = {k: float(v) for k, v in rec.phases.items()}
        parts |= phases
        parts["share"] = max(0.0, spent - sum(phases.values()))
    else:
        parts["running"] = spent
    return ",".join(f"{k}={v:.3f}" for k, v in parts.items())


_MPI_RE = re.compile(r"^[A-Za-z0-9_]{0,32}$")


def cache_path(store: Store, share: str, mpi: str) -> Path | None:
    """Where the plugin finds a running share's join records without starting
    Python (later steps of a job): ``jobs/<share>.<mpi or none>.join``."""
    if not _MPI_RE.fullmatch(mpi):
        return None
    return jobs_dir(store) / f"{share}.{mpi or 'none'}.join"


def _write_cache(store: Store, share: str, mpi: str, out: Sequence[Join]) -> None:
    path = cache_path(store, share, mpi)
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(line + "\n" for j in out for line in j.lines()))
    os.replace(tmp, path)


def _up_share(
    store: Store,
    spec: Spec,
    doc: dict[str, Any],
    req: Request,
    index: int,
    share: list[str],
    cpus: set[int] | None,
    binds: tuple[str, ...],
    progress: Progress,
    console_mib: int | None = None,
) -> ClusterRecord:
    name = share_name(req.job, index)
    whole = spec
    part = spec.model_copy(update={"name": name})
    bridge = bridge_name(f"j{req.job}")

    overlay = _overlay(spec, req)
    planner = share_planner(part, bridge, share, cpus, overlay)
    progress(f"share {index} of job {req.job}: {', '.join(share)}")
    return lifecycle.up_spec(
        part,
        doc,
        f"slurm job {req.job}",
        store,
        progress,
        planner,
        hosts=hosts_text(whole, req.job),
        binds=binds,
        overlay=overlay,
        tenant=True,  # an ordinary user's job: node roots nosuid,nodev
        exclusive_subnet=False,  # cut from the site's pool and checked in up()
        console_mib=console_mib,
        user=job_user(req.uid, req.gid),
    )


def _overlay(spec: Spec, req: Request) -> Overlay | None:
    """The cluster network across the job's hosts (None for a one-host job)."""
    if req.hosts <= 1 or not req.nodelist:
        return None  # one host; or a plugin too old to pass the node list
    hosts = job_hosts(req.nodelist)
    if len(hosts) != req.hosts:
        raise HpvcError(
            f"job {req.job}",
            f"node list {req.nodelist!r} names {len(hosts)} host(s), the job has {req.hosts}",
            "the SPANK plugin passes SLURM_JOB_NODELIST: is it up to date?",
        )
    addresses = [fabric.address_of(h) for h in hosts]  # as each host resolves here
    mtu = fabric.mtu_of(addresses[req.index])
    return share_overlay(spec, req.job, req.index, hosts, addresses, mtu)


def _teardown(store: Store, name: str, progress: Progress) -> None:
    errors = lifecycle.teardown_locked(store, name, progress)
    if errors:
        raise HpvcError(f"share {name}", f"teardown failed: {errors[0]}", "hpvc node down again")


def down(job: int, store: Store | None = None, progress: Progress = quiet) -> list[str]:
    """Take every share of ``job`` on this machine down; return their names."""
    store = store or Store()
    with job_lock(store, job):
        names = job_shares(store, job)
        for name in reversed(names):
            # The plugin's shortcut goes first: no step may join a node going away.
            for cached in jobs_dir(store).glob(f"{name}.*.join"):
                cached.unlink()
            progress(f"down {name}")
            _teardown(store, name, progress)
    with job_lock(store, job):
        if not job_shares(store, job):
            (jobs_dir(store) / f"{job}.lock").unlink(missing_ok=True)
    return names

"""Checkpoint and restore of container nodes through CRIU (issue 28, docs/checkpoint.md).

crun 1.8 (Debian's) is built without CRIU, so hpvc drives CRIU itself
(``hpvc.host.criu``), with what crun would have passed it:

- freeze: every node's cgroup frozen (``hpvc.host.freezer``: v1 freezer, v2
  ``cgroup.freeze``); the cluster layer freezes all nodes before saving any.
  What a Slurm step left running in a node is first moved into the node's
  cgroups, and a node running a step's tasks, or an exec still attached, is
  refused (``hpvc.backends.crun.cutcheck``; docs/checkpoint.md "Under Slurm");
- save, per frozen node, into its folder of the checkpoint: ``criu/`` (CRIU's
  images of the node's process tree: memory, namespaces, TCP connections in
  repair mode, SysV IPC of its own IPC namespace, the contents of its /dev
  and /dev/shm tmpfs), ``upper.tar`` (the overlay's upper folder: the node's
  writable layer, whiteouts and xattrs kept), ``crun-state.json`` (crun's
  record of the container, to hand the restored node back to crun); with the
  first node, the cluster's own files (``hpvc.backends.crun.clusterfiles``:
  the shared directory's host folder, the shared /dev/shm, the agent key),
  put back before any node;
- restore, per node (the nodes side by side, ``hpvc.concurrent``): what
  ``start`` makes before ``crun run`` (folder, layer with the saved upper
  folder, overlay root, network namespace and veth with the same address and
  MAC, config.json for crun exec), a new console
  reader, then ``criu restore`` into them, its tasks back in the node's cgroup
  with the saved limits, frozen; then crun's state record is written for the
  restored init (its PID and start time), so ``hpvc exec`` (crun exec),
  ``status`` and ``down`` (crun delete) work on it as on any node. The
  record's layout is crun 1.8's own (``/run/crun/<id>/status``): restore
  refuses a saved record without the fields it rewrites.

A restore under another cluster name (``hpvc restore --name``): the nodes'
cgroups move to the new cluster's (CRIU's ``--cgroup-root``), their cgroup
mounts are bound from there (saved under a key per host hierarchy,
``hpvc.host.criu.cgroup_mounts``), the binds from the new cluster's folders;
hostnames, addresses, MACs and processes are the saved ones.

Nodes sharing the cluster's PID and IPC namespaces and /dev/shm (``locality =
"shm"``) are dumped one by one with the PID namespace external, and the shared
/dev/shm saved once (``hpvc.backends.crun.shmcut``). Refused in one line
before any node is frozen: a shared directory served by an NFS server node.
Where ``criu check`` fails (CRIU 3.17 on kernels 6.13+), every step raises
``refusal()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpvc.backends import shared
from hpvc.backends.crun import clusterfiles, cutcheck, shmcut
from hpvc.backends.crun import container as ct
from hpvc.backends.crun.clusterfiles import TAR_OPTS, tar
from hpvc.concurrent import each
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.faults import inject
from hpvc.host import cgroups, console_ring, criu, freezer, layer, net, nodeprocs, procfs, tree
from hpvc.plan import Plan
from hpvc.progress import Progress
from hpvc.render.oci import dumps, render_oci_config
from hpvc.units import format_cpulist

if TYPE_CHECKING:
    from hpvc.backends.base import ClusterEnv

WHAT = "checkpoint of crun (container) nodes"
DOC = "docs/checkpoint.md, Containers"
CRIU_DIR = "criu"
UPPER_TAR = "upper.tar"
CRUN_STATE = "crun-state.json"
STDIO = "stdio.json"  # CRIU's names of the init's stdio, which restore hands new ones for
CRUN_RUN = Path("/run/crun")
_checked: list[criu.CriuCheck] = []  # criu check, once per process


def refusal(found: criu.CriuCheck | None = None) -> InputError:
    """The one-line refusal where CRIU cannot work, built from ``criu check``."""
    found = found if found is not None else criu.check()
    if not found.installed:
        return MissingDependency(WHAT, "criu is not installed", "make setup; " + DOC)
    if not found.ok:
        return InputError(
            WHAT,
            f"CRIU {found.version or '?'} cannot run on this kernel "
            f"({platform.release()}): {found.error}",
            f"needs CRIU 4.2 or newer on kernels 6.13+ (scripts/setup-criu.sh); {DOC}",
        )
    return InputError(WHAT, f"CRIU {found.version} runs here", DOC)  # not raised: CRIU works


def usable() -> None:
    """Refuse (one line) where CRIU does not run here."""
    if not _checked:
        _checked.append(criu.check())
    if not _checked[0].ok:
        raise refusal(_checked[0])


def refuse_unsupported(env: ClusterEnv, plan: Plan) -> None:
    """What this backend cannot checkpoint, in one line, before anything is frozen."""
    if shared.shared_of(plan).server == "nfs":
        raise InputError(
            f"checkpoint of {env.name}",
            "its shared directory is served by an NFS server node, not checkpointed yet",
            'use [shared] server = "host" (docs/checkpoint.md)',
        )


def _rel(plan: Plan, name: str) -> str:
    return cgroups.node_path(plan.cluster, name)


def _inits(plan: Plan, names: list[str]) -> dict[str, int]:
    return {n: ct.container_pid(ct.container_id(plan.cluster, n)) for n in names}


def refuse(env: ClusterEnv, plan: Plan, names: list[str] | None = None) -> None:
    """Every refusal, in one line, before any node is frozen (a cut across
    hosts checks every host's share before any freezes). Moves what the
    nodes' steps left running in the background into the nodes' cgroups
    (``nodeprocs.gather``), then refuses a node running a step's tasks."""
    usable()
    refuse_unsupported(env, plan)
    inits = _inits(plan, names or [n.name for n in plan.nodes])
    cutcheck.refuse(env, plan, inits)


def freeze(env: ClusterEnv, plan: Plan, names: list[str]) -> None:
    """Freeze every node, with what its steps left running in the background.
    A node whose PID namespace gained a step's tasks since ``refuse`` fails the
    freeze (exit 1); nodes frozen before a failure are thawed."""
    refuse(env, plan, names)
    inits = _inits(plan, names)
    frozen: list[str] = []
    try:
        for name, init in inits.items():
            freezer.freeze(_rel(plan, name))
            frozen.append(name)
            nodeprocs.gather(init)  # forked since the first gather: stopped as they move
            cutcheck.unstoppable(env, plan, name, init, HpvcError)
    except BaseException:
        for name in frozen:
            with contextlib.suppress(HpvcError, OSError):
                freezer.thaw(_rel(plan, name))
        raise


def thaw(env: ClusterEnv, plan: Plan, names: list[str]) -> None:
    for name in names:  # restored nodes' links come up now (``_restore_one``)
        net.set_link_up(ct.host_ifname(plan.cluster, name), True)
    for name in names:
        freezer.thaw(_rel(plan, name))


def _binds(config: dict[str, Any]) -> dict[str, str]:
    """Mount point -> host folder of every bind crun made into the node."""
    return {
        str(m["destination"]): str(m["source"])
        for m in config.get("mounts", [])
        if m.get("type") == "bind"
    }


def _upper(env: ClusterEnv, plan: Plan, name: str) -> Path:
    node_dir = env.node_dir(name)
    top = node_dir / layer.MOUNT if plan.node(name).disk_mib is not None else node_dir
    return top / "upper"


def save(
    env: ClusterEnv, plan: Plan, name: str, dest_dir: Path, progress: Progress
) -> dict[str, Any]:
    node_dir = env.node_dir(name)
    cid = ct.container_id(plan.cluster, name)
    pid = ct.container_pid(cid)
    config = json.loads((node_dir / "config.json").read_text())
    binds = _binds(config)
    stdio = criu.stdio_keys(pid)
    progress(f"node {name}: criu dump")
    criu.dump(
        pid,
        dest_dir / CRIU_DIR,
        netns=Path(net.netns_path(ct.netns_name(plan.cluster, name))),
        binds=list(binds),
        stdio=stdio,
        freezer=freezer.cgroup_dir(_rel(plan, name)),
        root=node_dir / "rootfs",
        cgroups=criu.cgroup_mounts(pid, _rel(plan, name)),
        pidns=shmcut.dump_ns(env),
        # A deleted file still open (UCX's /dev/shm segment, 4 MiB, under MPICH)
        # is saved whole; one in /dev/shm counts against the node's memory.
        ghost_mib=plan.node(name).memory_mib,
    )
    inject(f"save:{name}")
    progress(f"node {name}: writable layer")
    tar(["-C", str(_upper(env, plan, name)), *TAR_OPTS, "-cf", str(dest_dir / UPPER_TAR), "."],
         f"save the writable layer of {name}")  # fmt: skip
    if name == plan.nodes[0].name:  # the cluster's own files, once (crun.clusterfiles)
        clusterfiles.save(env, plan, dest_dir, progress)
    state = json.loads((CRUN_RUN / cid / "status").read_text())
    (dest_dir / CRUN_STATE).write_text(json.dumps(state, indent=1) + "\n")
    (dest_dir / STDIO).write_text(json.dumps({str(k): v for k, v in stdio.items()}) + "\n")
    files = sorted(str(p.relative_to(dest_dir)) for p in dest_dir.rglob("*") if p.is_file())
    return {"files": files, "binds": sorted(binds)}


def _check_state(src: dict[str, Any]) -> None:
    """Refuse a saved crun record without the fields restore rewrites."""
    missing = [k for k in ("pid", "process-start-time", "cgroup-path", "bundle") if k not in src]
    if missing:
        raise InputError(
            "the checkpoint's crun state record",
            f"has no {', '.join(missing)} (another crun than 1.8?)",
            "restore on a host with the crun the checkpoint was taken with",
        )


def _crun_state(src: dict[str, Any], pid: int, node_dir: Path) -> dict[str, Any]:
    """crun's record of a container, for a restored init ``pid``."""
    _check_state(src)
    started = procfs.start_time(pid)
    return src | {
        "pid": pid,
        "process-start-time": int(started) if started and str(started).isdigit() else 0,
        "bundle": str(node_dir),
        "rootfs": str(node_dir / "rootfs"),
    }


def _restore_one(
    env: ClusterEnv,
    plan: Plan,
    name: str,
    src: Path,
    progress: Progress,
    cgroup_mounts: list[str],
) -> None:
    from hpvc.backends.crun.backend import remote_arp, render_context
    from hpvc.image import resolve_image

    progress(f"node {name}: restoring")
    node = plan.node(name)
    node_dir = env.node_dir(name)
    j = env.node_journal(name)
    cid = ct.container_id(plan.cluster, name)
    saved = json.loads((src / CRUN_STATE).read_text())
    _check_state(saved)
    tree.record(j, node_dir)
    top = layer.mount_layer(j, env.store.root, node_dir, node.disk_mib) if node.disk_mib else None
    upper = (top or node_dir) / "upper"
    upper.mkdir(mode=0o700, exist_ok=True)
    tar(
        ["-C", str(upper), *TAR_OPTS, "-xf", str(src / UPPER_TAR)],
        f"restore the layer of {name}",
    )
    rootfs = resolve_image(plan.image).rootfs
    ct.mount_overlay(j, rootfs, node_dir, tenant=env.rec.tenant, layer=top)
    # Its link down until the thaw: CRIU opens each node's network as its restore
    # ends, and a restored socket's retransmission then reached a node wired but
    # not yet restored, whose kernel reset the connection (ECONNRESET in an MPI
    # job, scripts/bench/checkpoint-mpi.py); with no carrier it is lost, and sent
    # again after the thaw (docs/checkpoint.md "Restore").
    net.set_link_up(ct.wire_node(j, plan, node, remote_arp(env)).host_ifname, False)
    netns = net.netns_path(ct.netns_name(plan.cluster, name))
    shared.before_container(env, plan, name, netns)
    config = render_oci_config(plan, node, render_context(env))
    (node_dir / "config.json").write_text(dumps(config))
    out = console_ring.start(j, node_dir / "console.log", env.rec.console_bytes(), append=True)
    assert out is not None
    j.record("container", id=cid, cgroup=config["linux"]["cgroupsPath"])
    cgroup = _rel(plan, name)
    try:
        pid = criu.restore(
            src / CRIU_DIR,
            netns=Path(netns),
            binds=saved_binds(_binds(config), Path(saved["bundle"]).parent.parent, env.dir),
            stdio={int(k): v for k, v in saved_stdio(src).items()},
            console_fd=out,
            root=node_dir / "rootfs",
            pidfile=node_dir / "restored.pid",
            cgroup=cgroup,
            cgroup_mounts=cgroup_mounts,
            move_cgroup=saved["cgroup-path"] != cgroup,  # restored under another name
            shared_ns=shmcut.restore_ns(env),
        )
    finally:
        os.close(out)
    run_dir = CRUN_RUN / cid
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(dumps(config))
    state = _crun_state(saved, pid, node_dir) | {"cgroup-path": cgroup}
    (run_dir / "status").write_text(json.dumps(state, indent=4))
    ct.update_cpus(cid, format_cpulist(node.cpuset))  # this host's plan, not the saved one
    inject(f"restore:{name}")


def saved_binds(binds: dict[str, str], saved_dir: Path, cluster_dir: Path) -> dict[str, str]:
    """Each bind of the node as CRIU saved it (its mount point) -> its folder on this
    host now. Under another cluster name (or state folder) a bind whose mount point
    is in the cluster's folder (Open MPI's session folder: the same path inside as
    outside) was saved at the old folder's path; inside the node it stays there."""
    out = {}
    for dest, source in binds.items():
        path = Path(dest)
        if saved_dir != cluster_dir and path.is_relative_to(cluster_dir):
            dest = str(saved_dir / path.relative_to(cluster_dir))
        out[dest] = source
    return out


def saved_stdio(src: Path) -> dict[str, str]:
    """The node's stdio as saved (CRIU's keys), read from its dump's side file."""
    path = src / STDIO
    return json.loads(path.read_text()) if path.exists() else {}


def restore_nodes(
    env: ClusterEnv, plan: Plan, names: list[str], src_dir: Path, progress: Progress
) -> None:
    usable()
    refuse_unsupported(env, plan)
    if shutil.which("tar") is None:
        raise MissingDependency(WHAT, "tar not found", "apt-get install tar")
    clusterfiles.restore(env, plan, src_dir / plan.nodes[0].name, progress)
    # Side by side, as ``up`` starts nodes (each has its own journal, folder,
    # namespaces and veth: hpvc.concurrent) and as the saves run: one after the
    # other, 4 nodes of 4 GiB took 2.0x Podman's side-by-side restores
    # (docs/benchmarks.md). As many at once as CPUs: CRIU's restore is work.
    # The host's cgroup hierarchies are read once, before any node's mounts
    # change the host's mount table (``criu.stable_mountinfo``).
    mounts = criu.host_cgroup_mounts()
    workers = max(1, os.cpu_count() or 1)
    one_by_one, side_by_side = shmcut.restore_order(src_dir / plan.nodes[0].name, names)
    for n in one_by_one:
        _restore_one(env, plan, n, src_dir / n, progress, mounts)
    each(side_by_side, lambda n: _restore_one(env, plan, n, src_dir / n, progress, mounts), workers)

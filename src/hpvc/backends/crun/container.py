"""Container nodes with crun: overlay root, own netns on the cluster bridge, limits.

Every step records its undo in a journal before it changes the host (see
hpvc.host.journal); the cluster layer undoes a node's journal to remove it and
the cluster's journal last. Nothing here decides placement: the Plan says
where each node goes; this module only carries it out.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpvc.errors import HpvcError, MissingDependency
from hpvc.host import cgroups, console_ring, freezer, mountns, net, procfs, sysmount, tree
from hpvc.host.journal import Args, Journal, undoer
from hpvc.paths import private_dir
from hpvc.plan.model import Plan, PlannedNode
from hpvc.render import files as render_files
from hpvc.render.context import RenderContext
from hpvc.render.oci import dumps, render_oci_config

RUNTIME = "crun"
# Names a namespace holder's cluster in its environment: what `hpvc gc` finds it
# by when the cluster's journal is lost (hpvc.backends.crun.leftovers).
HOLDER_ENV = "HPVC_HOLDER"
# What a tenant's (Slurm share's) nodes get on every host mount a user can use.
USER_MOUNT_OPTS = "nosuid,nodev"
# PID 1 of a node: reaps children, exits on SIGTERM, costs nothing while idle.
INIT = ("/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done")


def container_id(cluster: str, node: str) -> str:
    return f"hpvc-{cluster}-{node}"


def netns_name(cluster: str, node: str) -> str:
    """The node's network namespace (under /run/netns)."""
    return f"hpvc-{cluster}-{node}"


def runtime() -> str:
    path = shutil.which(RUNTIME)
    if path is None:
        raise MissingDependency("container backend", "crun not found", "apt-get install crun")
    return path


def _run(argv: list[str], what: str) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(what, why[-1] if why else f"exit code {r.returncode}")
    return r.stdout


# ---- undo functions -------------------------------------------------------


def delete_container(cid: str, *, check: bool = False) -> None:
    """``crun delete -f``: the container is gone, running or not. ``check``: an
    HpvcError when crun refuses (or is missing); else that is left to the caller."""
    crun = shutil.which(RUNTIME)
    if crun is None:
        if check:
            runtime()  # MissingDependency
        return
    r = subprocess.run([crun, "delete", "-f", cid], capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        why = r.stderr.strip().splitlines()
        raise HpvcError(f"container {cid}", why[-1] if why else f"crun exit {r.returncode}")


def kill_holder(pid: int, ours: Callable[[int], bool]) -> None:
    """Kill a namespace holder and its child, while ``ours(pid)`` says the PID is
    still that holder (not reused by someone else's process)."""
    if not ours(pid):
        return
    for p in [*procfs.children(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)  # unshare --kill-child takes its child along too


@undoer("container")
def _undo_container(args: Args) -> None:
    # A node frozen for a checkpoint (taken down by --stop, or undone half-restored)
    # cannot die while frozen: its tasks are killed, then thawed (hpvc.host.freezer).
    if args.get("cgroup"):
        freezer.kill_frozen(str(args["cgroup"]))
    delete_container(args["id"])
    # A failed `crun run` can leave its cgroups behind (HOST-NOTES): remove them.
    cgroups.remove_empty(str(args.get("cgroup", "")))


@undoer("overlay")
def _undo_overlay(args: Args) -> None:
    tree.umount(args["path"])


@undoer("tmpfs")
def _undo_tmpfs(args: Args) -> None:
    tree.umount(args["path"])


@undoer("holder")
def _undo_holder(args: Args) -> None:
    """Kill the namespace holder this cluster started (by PID, start time checked)."""
    try:
        pid, started = Path(args["pidfile"]).read_text().split()
    except (OSError, ValueError):
        return
    kill_holder(int(pid), lambda p: procfs.start_time(p) == started)


# ---- cluster-wide pieces --------------------------------------------------


def start_holder(journal: Journal, pidfile: Path, cluster: str) -> int:
    """A process owning an IPC and a PID namespace that co-resident nodes join.

    Returns the PID of the namespaces' init (whose /proc/PID/ns/* the nodes use).
    """
    journal.record("holder", pidfile=str(pidfile))
    proc = subprocess.Popen(
        ["unshare", "--ipc", "--pid", "--fork", "--kill-child", "sleep", "infinity"],
        # Named in its environment, so `hpvc gc` finds it if its journal is lost.
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), HOLDER_ENV: cluster},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pidfile.write_text(f"{proc.pid} {procfs.start_time(proc.pid)}\n")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = procfs.children(proc.pid)
        if kids:
            return kids[0]
        if proc.poll() is not None:
            break
        time.sleep(0.005)
    raise HpvcError("namespace holder", "unshare did not start (is util-linux installed?)")


def mount_tmpfs(journal: Journal, path: Path, size_mib: int, *, tenant: bool = False) -> None:
    """A tmpfs the nodes share as /dev/shm (1777 inside them; on the host only
    root reaches it, through the cluster's private folder). ``tenant``: nosuid,nodev."""
    private_dir(path)
    journal.record("tmpfs", path=str(path))
    opts = f"{USER_MOUNT_OPTS}," if tenant else ""
    data = f"{opts}size={size_mib}m,mode=1777"
    sysmount.mount("tmpfs", str(path), "tmpfs", data, f"tmpfs {path}")  # no mount(8)


def write_in_place(path: Path, text: str) -> None:
    """Rewrite a file keeping its inode (it is bind-mounted into running nodes)."""
    with open(path, "a+") as f:
        f.seek(0)
        f.truncate()
        f.write(text)


# ---- one node -------------------------------------------------------------


@dataclass(frozen=True)
class NodeHandle:
    id: str
    netns: str
    host_ifname: str


def mount_overlay(
    journal: Journal,
    lower: Path,
    node_dir: Path,
    *,
    tenant: bool = False,
    layer: Path | None = None,
) -> Path:
    """The node's root: an overlay of the image (``lower``) at ``node_dir``/rootfs.

    Its upper and work folders are in ``layer`` (the node's size-limited
    writable layer, ``hpvc.host.layer``) when given, else in ``node_dir``.

    ``node_dir`` is root's alone (0700): that, not the root's own mode, keeps
    other users out. The upper folder gets the image root's mode, because the
    overlay's root takes it: inside the node "/" stays 0755 for its users.
    ``tenant``: mounted nosuid,nodev, so a setuid binary of the image (su,
    mount, passwd) or a device node made inside gives a user nothing (crun's
    bind of the root drops the flags: ``start_container`` sets them again in
    the node's mount namespace).
    """
    top = layer or node_dir
    upper, work, merged = top / "upper", top / "work", node_dir / "rootfs"
    private_dir(node_dir)
    for d in (work, merged):
        private_dir(d)
    if not upper.is_dir():
        os.mkdir(upper, 0o700)
        os.chmod(upper, lower.stat().st_mode & 0o7777)  # widened inside the private node_dir
    journal.record("overlay", path=str(merged))
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    if tenant:
        opts = f"{USER_MOUNT_OPTS},{opts}"
    sysmount.mount("overlay", str(merged), "overlay", opts, f"overlay {merged}")  # no mount(8)
    return merged


def host_ifname(cluster: str, node: str) -> str:
    """The host's end of a node's veth, on the cluster bridge."""
    return net.short_ifname("hc", cluster, node)


def wire_node(
    journal: Journal, plan: Plan, node: PlannedNode, remote_arp: list[tuple[str, str]]
) -> NodeHandle:
    """The node's network namespace and veth on the cluster bridge, static ARP
    for the plan's nodes and ``remote_arp`` (the cluster's nodes on other hosts)."""
    ns_name = netns_name(plan.cluster, node.name)
    net.create_netns(journal, ns_name)
    ifname = host_ifname(plan.cluster, node.name)
    net.add_node_link(
        journal,
        bridge=plan.network.bridge,
        netns=ns_name,
        host_ifname=ifname,
        mtu=plan.network.mtu,
        address=node.ip,
        prefixlen=plan.network.prefixlen,
        mac=node.mac,
        gateway=plan.network.gateway,
    )
    net.set_static_neighbors(ns_name, [*render_files.arp_entries(plan), *remote_arp])
    return NodeHandle(container_id(plan.cluster, node.name), ns_name, ifname)


def start_container(
    journal: Journal,
    plan: Plan,
    node: PlannedNode,
    ctx: RenderContext,
    node_dir: Path,
    console_bytes: int = 16 << 20,
) -> str:
    """Write config.json into the node's bundle and run it detached with crun.

    A tenant's node (``ctx.tenant``) is created, its root made nosuid,nodev,
    then started: nothing runs in it before its root is hardened. The node's
    console (its init's stdout and stderr, crun's messages) goes to its
    ``console.log``, kept to ``console_bytes`` (``hpvc.host.console_ring``).
    """
    cid = container_id(plan.cluster, node.name)
    config = render_oci_config(plan, node, ctx)
    (node_dir / "config.json").write_text(dumps(config))
    # The node's init inherits crun's stdio: a pipe to hpvc's console reader,
    # which keeps console.log to its cap; never our own pipes (they would stay
    # open for the container's life and block us forever). Recorded before the
    # container, so the container is undone first and the reader then ends.
    log = node_dir / "console.log"
    out = console_ring.start(journal, log, console_bytes, append=True)
    assert out is not None
    journal.record("container", id=cid, cgroup=config["linux"]["cgroupsPath"])
    steps = [["create"], ["start"]] if ctx.tenant else [["run", "--detach"]]
    try:
        for step in steps:
            bundle = ["--bundle", str(node_dir)] if step[0] != "start" else []
            r = subprocess.run(
                [runtime(), *step, *bundle, cid],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                check=False,
            )
            if r.returncode != 0:
                console_ring.settle(log)  # crun's message, through the reader
                lines = log.read_text(errors="replace").strip().splitlines()
                why = lines[-1] if lines else f"crun exit {r.returncode}"
                raise HpvcError(f"container {cid}", why)
            if step == ["create"]:
                mountns.harden_root(container_pid(cid))
    finally:
        os.close(out)
    return cid


def container_state(cid: str) -> str:
    """crun's view: running, stopped, created, or 'missing'."""
    r = subprocess.run([runtime(), "state", cid], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return "missing"
    state = json.loads(r.stdout)
    return str(state.get("status", "unknown"))


def container_pid(cid: str) -> int:
    """The host PID of a running node's init."""
    r = subprocess.run([runtime(), "state", cid], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise HpvcError(f"container {cid}", "is not running", "hpvc node down, then retry")
    return int(json.loads(r.stdout)["pid"])


def exec_argv(cid: str, argv: list[str], env: list[str] | None = None) -> list[str]:
    """The crun command that runs ``argv`` inside a node (stdio passed through)."""
    out = [runtime(), "exec"]
    for kv in env or []:
        out += ["--env", kv]
    return [*out, cid, *argv]


def tty_env() -> list[str]:
    """What a command on a terminal needs of the caller's environment: its
    TERM (crun exec gives a node's command the node's environment only)."""
    return [f"TERM={os.environ.get('TERM') or 'xterm'}"]


def command_status(root: Path, argv0: str, path: str) -> int | None:
    """What a shell would exit with for ``argv0`` in the filesystem at ``root``:
    127 when there is no such command (on ``path``), 126 when it is not an
    executable file, None when it is one (crun exec says 255 for both)."""
    if "/" in argv0:
        candidates = [argv0 if argv0.startswith("/") else f"/{argv0}"]
    else:
        candidates = [f"{d or '.'}/{argv0}" for d in path.split(":")]
    found = False
    for c in candidates:
        host = root / c.lstrip("/")
        if not os.path.lexists(host):
            continue
        found = True
        if host.is_file() and os.access(host, os.X_OK):
            return None
    return 126 if found else 127


def update_cpus(cid: str, cpus: str) -> None:
    """Move a running node to another CPU set (a floating node around new pins)."""
    _run([runtime(), "update", "--cpuset-cpus", cpus, cid], f"container {cid}")

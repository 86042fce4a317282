"""What hpvc left on this host that no cluster owns any more, found by name, and its removal.

Normally every change is undone from a journal (``hpvc down``). When a
journal itself is lost (a state directory deleted by hand, a disk that was
wiped, a crash before the journal line reached the disk) the objects stay;
``hpvc gc`` finds them by the names hpvc gives (as pcocc sweeps stray taps).
This module finds what a cluster leaves whatever its nodes are:

- network namespaces ``hpvc-<cluster>-<node>``,
- bridges ``hpvc-...``, node veths ``hc`` + 13 hex digits, VM taps ``hv`` + 12
  hex digits (names hashed from cluster and node: ``hpvc.host.net``),
- cgroups ``<hierarchy>/hpvc/<cluster>``,
- the processes of a cluster's host-side NFS server (Ganesha and its
  rpcbind, in ``hpvc/<cluster>/nfs-server``: ``hpvc.host.io_coord.SERVER``),
  which keep the cgroup, the export's mount and its loop device busy,
- mounts below the state directory's ``clusters/<cluster>/`` (``hpvc.paths``).

What one kind of node leaves (containers and their namespace holders, QEMU
processes, libvirt domains) its backend finds and removes (``Backend.orphans``),
with ``Keep`` and ``Orphan`` from here. An object is an orphan when it matches
these names, the cluster it names is not one the caller keeps, and (for
interfaces) its exact name is not one of the kept clusters' interfaces.
Removal is by that name or PID only.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute, NetlinkError  # type: ignore[import-untyped]
from pyroute2 import netns as pr_netns

from hpvc.host import procfs
from hpvc.host.cgroupfs.base import all_hierarchies, procs
from hpvc.host.cgroups import PARENT
from hpvc.host.io_coord import SERVER
from hpvc.host.nfs_server import STOP_WAIT_S
from hpvc.host.probe import read_mounts
from hpvc.paths import Layout
from hpvc.sysroot import HOST

NETNS_DIR = Path("/run/netns")
_NODE_LINK = re.compile(r"(hc[0-9a-f]{13}|hv[0-9a-f]{12})")


@dataclass(frozen=True)
class Keep:
    """What belongs to the clusters that still exist (their records)."""

    clusters: frozenset[str]
    links: frozenset[str]  # bridges, veths and taps of those clusters
    state_dir: Path

    def owns(self, name: str) -> bool:
        """Is ``hpvc-<cluster>-...`` one of the kept clusters' (cluster names may hold '-')?"""
        return any(name.startswith(f"hpvc-{c}-") for c in self.clusters)

    def stray(self, name: str, prefix: str) -> bool:
        """Is ``name`` one hpvc gives (``hpvc-<cluster>-...``) for a cluster whose name
        starts with ``prefix``, and none of the kept clusters'?"""
        return name.startswith(f"hpvc-{prefix}") and not self.owns(name)


@dataclass(frozen=True)
class Orphan:
    kind: str  # server | netns | link | cgroup | mount here; a backend's own: container, ...
    name: str  # what it is removed by: id, name, path or PID
    detail: str = ""


def _netns(keep: Keep, prefix: str) -> list[Orphan]:
    if not NETNS_DIR.is_dir():
        return []
    names = sorted(p.name for p in NETNS_DIR.iterdir())
    return [Orphan("netns", n) for n in names if keep.stray(n, prefix)]


def _links(keep: Keep, prefix: str) -> list[Orphan]:
    out: list[Orphan] = []
    with IPRoute() as ipr:
        for link in ipr.get_links():
            name = str(link.get_attr("IFLA_IFNAME"))
            kind = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
            if name in keep.links:
                continue
            bridge = kind == "bridge" and name.startswith(f"hpvc-{prefix}")
            node = kind in ("veth", "tun") and _NODE_LINK.fullmatch(name) and not prefix
            if bridge or node:
                out.append(Orphan("link", name, str(kind)))
    return out


def _cgroups(keep: Keep, prefix: str) -> list[Orphan]:
    found = {
        str(d)
        for hierarchy in all_hierarchies(HOST)  # every v1 one, or the cgroup2 tree
        for d in Path(hierarchy).glob(f"{PARENT}/{prefix}*")
        if d.is_dir() and d.name not in keep.clusters
    }
    return [Orphan("cgroup", d) for d in sorted(found)]


def _servers(keep: Keep, prefix: str) -> list[Orphan]:
    """The processes left in a lost cluster's NFS server cgroup, by PID."""
    found: dict[int, str] = {}
    for hierarchy in all_hierarchies(HOST):
        for d in Path(hierarchy).glob(f"{PARENT}/{prefix}*/{SERVER}"):
            if d.parent.name not in keep.clusters:
                found |= dict.fromkeys(procs(d), d.parent.name)
    return [Orphan("server", str(pid), f"{cluster}: {procfs.thread_name(pid, pid) or '?'}")
            for pid, cluster in sorted(found.items())]  # fmt: skip


def _in_server_cgroup(pid: int) -> bool:
    """Whether ``pid`` still runs in some cluster's NFS server cgroup (not reused)."""
    try:
        lines = (Path("/proc") / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(f"/{PARENT}/" in line and line.endswith(f"/{SERVER}") for line in lines)


def _stop_server(name: str) -> None:
    """SIGTERM, then SIGKILL (``nfs_server``'s waits), while the PID is still in a
    server cgroup: by PID, as its record, which ``nfs_server.stop`` needs, is lost."""
    pid = int(name)
    for sig, seconds in zip((signal.SIGTERM, signal.SIGKILL), STOP_WAIT_S, strict=True):
        if not _in_server_cgroup(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + seconds
        while _in_server_cgroup(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if _in_server_cgroup(pid):
        raise OSError(f"PID {pid} still runs after SIGKILL")


def _mounts(keep: Keep, prefix: str) -> list[Orphan]:
    layout = Layout(keep.state_dir)
    out = []
    for m in read_mounts():
        cluster = layout.cluster_of(m.target)
        if cluster is not None and cluster.startswith(prefix) and cluster not in keep.clusters:
            out.append(Orphan("mount", m.target, m.fstype))
    # Deepest first, so a mount below another goes before it.
    return sorted(out, key=lambda o: -o.name.count("/"))


def find(keep: Keep, prefix: str = "") -> list[Orphan]:
    """What any cluster whose name starts with ``prefix`` may have left, in removal
    order (after its backend's own orphans, which hold some of these: ``Backend.orphans``)."""
    return [
        *_servers(keep, prefix),  # they hold the export's mount and the cgroup
        *_mounts(keep, prefix),
        *_netns(keep, prefix),
        *_links(keep, prefix),
        *_cgroups(keep, prefix),
    ]


def _rmdir_tree(top: Path) -> None:
    """Remove a cgroup directory bottom-up (only empty groups can go)."""
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        d.rmdir()
    top.rmdir()


def _remove_netns(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        pr_netns.remove(str(NETNS_DIR / name))


def _remove_link(name: str) -> None:
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
        if found:
            with contextlib.suppress(NetlinkError):  # gone with its peer meanwhile
                ipr.link("del", index=found[0])


def _remove_mount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True, check=True)


_REMOVE: dict[str, Callable[[str], None]] = {
    "server": _stop_server,
    "netns": _remove_netns,
    "link": _remove_link,
    "cgroup": lambda path: _rmdir_tree(Path(path)),
    "mount": _remove_mount,
}


def remove(o: Orphan) -> None:
    """Remove one of ``find``'s orphans; raises OSError or CalledProcessError when
    the kernel refuses."""
    how = _REMOVE.get(o.kind)
    if how is None:
        raise ValueError(f"not an orphan of {__name__}: {o.kind} {o.name}")
    how(o.name)

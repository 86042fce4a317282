"""What hpvc left on this host that no cluster owns any more, found by name, and its removal.

Normally every change is undone from a journal (``hpvc down``). When a
journal itself is lost (a state directory deleted by hand, a disk that was
wiped, a crash before the journal line reached the disk) the objects stay;
``hpvc gc`` finds them by the names hpvc gives (as pcocc sweeps stray taps):

- containers and network namespaces ``hpvc-<cluster>-<node>``,
- bridges ``hpvc-...``, node veths ``hc`` + 13 hex digits, VM taps ``hv`` + 12
  hex digits (names hashed from cluster and node: ``hpvc.host.net``),
- cgroups ``<hierarchy>/hpvc/<cluster>``,
- QEMU processes run as ``-name hpvc-<cluster>-<node>``, and the namespace
  holders of container clusters (``$HPVC_HOLDER=<cluster>`` in their environment),
- mounts below ``<state dir>/clusters/<cluster>/``.

An object is an orphan when it matches these names, the cluster it names is
not one the caller keeps, and (for interfaces) its exact name is not one of
the kept clusters' interfaces. Removal is by that name or PID only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute, NetlinkError  # type: ignore[import-untyped]
from pyroute2 import netns as pr_netns

from hpvc.host import procfs
from hpvc.host.cgroupfs.base import all_hierarchies
from hpvc.host.cgroups import PARENT
from hpvc.host.probe import read_mounts
from hpvc.paths import Layout
from hpvc.sysroot import HOST

NETNS_DIR = Path("/run/netns")
HOLDER_ENV = "HPVC_HOLDER"  # set by hpvc.backends.crun.container.start_holder
_NODE_LINK = re.compile(r"(hc[0-9a-f]{13}|hv[0-9a-f]{12})")


@dataclass(frozen=True)
class Keep:
    """What belongs to the clusters that still exist (their records)."""

    clusters: frozenset[str]
    links: frozenset[str]  # bridges, veths and taps of those clusters
    state_dir: Path


@dataclass(frozen=True)
class Orphan:
    kind: str  # container | netns | link | cgroup | qemu | mount
    name: str  # what it is removed by: id, name, path or PID
    detail: str = ""


def _owned(name: str, keep: Keep) -> bool:
    """Is ``hpvc-<cluster>-...`` one of the kept clusters' (cluster names may hold '-')?"""
    return any(name.startswith(f"hpvc-{c}-") for c in keep.clusters)


def _containers(keep: Keep, prefix: str) -> list[Orphan]:
    try:
        r = subprocess.run(["crun", "list", "-q"], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return []
    return [
        Orphan("container", cid)
        for cid in r.stdout.split()
        if cid.startswith(f"hpvc-{prefix}") and not _owned(cid, keep)
    ]


def _netns(keep: Keep, prefix: str) -> list[Orphan]:
    if not NETNS_DIR.is_dir():
        return []
    return [
        Orphan("netns", p.name)
        for p in sorted(NETNS_DIR.iterdir())
        if p.name.startswith(f"hpvc-{prefix}") and not _owned(p.name, keep)
    ]


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


def _qemus(keep: Keep, prefix: str) -> list[Orphan]:
    out: list[Orphan] = []
    for pid in procfs.pids():
        args = procfs.cmdline(pid) or []
        if not args or "qemu-system" not in os.path.basename(args[0]):
            continue
        names = [b.split(",")[0] for a, b in itertools.pairwise(args) if a == "-name"]
        for n in names:
            n = n.removeprefix("guest=")
            if n.startswith(f"hpvc-{prefix}") and not _owned(n, keep):
                out.append(Orphan("qemu", str(pid), n))
    return out


def _holders(keep: Keep, prefix: str) -> list[Orphan]:
    """Namespace holders (``unshare ... sleep``) named by $HPVC_HOLDER in their environment."""
    out: list[Orphan] = []
    for pid in procfs.pids():
        cluster = procfs.environ(pid).get(HOLDER_ENV)
        args = procfs.cmdline(pid) or [""]
        if cluster is None or os.path.basename(args[0]) != "unshare":
            continue
        if cluster.startswith(prefix) and cluster not in keep.clusters:
            out.append(Orphan("holder", str(pid), cluster))
    return out


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
    """Every orphan of clusters whose names start with ``prefix``; in removal order."""
    return [
        *_qemus(keep, prefix),
        *_containers(keep, prefix),
        *_holders(keep, prefix),
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


def remove(o: Orphan) -> None:
    """Remove one orphan; raises OSError or CalledProcessError when the kernel refuses."""
    if o.kind == "container":
        subprocess.run(["crun", "delete", "-f", o.name], capture_output=True, check=True)
    elif o.kind == "netns":
        with contextlib.suppress(FileNotFoundError):
            pr_netns.remove(str(NETNS_DIR / o.name))
    elif o.kind == "link":
        with IPRoute() as ipr:
            found = ipr.link_lookup(ifname=o.name)
            if found:
                with contextlib.suppress(NetlinkError):  # gone with its peer meanwhile
                    ipr.link("del", index=found[0])
    elif o.kind == "cgroup":
        _rmdir_tree(Path(o.name))
    elif o.kind == "qemu":
        pid = int(o.name)
        if o.detail and o.detail in " ".join(procfs.cmdline(pid) or []):
            os.kill(pid, signal.SIGKILL)  # the PID still runs that QEMU: not a reused one
    elif o.kind == "holder":
        pid = int(o.name)
        if procfs.environ(pid).get(HOLDER_ENV) == o.detail:  # not a reused PID
            os.kill(pid, signal.SIGKILL)  # unshare --kill-child takes its child along
    elif o.kind == "mount":
        subprocess.run(["umount", "-l", o.name], capture_output=True, check=True)
    else:
        raise ValueError(f"unknown orphan kind {o.kind!r}")

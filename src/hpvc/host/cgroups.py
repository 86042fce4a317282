"""cgroups of hpvc clusters, with undo and read-back, on any layout.

Layout: ``/hpvc`` (shared by every cluster, never exclusive) holds
``/hpvc/<cluster>``, which holds the cluster's CPUs and memory nodes. crun
creates each node's cgroup ``/hpvc/<cluster>/<node>`` from ``cgroupsPath``
(cgroupfs manager), so the nodes nest under the cluster's cpuset. How a layout
does each of these (v1: every hierarchy crun uses; v2: the unified tree) is its
manager's (``hpvc.host.cgroupfs``, chosen once from the host's layout); this
module names the cgroups, journals each change before it is made, undoes it,
and reads a node's limits and tasks back through the manager.

Exclusive CPUs: the kernel (v1 ``cpuset.cpu_exclusive``, v2
``cpuset.cpus.partition``) makes a cpuset exclusive only when its parent is.
``/hpvc`` stays non-exclusive (HOST-NOTES: an exclusive top-level cpuset breaks
Slurm and crun, which create cpusets beside it with the root's CPUs), so a
cluster asked to be exclusive gets the flag only where an administrator made
``/hpvc`` exclusive; otherwise ``ClusterCgroup.notes`` says so and the CPUs
stay exclusive by hpvc's own reservations. ``read_node_limits`` reports what
the kernel holds.

Undo kinds (architecture rule 5):

``"cgroup"`` ``{root, path, hierarchies}``
    removes ``path`` and everything below it (node cgroups a failed ``crun run``
    left), leaf first, in every cgroup hierarchy mounted then or at undo time:
    crun also makes the path in ``name=systemd`` and in the cgroup2 tree of a
    hybrid host and leaves the parents behind. Then ``/hpvc`` goes too if no
    cluster is left in it. Only ``rmdir``: a cgroup with tasks is kept, and the
    undo raises ``HpvcError`` listing the PIDs (hpvc never kills them).
``"cgroup-v1-mount"`` ``{root, target, controller, created_dir}``
    host-wide, for the host journal: binding hugetlb to v1 (crun 1.8 refuses a
    hybrid host otherwise). Its undo unmounts only when nothing uses the
    hierarchy (no cgroup below its root, no ``/hpvc`` in any hierarchy), else it
    leaves the mount, which is what crun needs anyway, and says so in the log.
    So another cluster relying on it is never broken.

Block I/O (the bfq scheduler, undo kind ``"blk-scheduler"``) is in
``hpvc.host.blkio``. Every function takes ``root`` (``/`` or a fake tree);
mounts and unmounts go through ``_runner``, which refuses a fake root unless a
test set it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc.errors import HpvcError, InputError
from hpvc.host.blkio import THROTTLES, Runner, require_bfq
from hpvc.host.cgroupfs import find_manager, manager
from hpvc.host.cgroupfs.base import CgroupManager, Version, all_hierarchies, procs, subdirs
from hpvc.host.command import at as _at
from hpvc.host.command import host_run as _host_run
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.probe import read_mounts
from hpvc.locks import file_lock
from hpvc.plan.model import IOPlan
from hpvc.sysroot import HOST, RootLike, as_root
from hpvc.units import format_cpulist, parse_cpulist

PARENT = "hpvc"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_log = logging.getLogger(__name__)


_runner: Runner = _host_run
_rmdir: Callable[[Path], None] = os.rmdir


def _run(root: RootLike, argv: Sequence[str]) -> None:
    if not as_root(root).is_host and _runner is _host_run:
        raise RuntimeError(f"refusing to run {list(argv)} for the fake root {root}")
    _runner(argv)


# --- names ---------------------------------------------------------------------------


def check_name(what: str, name: str) -> None:
    """Refuse ``name`` (of a ``what``: cluster, node) unless it is usable as a cgroup name."""
    if not _NAME.fullmatch(name):
        raise InputError(
            f"{what} name {name!r}",
            "not usable as a cgroup name",
            "use letters, digits, '_', '.', '-' (at most 64, not starting with '.' or '-')",
        )


def cluster_path(cluster: str) -> str:
    return f"/{PARENT}/{cluster}"


def node_path(cluster: str, node: str) -> str:
    """cgroupsPath of a node's container (what crun creates)."""
    return f"/{PARENT}/{cluster}/{node}"


def _cpulist(value: str | Iterable[int]) -> str:
    cpus = parse_cpulist(value) if isinstance(value, str) else list(value)
    return format_cpulist(cpus)


# --- hugetlb on v1 -------------------------------------------------------------------


V1_MOUNT_LOCK = "/run/hpvc-cgroup-v1.lock"


@contextmanager
def v1_mount_lock(root: RootLike = HOST) -> Iterator[None]:
    """Held while hugetlb is bound to v1 and a cluster's cgroups are made in
    every hierarchy, and while the binding's undo looks for users and
    unmounts. Without it a job ending on the host could unmount hugetlb
    between another job's check that it is bound and that job's mkdir: in
    CI a share went without its hugetlb cgroup (and cap), and another left
    one behind. A root-only file in /run (0600: no other user can open it,
    so none can hold it and stall every job), which every hpvc process on
    the host sees; none where the root has no /run (a test's root)."""
    path = _at(root, V1_MOUNT_LOCK)
    if not path.parent.is_dir():
        yield
        return
    with file_lock(path):
        yield


def ensure_hugetlb_v1(journal: Journal, root: RootLike = HOST) -> bool:
    """Bind hugetlb to cgroup v1 where the host uses v1 without it; True when hpvc mounted it.

    Host-wide: pass the host journal. crun 1.8 refuses a hybrid host until this is done.
    """
    m = find_manager(root)
    target = m.hugetlb_mount_target() if m is not None else None
    if target is None:
        return False
    real = _at(root, target)
    journal.record(
        "cgroup-v1-mount",
        root=str(root),
        target=target,
        controller="hugetlb",
        created_dir=not real.exists(),
    )
    real.mkdir(exist_ok=True)
    try:
        _run(root, ["mount", "-t", "cgroup", "-o", "hugetlb", "cgroup", str(real)])
    except HpvcError as e:
        now = find_manager(root)
        if now is not None and now.hugetlb_mount_target() is None:
            return False  # a concurrent `up` bound it first: the same host-wide state
        raise HpvcError(
            "bind hugetlb to cgroup v1",
            e.why,
            "check that no cgroup2 cgroup.subtree_control enables hugetlb",
        ) from e
    return True


def _hpvc_cgroups_left(root: RootLike) -> list[str]:
    return [t for t in all_hierarchies(root) if (_at(root, t) / PARENT).is_dir()]


@undoer("cgroup-v1-mount")
def _undo_v1_mount(args: Args) -> None:
    root, target = Path(args["root"]), args["target"]
    real = _at(root, target)
    with v1_mount_lock(root):
        mounted = any(
            m.target == target and m.fstype == "cgroup" and args["controller"] in m.options
            for m in read_mounts(root)
        )
        if mounted:
            users = [p.name for p in subdirs(real)] + _hpvc_cgroups_left(root)
            if users:
                _log.info("leaving %s mounted: still used by %s", target, ", ".join(users))
                return
            _run(root, ["umount", str(real)])
    if args.get("created_dir"):
        with suppress(OSError):
            real.rmdir()


# --- cluster cgroups -----------------------------------------------------------------


@dataclass(frozen=True)
class ClusterCgroup:
    """What ``ensure_cluster_cgroup`` left in the kernel."""

    path: str  # "/hpvc/<cluster>", the same in every hierarchy
    version: Version
    dirs: tuple[Path, ...]
    exclusive: bool  # what the kernel holds, not what was asked
    notes: tuple[str, ...] = ()


def ensure_cluster_cgroup(
    journal: Journal,
    cluster: str,
    *,
    cpus: str | Iterable[int],
    mems: str | Iterable[int],
    exclusive: bool,
    root: RootLike = HOST,
) -> ClusterCgroup:
    """Create ``/hpvc/<cluster>`` with the cluster's CPUs and memory nodes (undo kind "cgroup")."""
    check_name("cluster", cluster)
    cpus_s, mems_s = _cpulist(cpus), _cpulist(mems)
    m = manager(root)
    targets = m.hierarchies()
    rel = cluster_path(cluster)
    journal.record("cgroup", root=str(root), path=rel, hierarchies=targets)
    excl, notes = m.make_cluster(PARENT, cluster, cpus_s, mems_s, exclusive)
    dirs = tuple(_at(root, t) / PARENT / cluster for t in targets)
    return ClusterCgroup(rel, m.version, dirs, excl, tuple(notes))


def limit_cluster(
    cluster: str, memory_mib: int, hugetlb_mib: dict[int, int], root: RootLike = HOST
) -> list[str]:
    """Cap ``/hpvc/<cluster>`` (made by ``ensure_cluster_cgroup``) at its nodes'
    normal memory (``memory_mib``) and hugepages (``hugetlb_mib``: page KiB ->
    MiB; every other size the host has: none), so that what its nodes use
    together stays within what the plan gives them whatever each node's own
    limits say. The limits go with the cgroup (no undo of their own)."""
    check_name("cluster", cluster)
    huge = {size: mib << 20 for size, mib in hugetlb_mib.items()}
    return manager(root).limit_memory(cluster_path(cluster), memory_mib << 20, huge)


@undoer("cgroup")
def _undo_cgroup(args: Args) -> None:
    root, rel = Path(args["root"]), args["path"].strip("/")
    parts = rel.split("/")
    if len(parts) < 2 or parts[0] != PARENT or not all(_NAME.fullmatch(p) for p in parts[1:]):
        raise HpvcError(f"undo cgroup {args['path']!r}", f"not a path below /{PARENT}")
    targets = dict.fromkeys([*args.get("hierarchies", []), *all_hierarchies(root)])
    busy: dict[str, list[int]] = {}
    for target in targets:
        base = _at(root, target)
        busy.update(_remove_tree(base / rel))
        _prune(base, rel)
    if busy:
        listed = "; ".join(f"{d}: {' '.join(map(str, p))}" for d, p in busy.items())
        raise HpvcError(
            f"remove cgroup /{rel}",
            f"tasks are still in it ({listed})",
            "stop those processes (hpvc down stops the cluster's nodes), then undo again",
        )


def _remove_tree(top: Path) -> dict[str, list[int]]:
    """rmdir ``top`` and every cgroup below it, leaf first; return the busy ones' PIDs."""
    if not top.is_dir():
        return {}
    busy: dict[str, list[int]] = {}
    for dirpath, _, _ in os.walk(top, topdown=False):
        d = Path(dirpath)
        pids = procs(d)
        if pids:
            busy[str(d)] = pids
            continue
        if subdirs(d):
            continue  # a busy cgroup below
        try:
            _rmdir(d)
        except FileNotFoundError:
            continue
        except OSError as e:
            busy.setdefault(str(d), procs(d))
            _log.warning("cannot remove %s: %s", d, e.strerror or e)
    return busy


def _prune(base: Path, rel: str) -> None:
    """rmdir the now-empty ancestors of ``rel`` (``/hpvc`` when no cluster is left)."""
    parent = Path(rel).parent
    while parent != Path("."):
        d = base / parent
        if not d.is_dir() or subdirs(d) or procs(d):
            return
        try:
            _rmdir(d)
        except OSError:
            return  # another cluster is being created in it right now
        parent = parent.parent


def cluster_cgroup_exists(cluster: str, root: RootLike = HOST) -> bool:
    """Does ``/hpvc/<cluster>`` exist in any cgroup hierarchy."""
    check_name("cluster", cluster)
    rel = cluster_path(cluster)
    return any((_at(root, t) / rel.lstrip("/")).is_dir() for t in all_hierarchies(root))


def remove_empty(rel: str, root: RootLike = HOST) -> None:
    """rmdir ``rel`` in every cgroup hierarchy where it is left empty (a failed
    ``crun run`` leaves its cgroups behind, HOST-NOTES); busy ones stay."""
    rel = rel.strip("/")
    if not rel:
        return
    for base in all_hierarchies(root):
        d = _at(root, base) / rel
        if d.is_dir() and not procs(d):
            with suppress(OSError):
                d.rmdir()


# --- a node's cgroup -----------------------------------------------------------------


def _node_dir(m: CgroupManager, cluster: str, node: str, controller: str) -> Path:
    d = m.dir(controller, node_path(cluster, node))
    if d is None or not d.is_dir():
        raise HpvcError(
            f"node {node} of cluster {cluster}",
            f"no {controller} cgroup {node_path(cluster, node)}",
            "is the node running? its container's cgroup appears when it starts",
        )
    return d


def apply_node_extras(
    cluster: str,
    node: str,
    *,
    io: IOPlan | None,
    device: tuple[int, int] | None,
    root: RootLike = HOST,
) -> list[str]:
    """Set what crun cannot (bfq weight) and check crun's throttles; return what was set."""
    if io is None:
        return []
    check_name("cluster", cluster)
    check_name("node", node)
    m = manager(root)
    d = _node_dir(m, cluster, node, "blkio")
    done: list[str] = []
    if io.weight is not None:
        if device is not None:
            require_bfq(device, f"block I/O weight {io.weight} of {d}", root)
        done.append(m.set_io_weight(d, io.weight))
    wanted = {name: getattr(io, name) for name, _ in THROTTLES if getattr(io, name) is not None}
    if wanted and device is None:
        done.append("block I/O throttles not checked: no block device given")
    elif wanted and device is not None:
        key = f"{device[0]}:{device[1]}"
        done += [m.check_throttle(d, key, name, value) for name, value in wanted.items()]
    return [line for line in done if line]


def node_tasks(cluster: str, node: str, root: RootLike = HOST) -> list[int]:
    """PIDs in the node's cgroup and below it (empty when it has none)."""
    try:
        check_name("cluster", cluster)
        check_name("node", node)
    except InputError:
        return []  # no cgroup has such a name
    m = find_manager(root)
    return m.tasks(node_path(cluster, node)) if m is not None else []


def read_node_limits(cluster: str, node: str, root: RootLike = HOST) -> dict[str, Any]:
    """The limits the kernel holds for a node (for ``hpvc status``); None: no limit / unknown.

    Keys: cgroup ("v1"|"v2"), path, cpus, mems (the node's), cluster_cpus, cluster_mems,
    cpu_exclusive (of the cluster's cpuset), memory_limit, memory_usage, cpu_shares (v1),
    cpu_weight (v2), cpu_quota_us, cpu_period_us, io {read_bps, write_bps, read_iops,
    write_iops: {"MAJ:MIN": value}}, io_weight (bfq), pids_max, pids_current,
    hugetlb {"2048kB": {limit, usage}} (bytes).
    """
    check_name("cluster", cluster)
    check_name("node", node)
    m = manager(root)
    rel = node_path(cluster, node)
    if not m.exists(rel):
        _node_dir(m, cluster, node, "pids")  # raises the "is it running?" error
    return m.limits(rel, cluster_path(cluster))

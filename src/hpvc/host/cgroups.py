"""cgroups of hpvc clusters (v1, as on these hosts, and v2), with undo and read-back.

Layout: ``/hpvc`` (shared by every cluster, never exclusive; on v1 its cpuset
copies the root's CPUs and memory nodes) holds ``/hpvc/<cluster>``, which holds
the cluster's CPUs and memory nodes. crun creates each node's cgroup
``/hpvc/<cluster>/<node>`` from ``cgroupsPath`` (cgroupfs manager), so the
nodes nest under the cluster's cpuset. On v1 hpvc creates both levels in every
hierarchy crun uses (``CRUN_V1``); on v2 in the unified tree, with the
controllers the root delegates enabled in ``cgroup.subtree_control``.

Long because creating, making exclusive and undoing a cluster's cgroups must
agree on the v1 and v2 layouts in one place; the read-back is in
``hpvc.host.cgroup_limits`` and block I/O in ``hpvc.host.blkio``.

Exclusive CPUs: the kernel (v1 ``cpuset.cpu_exclusive``, v2
``cpuset.cpus.partition``) makes a cpuset exclusive only when its parent is.
``/hpvc`` stays non-exclusive (HOST-NOTES: an exclusive top-level cpuset breaks
Slurm and crun, which create cpusets beside it with the root's CPUs), so a
cluster asked to be exclusive gets the flag only where an administrator made
``/hpvc`` exclusive; otherwise ``ClusterCgroup.notes`` says so and the CPUs
stay exclusive by hpvc's own reservations. ``read_node_limits`` reports what
the kernel holds.

Undo kinds (DESIGN rule 3):

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
``"blk-scheduler"``
    in ``hpvc.host.blkio`` (bfq scheduler switching, block I/O weights and
    throttles), whose public names are re-exported here.

Every function takes ``root`` (``/`` or a fake tree); mounts and unmounts go
through ``_runner`` (modprobe through ``blkio._runner``), which refuses a fake
root unless a test set it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from hpvc.errors import HpvcError, InputError
from hpvc.host.blkio import THROTTLES as THROTTLES
from hpvc.host.blkio import Runner, Version, apply_io
from hpvc.host.blkio import device_name as device_name
from hpvc.host.blkio import ensure_bfq as ensure_bfq
from hpvc.host.blkio import parse_device_map as parse_device_map
from hpvc.host.blkio import parse_io_max as parse_io_max
from hpvc.host.blkio import read_text as _read
from hpvc.host.blkio import write_text as _write
from hpvc.host.command import at as _at
from hpvc.host.command import host_run as _host_run
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.probe import CgroupLayout, cgroup_layout, read_mounts
from hpvc.plan.model import IOPlan
from hpvc.sysroot import HOST, RootLike, as_root
from hpvc.units import format_cpulist, parse_cpulist

PARENT = "hpvc"
CRUN_V1 = ("cpuset", "cpu", "cpuacct", "memory", "blkio", "pids", "hugetlb", "devices", "freezer")
V2_CONTROLLERS = ("cpuset", "cpu", "memory", "io", "pids", "hugetlb")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_log = logging.getLogger(__name__)


_runner: Runner = _host_run
_rmdir: Callable[[Path], None] = os.rmdir


def _run(root: RootLike, argv: Sequence[str]) -> None:
    if not as_root(root).is_host and _runner is _host_run:
        raise RuntimeError(f"refusing to run {list(argv)} for the fake root {root}")
    _runner(argv)


# --- small helpers -------------------------------------------------------------------


def _check_name(what: str, name: str) -> None:
    if not _NAME.fullmatch(name):
        raise InputError(
            f"{what} name {name!r}",
            "not usable as a cgroup name",
            "use letters, digits, '_', '.', '-' (at most 64, not starting with '.' or '-')",
        )


def _cpulist(value: str | Iterable[int]) -> str:
    cpus = parse_cpulist(value) if isinstance(value, str) else list(value)
    return format_cpulist(cpus)


def _version(layout: CgroupLayout) -> Version:
    if layout.v1:
        return "v1"
    if layout.v2_path is not None:
        return "v2"
    raise HpvcError(
        "cgroups", "no cgroup filesystem is mounted", "mount -t cgroup2 none /sys/fs/cgroup"
    )


def _all_hierarchies(root: RootLike) -> list[str]:
    """Mount points of every cgroup hierarchy (v1, named v1 like systemd, cgroup2)."""
    targets = [m.target for m in read_mounts(root) if m.fstype in ("cgroup", "cgroup2")]
    return list(dict.fromkeys(targets))


def _crun_targets(layout: CgroupLayout) -> list[str]:
    """v1 mount points of the controllers crun uses (co-mounted ones once)."""
    return list(dict.fromkeys(layout.v1[c] for c in CRUN_V1 if layout.v1.get(c)))


def _procs(d: Path) -> list[int]:
    return [int(t) for t in (_read(d / "cgroup.procs") or "").split() if t.isdigit()]


def _subdirs(d: Path) -> list[Path]:
    try:
        return [p for p in d.iterdir() if p.is_dir()]
    except OSError:
        return []


# --- hugetlb on v1 -------------------------------------------------------------------


def ensure_hugetlb_v1(journal: Journal, root: RootLike = HOST) -> bool:
    """Bind hugetlb to cgroup v1 where the host uses v1 without it; True when hpvc mounted it.

    Host-wide: pass the host journal. crun 1.8 refuses a hybrid host until this is done.
    """
    layout = cgroup_layout(root)
    if not layout.v1 or "hugetlb" in layout.v1:
        return False
    bases = sorted({str(Path(t).parent) for t in layout.v1.values() if t})
    target = f"{bases[0] if bases else '/sys/fs/cgroup'}/hugetlb"
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
        if "hugetlb" in cgroup_layout(root).v1:
            return False  # a concurrent `up` bound it first: the same host-wide state
        raise HpvcError(
            "bind hugetlb to cgroup v1",
            e.why,
            "check that no cgroup2 cgroup.subtree_control enables hugetlb",
        ) from e
    return True


def _hpvc_cgroups_left(root: RootLike) -> list[str]:
    return [t for t in _all_hierarchies(root) if (_at(root, t) / PARENT).is_dir()]


@undoer("cgroup-v1-mount")
def _undo_v1_mount(args: Args) -> None:
    root, target = Path(args["root"]), args["target"]
    real = _at(root, target)
    mounted = any(
        m.target == target and m.fstype == "cgroup" and args["controller"] in m.options
        for m in read_mounts(root)
    )
    if mounted:
        users = [p.name for p in _subdirs(real)] + _hpvc_cgroups_left(root)
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


def cluster_path(cluster: str) -> str:
    return f"/{PARENT}/{cluster}"


def node_path(cluster: str, node: str) -> str:
    """cgroupsPath of a node's container (what crun creates)."""
    return f"/{PARENT}/{cluster}/{node}"


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
    _check_name("cluster", cluster)
    cpus_s, mems_s = _cpulist(cpus), _cpulist(mems)
    layout = cgroup_layout(root)
    version = _version(layout)
    targets = _crun_targets(layout) if version == "v1" else [layout.v2_path or ""]
    rel = cluster_path(cluster)
    journal.record("cgroup", root=str(root), path=rel, hierarchies=targets)
    if version == "v1":
        excl, notes = _ensure_v1(root, layout, cluster, cpus_s, mems_s, exclusive)
    else:
        excl, notes = _ensure_v2(
            root, _at(root, layout.v2_path or ""), cluster, cpus_s, mems_s, exclusive
        )
    dirs = tuple(_at(root, t) / PARENT / cluster for t in targets)
    return ClusterCgroup(rel, version, dirs, excl, tuple(notes))


def _mkdir(d: Path) -> None:
    try:
        d.mkdir(exist_ok=True)
    except OSError as e:
        raise HpvcError(f"create cgroup {d}", e.strerror or str(e)) from e


def _ensure_v1(
    root: RootLike, layout: CgroupLayout, cluster: str, cpus: str, mems: str, exclusive: bool
) -> tuple[bool, list[str]]:
    notes: list[str] = []
    lacking = [c for c in CRUN_V1 if not layout.v1.get(c)]
    if lacking:
        notes.append(
            f"cgroup v1 lacks {','.join(lacking)}: crun will refuse to start"
            + (" (ensure_hugetlb_v1 binds hugetlb)" if "hugetlb" in lacking else "")
        )
    cpuset_root = _at(root, layout.v1["cpuset"]) if layout.v1.get("cpuset") else None
    for target in _crun_targets(layout):
        base = _at(root, target)
        if base == cpuset_root:
            continue
        _mkdir(base / PARENT)
        _mkdir(base / PARENT / cluster)
    if cpuset_root is None:
        notes.append("no v1 cpuset hierarchy: the cluster's CPUs are not confined")
        return False, notes
    top = cpuset_root / PARENT
    _mkdir(top)
    if _read(top / "cpuset.cpu_exclusive") != "1":
        for name in ("cpuset.cpus", "cpuset.mems"):  # the root's: a superset of any child's
            _write(top / name, _read(cpuset_root / name) or "")
    cl = top / cluster
    _mkdir(cl)
    _write(cl / "cpuset.cpus", cpus)
    _write(cl / "cpuset.mems", mems)
    excl, note = _exclusive_v1(top, cl, exclusive)
    return excl, notes + note


def _exclusive_v1(top: Path, cl: Path, want: bool) -> tuple[bool, list[str]]:
    flag = cl / "cpuset.cpu_exclusive"
    if not want:
        if _read(flag) == "1":
            _write(flag, "0")
        return False, []
    if _read(top / "cpuset.cpu_exclusive") != "1":
        return False, [_not_exclusive_note(cl)]
    try:
        flag.write_text("1")
    except OSError as e:
        siblings = [p.name for p in _subdirs(top) if p != cl]
        raise HpvcError(
            f"make cpuset {cl} exclusive",
            f"{e.strerror or e}: its CPUs overlap another cpuset beside it ({', '.join(siblings)})",
            "give the cluster CPUs no other cluster holds",
        ) from e
    return True, []


def _not_exclusive_note(cl: Path) -> str:
    return (
        f"{cl}: not marked exclusive: the kernel allows that only under an exclusive "
        f"parent, and /{PARENT} stays shared so Slurm and crun can still create cpusets "
        "beside it; hpvc's reservations keep these CPUs to this cluster"
    )


def _ensure_v2(
    root: RootLike, base: Path, cluster: str, cpus: str, mems: str, exclusive: bool
) -> tuple[bool, list[str]]:
    delegated = (_read(base / "cgroup.subtree_control") or "").split()
    wanted = [c for c in V2_CONTROLLERS if c in delegated]
    notes = []
    if len(wanted) < len(V2_CONTROLLERS):
        lacking = ",".join(c for c in V2_CONTROLLERS if c not in wanted)
        notes.append(f"the cgroup2 root does not delegate {lacking}: those limits will not apply")
    top, cl = base / PARENT, base / PARENT / cluster
    _mkdir(top)
    _mkdir(cl)
    for d in (top, cl):
        have = (_read(d / "cgroup.subtree_control") or "").split()
        missing = [f"+{c}" for c in wanted if c not in have]
        if missing:  # one write: the kernel takes all or none
            _write(d / "cgroup.subtree_control", " ".join(missing))
    if "cpuset" not in wanted:
        return False, notes
    _write(cl / "cpuset.cpus", cpus)
    _write(cl / "cpuset.mems", mems)
    if not exclusive:
        return False, notes
    if not (_read(top / "cpuset.cpus.partition") or "").startswith("root"):
        return False, [*notes, _not_exclusive_note(cl)]
    _write(cl / "cpuset.cpus.partition", "root")
    return _read(cl / "cpuset.cpus.partition") == "root", notes


@undoer("cgroup")
def _undo_cgroup(args: Args) -> None:
    root, rel = Path(args["root"]), args["path"].strip("/")
    parts = rel.split("/")
    if len(parts) < 2 or parts[0] != PARENT or not all(_NAME.fullmatch(p) for p in parts[1:]):
        raise HpvcError(f"undo cgroup {args['path']!r}", f"not a path below /{PARENT}")
    targets = dict.fromkeys([*args.get("hierarchies", []), *_all_hierarchies(root)])
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
        pids = _procs(d)
        if pids:
            busy[str(d)] = pids
            continue
        if _subdirs(d):
            continue  # a busy cgroup below
        try:
            _rmdir(d)
        except FileNotFoundError:
            continue
        except OSError as e:
            busy.setdefault(str(d), _procs(d))
            _log.warning("cannot remove %s: %s", d, e.strerror or e)
    return busy


def _prune(base: Path, rel: str) -> None:
    """rmdir the now-empty ancestors of ``rel`` (``/hpvc`` when no cluster is left)."""
    parent = Path(rel).parent
    while parent != Path("."):
        d = base / parent
        if not d.is_dir() or _subdirs(d) or _procs(d):
            return
        try:
            _rmdir(d)
        except OSError:
            return  # another cluster is being created in it right now
        parent = parent.parent


def cluster_cgroup_exists(cluster: str, root: RootLike = HOST) -> bool:
    """Does ``/hpvc/<cluster>`` exist in any cgroup hierarchy."""
    _check_name("cluster", cluster)
    rel = cluster_path(cluster)
    return any((_at(root, t) / rel.lstrip("/")).is_dir() for t in _all_hierarchies(root))


# --- per-node block I/O (the rest is in hpvc.host.blkio) ----------------------------


def _node_dir(root: RootLike, cluster: str, node: str, controller: str) -> tuple[Version, Path]:
    _check_name("cluster", cluster)
    _check_name("node", node)
    layout = cgroup_layout(root)
    version = _version(layout)
    target = layout.v1.get(controller) if version == "v1" else layout.v2_path
    d = _at(root, target or "/nonexistent") / node_path(cluster, node).lstrip("/")
    if not target or not d.is_dir():
        raise HpvcError(
            f"node {node} of cluster {cluster}",
            f"no {controller} cgroup {node_path(cluster, node)}",
            "is the node running? its container's cgroup appears when it starts",
        )
    return version, d


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
    version, d = _node_dir(root, cluster, node, "blkio")
    return apply_io(root, version, d, io, device)


def remove_empty(rel: str, root: RootLike = HOST) -> None:
    """rmdir ``rel`` in every cgroup hierarchy where it is left empty (a failed
    ``crun run`` leaves its cgroups behind, HOST-NOTES); busy ones stay."""
    rel = rel.strip("/")
    if not rel:
        return
    for base in _all_hierarchies(root):
        d = Path(base) / rel
        if d.is_dir() and not _procs(d):
            with suppress(OSError):
                d.rmdir()


# The read-back lives in its own module; its names are kept here for callers.
from hpvc.host.cgroup_limits import node_tasks as node_tasks  # noqa: E402
from hpvc.host.cgroup_limits import read_node_limits as read_node_limits  # noqa: E402

"""The one interface to a host's cgroups, whatever their layout; what both layouts share.

A ``CgroupManager`` answers everything hpvc asks of cgroups: where a cgroup's
folder is for a controller, how to make a cluster's cpuset, block-I/O weights,
throttles and counters, the limits and usage the kernel holds, the tasks in a
cgroup and the ``cgroup.procs`` files a process joins, and what ``hpvc doctor``
says about the layout. ``V1Manager`` (``hpvc.host.cgroupfs.v1``) and
``V2Manager`` (``hpvc.host.cgroupfs.v2``) implement it; ``hpvc.host.cgroupfs``
chooses one, once, from the host's layout (as crun keeps its cgroupfs, systemd
and disabled managers behind one struct, libcrun/cgroup-internal.h). No caller
branches on the version: a difference between the layouts is a method or a
class attribute here.

Removing cgroups is not a manager's: a journaled undo removes what it made in
every hierarchy mounted then or at undo time, whatever the layout
(``hpvc.host.cgroups``), so ``all_hierarchies``, ``procs`` and ``subdirs`` are
plain functions here.

Managers only read and write cgroup files under their root; they record
nothing. Journaling a change before it is made stays with the caller
(``hpvc.host.cgroups``, ``hpvc.host.io_coord``), whose ``@undoer`` kinds are
what older journals name.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from hpvc.errors import HpvcError
from hpvc.host.blkio import read_text, to_int, weight_value, write_text
from hpvc.host.command import at
from hpvc.host.probe import V1_CONTROLLERS, CgroupLayout, proc_cgroups, read_mounts
from hpvc.sysroot import RootLike

Version = Literal["v1", "v2"]
TASK_CONTROLLERS = ("pids", "memory", "cpuset", "freezer")  # where a cgroup's tasks are listed


# --- layout-independent helpers ------------------------------------------------------


def all_hierarchies(root: RootLike) -> list[str]:
    """Mount points of every cgroup hierarchy (v1, named v1 like systemd, cgroup2)."""
    targets = [m.target for m in read_mounts(root) if m.fstype in ("cgroup", "cgroup2")]
    return list(dict.fromkeys(targets))


def procs(d: Path) -> list[int]:
    """PIDs in the cgroup folder ``d`` (empty when it has none or is gone)."""
    return [int(t) for t in (read_text(d / "cgroup.procs") or "").split() if t.isdigit()]


def subdirs(d: Path) -> list[Path]:
    """Child cgroups of ``d``."""
    try:
        return [p for p in d.iterdir() if p.is_dir()]
    except OSError:
        return []


def mkdir(d: Path) -> None:
    """Create the cgroup ``d`` (kept when it exists); an ``HpvcError`` when refused."""
    try:
        d.mkdir(exist_ok=True)
    except OSError as e:
        raise HpvcError(f"create cgroup {d}", e.strerror or str(e)) from e


def hugetlb_size_name(size_kib: int) -> str:
    """2048 -> ``2MB``, 1048576 -> ``1GB`` (hugetlb file names)."""
    for unit, shift in (("GB", 20), ("MB", 10)):
        if size_kib >= 1 << shift and size_kib % (1 << shift) == 0:
            return f"{size_kib >> shift}{unit}"
    return f"{size_kib}KB"


def hugetlb_kib(name: str) -> int | None:
    """``2MB`` -> 2048 (the size in hugetlb.<size>.* file names)."""
    m = re.fullmatch(r"(\d+)([KMG])B", name)
    if not m:
        return None
    return int(m.group(1)) << {"K": 0, "M": 10, "G": 20}[m.group(2)]


def hugetlb_limits(d: Path | None, limit: str, usage: str) -> dict[str, dict[str, int | None]]:
    """``{"2048kB": {"limit": bytes, "usage": bytes}}`` of the hugetlb files in ``d``."""
    out: dict[str, dict[str, int | None]] = {}
    if d is None or not d.is_dir():
        return out
    for f in sorted(d.glob(f"hugetlb.*.{limit}")):
        size = hugetlb_kib(f.name.split(".")[1])
        if size is not None and not f.name.split(".")[2].startswith("rsvd"):
            usage_text = read_text(d / f"hugetlb.{f.name.split('.')[1]}.{usage}")
            out[f"{size}kB"] = {"limit": to_int(read_text(f)), "usage": to_int(usage_text)}
    return out


def _line_keys(fstype: str, options: Sequence[str]) -> list[str]:
    """How /proc/PID/cgroup names the hierarchy of a mount: by its v1 controllers
    and ``name=``, or by nothing (cgroup2); no key for a mount of another type."""
    if fstype == "cgroup2":
        return [""]
    if fstype == "cgroup":
        return [o for o in options if o.startswith("name=") or o in V1_CONTROLLERS]
    return []


def not_exclusive_note(cl: Path, top: str) -> str:
    """Why the cpuset ``cl`` is not exclusive although asked: its parent is shared."""
    return (
        f"{cl}: not marked exclusive: the kernel allows that only under an exclusive "
        f"parent, and /{top} stays shared so Slurm and crun can still create cpusets "
        "beside it; hpvc's reservations keep these CPUs to this cluster"
    )


# --- the interface -------------------------------------------------------------------


class CgroupManager(ABC):
    """The cgroups of one host (``root``: ``/`` or a fake tree) in one layout.

    Paths named ``rel`` are cgroup paths relative to a hierarchy's mount
    (``/hpvc/c1/compute0``), the same in every layout; a ``Path`` is a cgroup's
    folder as this process reaches it (under the root).
    """

    version: ClassVar[Version]
    CONTROLLERS: ClassVar[tuple[str, ...]]  # what hpvc's nodes need (crun's)
    IO_WEIGHT: ClassVar[str]  # the bfq weight file of a cgroup
    HUGETLB_TOTAL: ClassVar[str]  # the line of hugetlb.<size>.numa_stat counting children
    MEMORY_MAX: ClassVar[str]  # a cgroup's memory limit file
    HUGETLB_MAX: ClassVar[str]  # the end of its hugetlb.<size>[.rsvd].<end> limit files

    def __init__(self, root: RootLike, layout: CgroupLayout) -> None:
        self.root = root
        self.layout = layout

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    # --- where ---------------------------------------------------------------------

    @abstractmethod
    def mount(self, controller: str) -> str | None:
        """Mount point (as the host sees it) of the hierarchy holding ``controller``;
        None when none is mounted."""

    def dir(self, controller: str, rel: str) -> Path | None:
        """The folder of cgroup ``rel`` for ``controller`` (it may not exist);
        None when no hierarchy holds ``controller``."""
        mount = self.mount(controller)
        return at(self.root, mount) / rel.strip("/") if mount else None

    @abstractmethod
    def hierarchies(self) -> list[str]:
        """Mount points where hpvc makes its cgroups: each one crun uses, once."""

    def exists(self, rel: str) -> bool:
        """Is cgroup ``rel`` in any of ``hierarchies``."""
        return any((at(self.root, t) / rel.strip("/")).is_dir() for t in self.hierarchies() if t)

    @abstractmethod
    def io_mount(self) -> str | None:
        """Mount point of the hierarchy that throttles block I/O; None when none does."""

    # --- making --------------------------------------------------------------------

    @abstractmethod
    def make_cluster(
        self, top: str, cluster: str, cpus: str, mems: str, exclusive: bool
    ) -> tuple[bool, list[str]]:
        """Make ``/<top>`` (shared by every cluster, never exclusive) and
        ``/<top>/<cluster>`` with ``cpus`` and ``mems`` in every hierarchy crun
        uses; return (exclusive as the kernel holds it, notes for the user)."""

    def limit_memory(self, rel: str, memory: int, hugetlb: dict[int, int]) -> list[str]:
        """Cap cgroup ``rel``'s normal memory at ``memory`` bytes and its hugepages
        of each size the host has at ``hugetlb[size KiB]`` bytes (0 for a size not
        named), faults and reservations both; return what was set."""
        done: list[str] = []
        d = self.dir("memory", rel)
        if d is None or not (d / self.MEMORY_MAX).exists():
            raise HpvcError(f"memory limit of /{rel.strip('/')}", "no memory controller there")
        write_text(d / self.MEMORY_MAX, str(memory))
        done.append(f"{self.MEMORY_MAX} = {memory}")
        h = self.dir("hugetlb", rel)
        files = sorted(h.glob(f"hugetlb.*.{self.HUGETLB_MAX}")) if h is not None else []
        if not files:
            raise HpvcError(f"hugepage limit of /{rel.strip('/')}", "no hugetlb controller there")
        for f in files:
            size = hugetlb_kib(f.name.split(".")[1])
            if size is not None:
                write_text(f, str(hugetlb.get(size, 0)))
                done.append(f"{f.name} = {hugetlb.get(size, 0)}")
        return done

    @abstractmethod
    def enable(self, dirs: Sequence[Path], controllers: Sequence[str]) -> None:
        """Let the children of each of ``dirs`` use ``controllers``."""

    @abstractmethod
    def hugetlb_mount_target(self) -> str | None:
        """Where hugetlb must be mounted for crun (host path); None when it need not be."""

    # --- block I/O -----------------------------------------------------------------

    def set_io_weight(self, d: Path, weight: int) -> str:
        """Write the bfq weight of cgroup ``d`` and check it; say what was set."""
        path = d / self.IO_WEIGHT
        if not path.exists():
            raise HpvcError(f"block I/O weight of {d}", f"no {path.name}", "modprobe bfq")
        write_text(path, str(weight))
        if weight_value(read_text(path)) != weight:
            raise HpvcError(f"block I/O weight of {d}", f"{path.name} reads {read_text(path)!r}")
        return f"{path.name} = {weight}"

    @abstractmethod
    def check_throttle(self, d: Path, key: str, name: str, value: int) -> str:
        """Make cgroup ``d`` hold throttle ``name`` (``read_bps`` ...) = ``value`` on
        device ``key`` (``8:0``); "" when crun had set it, else what was written."""

    @abstractmethod
    def set_bps(self, d: Path, key: str, direction: str, value: int | None) -> None:
        """Throttle ``direction`` (read/write) of device ``key`` to ``value`` bytes/s
        (None: no limit)."""

    @abstractmethod
    def bps_limits(self, d: Path) -> dict[str, dict[str, int | None]]:
        """``{"254:0": {"read": bytes/s or None, "write": ...}}`` held for cgroup ``d``."""

    @abstractmethod
    def io_bytes(self, d: Path) -> dict[str, dict[str, int]]:
        """``{"254:0": {"read": bytes, "write": bytes}}`` charged to cgroup ``d``."""

    # --- reading back --------------------------------------------------------------

    @abstractmethod
    def limits(self, node: str, cluster: str) -> dict[str, Any]:
        """What the kernel holds for cgroup ``node`` below ``cluster`` (both ``rel``):
        the keys of ``hpvc.host.cgroups.read_node_limits``."""

    @abstractmethod
    def cpu_seconds(self, rel: str) -> float | None:
        """CPU seconds cgroup ``rel`` used so far; None when unknown."""

    @abstractmethod
    def hugetlb_mount(self) -> str | None:
        """Mount point whose ``hugetlb.*.numa_stat`` files count hugepages."""

    def hugetlb_numa(self, rel: str, size_kib: int) -> dict[int, int] | None:
        """Bytes of ``size_kib`` hugepages faulted in by cgroup ``rel`` and its children,
        per NUMA node: ``{}`` when the cgroup is not there, None when unreadable."""
        mount = self.hugetlb_mount()
        if mount is None:
            return None
        name = f"hugetlb.{hugetlb_size_name(size_kib)}.numa_stat"
        try:
            text = (at(self.root, mount) / rel.lstrip("/") / name).read_text()
        except FileNotFoundError:
            return {}  # no such cgroup (not started yet, or gone): nothing in use
        except OSError:
            return None
        line = self.HUGETLB_TOTAL
        fields = next((ln.split() for ln in text.splitlines() if ln.startswith(line)), None)
        if fields is None:
            return None
        out: dict[int, int] = {}
        for f in fields[1:]:
            if f.startswith("N") and "=" in f:
                node, value = f[1:].split("=", 1)
                out[int(node)] = int(value)
        return out

    def tasks(self, rel: str) -> list[int]:
        """PIDs in cgroup ``rel`` and below it (empty when it has none)."""
        for controller in TASK_CONTROLLERS:
            d = self.dir(controller, rel)
            if d is None or not d.is_dir():
                continue
            found: set[int] = set()
            for dirpath, _, _ in os.walk(d):
                found.update(procs(Path(dirpath)))
            return sorted(found)
        return []

    def procs_files(self, pid: int, only: Iterable[str] | None = None) -> tuple[str, ...]:
        """The ``cgroup.procs`` files (host paths) of every hierarchy ``pid`` is in,
        or (``only``) of the v1 ones holding one of those controllers and the
        cgroup2 one: where a process that joins ``pid``'s cgroups writes itself."""
        wanted = None if only is None else frozenset(only)
        bases: dict[str, str] = {}  # controller, ``name=...`` or "" (cgroup2) -> mount point
        for m in read_mounts(self.root):
            for k in _line_keys(m.fstype, m.options):
                bases.setdefault(k, m.target)
        out: list[str] = []
        for controllers, path in proc_cgroups(pid, self.root):
            keys = controllers.split(",") if controllers else [""]
            if wanted is not None and keys != [""] and not wanted.intersection(keys):
                continue
            base = next((bases[k] for k in keys if k in bases), None)
            if base is None:
                continue
            found = str(Path(base) / path.lstrip("/") / "cgroup.procs")
            if found not in out and at(self.root, found).exists():
                out.append(found)
        return tuple(out)

    # --- what hpvc doctor says -----------------------------------------------------

    @abstractmethod
    def describe(self) -> str:
        """The layout in one line: its mode and the hierarchies hpvc sees."""

    @abstractmethod
    def problems(self) -> tuple[list[str], list[str]]:
        """(what keeps hpvc's nodes from their limits here, how to fix each)."""

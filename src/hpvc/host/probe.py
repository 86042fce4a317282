"""Read-only readers of what a host offers hpvc: mounts, modules, CPU flags, KVM,
hugepage pools, cgroup layout, block schedulers, devices and tools.

Every reader reads under an injectable root (``hpvc.sysroot.HOST`` or a ``SysRoot``,
``Path`` or ``str`` naming an extracted snapshot or a fake tree), and tool look-ups
go through an injectable ``which``, so tests build fake trees. Nothing here changes
the host: no mounts, no module loading, no writes. The checks built on these
readers (``hpvc doctor``) are in ``hpvc.host.doctor``; the accelerator choice
(with ``HPVC_ACCEL``) in ``hpvc.host.accel``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hpvc.sysroot import HOST, RootLike, as_root
from hpvc.units import parse_cpulist

Accelerator = Literal["kvm", "tcg"]
Which = Callable[[str], str | None]
CgroupMode = Literal["v1", "v2", "hybrid", "none"]

BIN_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")
V1_CONTROLLERS = frozenset(
    (
        *("cpuset", "cpu", "cpuacct", "memory", "blkio", "pids", "hugetlb", "devices"),
        *("freezer", "net_cls", "net_prio", "perf_event", "rdma", "misc"),
    )
)
_KNOWN_CONTROLLERS = V1_CONTROLLERS | {"io"}


# --- small readers -------------------------------------------------------------------


def _at(root: RootLike, abs_path: str) -> Path:
    return as_root(root).at(abs_path)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int:
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else 0


def exists(abs_path: str, root: RootLike = HOST) -> bool:
    """Does ``abs_path`` (a device such as /dev/net/tun) exist under ``root``."""
    return os.path.exists(_at(root, abs_path))


def _unescape(field_: str) -> str:
    """Undo the octal escapes of /proc/mounts (``\\040`` for a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


# --- mounts and modules --------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    """One line of /proc/mounts."""

    source: str
    target: str
    fstype: str
    options: tuple[str, ...]


def read_mounts(root: RootLike = HOST) -> list[Mount]:
    """The mount table (of this process's namespace) under ``root``; empty when unreadable."""
    mounts: list[Mount] = []
    for line in (_read(_at(root, "/proc/mounts")) or "").splitlines():
        parts = line.split()
        if len(parts) >= 4:
            target = _unescape(parts[1])
            mounts.append(Mount(parts[0], target, parts[2], tuple(parts[3].split(","))))
    return mounts


def mounts_under(path: Path, root: RootLike = HOST) -> list[str]:
    """Mount points at or below ``path``, deepest first."""
    top = os.path.realpath(path)
    found = [m.target for m in read_mounts(root)]
    return sorted((p for p in found if p == top or p.startswith(top + "/")), key=len, reverse=True)


def loaded_modules(root: RootLike = HOST) -> frozenset[str]:
    """Kernel modules named in /proc/modules or present under /sys/module."""
    names = {
        line.split()[0]
        for line in (_read(_at(root, "/proc/modules")) or "").splitlines()
        if line.strip()
    }
    sysmod = _at(root, "/sys/module")
    if sysmod.is_dir():
        names.update(p.name for p in sysmod.iterdir())
    return frozenset(names)


# --- CPUs, NUMA and KVM --------------------------------------------------------------


def numa_nodes(root: RootLike = HOST) -> list[tuple[int, Path]]:
    """(node number, its sysfs directory) of every NUMA node, in order."""
    base = _at(root, "/sys/devices/system/node")
    found = [(int(p.name[4:]), p) for p in base.glob("node*") if p.name[4:].isdigit()]
    return sorted(found)


def node_cpus(root: RootLike = HOST) -> dict[int, list[int]]:
    """The CPUs of each NUMA node (empty without /sys/devices/system/node)."""
    return {n: parse_cpulist(_read(p / "cpulist") or "") for n, p in numa_nodes(root)}


def online_cpus(root: RootLike = HOST) -> list[int]:
    """The online CPUs (/sys/devices/system/cpu/online)."""
    text = (_read(_at(root, "/sys/devices/system/cpu/online")) or "").strip()
    return parse_cpulist(text) if text else []


@dataclass(frozen=True)
class KvmState:
    """What decides between KVM and TCG."""

    device: bool
    usable: bool
    cpu_flag: str | None
    pvm: bool

    @property
    def accelerator(self) -> Accelerator:
        return "kvm" if self.usable and self.cpu_flag else "tcg"


def cpu_flags(root: RootLike = HOST) -> frozenset[str]:
    """Union of the ``flags`` lines of /proc/cpuinfo."""
    flags: set[str] = set()
    for line in (_read(_at(root, "/proc/cpuinfo")) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return frozenset(flags)


def probe_kvm(root: RootLike = HOST) -> KvmState:
    """Is /dev/kvm there and usable, does the CPU have vmx/svm, is kvm_pvm loaded."""
    dev = _at(root, "/dev/kvm")
    device = os.path.exists(dev)
    usable = device and os.access(dev, os.R_OK | os.W_OK)
    flags = cpu_flags(root)
    flag = "vmx" if "vmx" in flags else "svm" if "svm" in flags else None
    return KvmState(device, usable, flag, "kvm_pvm" in loaded_modules(root))


def memlock_limits(root: RootLike = HOST) -> tuple[str, str] | None:
    """(soft, hard) max locked memory of this process in bytes or ``unlimited``."""
    for line in (_read(_at(root, "/proc/self/limits")) or "").splitlines():
        if line.startswith("Max locked memory"):
            soft, hard = line.split()[3:5]
            return soft, hard
    return None


# --- hugepages -----------------------------------------------------------------------


@dataclass(frozen=True)
class HugePages:
    """Count of hugepages of one size on one NUMA node (``node`` None: whole system)."""

    node: int | None
    size_kb: int
    total: int
    free: int


def _size_dirs(base: Path) -> list[tuple[int, Path]]:
    found: list[tuple[int, Path]] = []
    for p in base.glob("hugepages-*kB"):
        digits = p.name[len("hugepages-") : -len("kB")]
        if digits.isdigit():
            found.append((int(digits), p))
    return sorted(found)


def hugepage_sizes(root: RootLike = HOST) -> list[int]:
    """Hugepage sizes (kB) the kernel supports."""
    return [kb for kb, _ in _size_dirs(_at(root, "/sys/kernel/mm/hugepages"))]


def hugepage_pools(root: RootLike = HOST) -> list[HugePages]:
    """Total/free hugepages per NUMA node and size (system-wide when no node is listed)."""
    pools: list[HugePages] = []
    nodes: list[tuple[int | None, Path]] = [(n, p / "hugepages") for n, p in numa_nodes(root)]
    if not nodes:
        nodes = [(None, _at(root, "/sys/kernel/mm/hugepages"))]
    for node, base in nodes:
        for kb, d in _size_dirs(base):
            pools.append(
                HugePages(node, kb, _read_int(d / "nr_hugepages"), _read_int(d / "free_hugepages"))
            )
    return pools


def thp_enabled(root: RootLike = HOST) -> str | None:
    """The transparent-hugepage line (``always [madvise] never``), None when absent."""
    return _read(_at(root, "/sys/kernel/mm/transparent_hugepage/enabled"))


# --- cgroups -------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupLayout:
    """Which cgroup controllers are mounted where."""

    mode: CgroupMode
    v1: Mapping[str, str] = field(default_factory=dict)
    v2_path: str | None = None
    v2: tuple[str, ...] = ()


def proc_cgroups(pid: int | str = "self", root: RootLike = HOST) -> list[tuple[str, str]]:
    """(controllers, path) of each line of /proc/PID/cgroup (controllers ``""`` for v2)."""
    out: list[tuple[str, str]] = []
    for line in (_read(_at(root, f"/proc/{pid}/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1], parts[2]))
    return out


def _layout_from_self(root: RootLike) -> CgroupLayout:
    """Fallback when /proc/mounts shows no cgroup: read /proc/self/cgroup."""
    v1: dict[str, str] = {}
    v2 = False
    for controllers, _ in proc_cgroups("self", root):
        v2 = v2 or controllers == ""
        for c in controllers.split(","):
            if c in _KNOWN_CONTROLLERS:
                v1[c] = ""
    mode: CgroupMode = "hybrid" if v1 and v2 else "v1" if v1 else "v2" if v2 else "none"
    return CgroupLayout(mode, v1, "" if v2 else None, ())


def cgroup_layout(root: RootLike = HOST, mounts: Iterable[Mount] | None = None) -> CgroupLayout:
    """v1, v2 or hybrid, from /proc/mounts (and cgroup.controllers of the cgroup2 root)."""
    v1: dict[str, str] = {}
    v2_path: str | None = None
    for m in read_mounts(root) if mounts is None else mounts:
        if m.fstype == "cgroup":
            for c in m.options:
                if c in _KNOWN_CONTROLLERS:
                    v1.setdefault(c, m.target)
        elif m.fstype == "cgroup2" and v2_path is None:
            v2_path = m.target
    if not v1 and v2_path is None:
        return _layout_from_self(root)
    v2: tuple[str, ...] = ()
    if v2_path is not None:
        v2 = tuple((_read(_at(root, v2_path) / "cgroup.controllers") or "").split())
    mode: CgroupMode = "hybrid" if v1 and v2_path is not None else "v1" if v1 else "v2"
    return CgroupLayout(mode, v1, v2_path, v2)


# --- block devices and network -------------------------------------------------------


def block_schedulers(root: RootLike = HOST) -> dict[str, str]:
    """Block device -> its scheduler line (``mq-deadline [bfq] none``), sorted by device."""
    out: dict[str, str] = {}
    for sched in sorted(_at(root, "/sys/block").glob("*/queue/scheduler")):
        text = _read(sched)
        if text is not None:
            out[sched.parent.parent.name] = text
    return out


def bridges(root: RootLike = HOST) -> list[str]:
    """Names of the Linux bridges present (/sys/class/net/*/bridge)."""
    return sorted(p.parent.name for p in _at(root, "/sys/class/net").glob("*/bridge"))


BRIDGE_NF_KNOBS = (
    "bridge-nf-call-iptables",
    "bridge-nf-call-ip6tables",
    "bridge-nf-call-arptables",
)


def bridge_netfilter(root: RootLike = HOST) -> dict[str, int]:
    """br_netfilter's knobs (/proc/sys/net/bridge/bridge-nf-call-*); {} when it is not loaded."""
    out: dict[str, int] = {}
    for knob in BRIDGE_NF_KNOBS:
        text = (_read(_at(root, f"/proc/sys/net/bridge/{knob}")) or "").strip()
        if text.isdigit():
            out[knob] = int(text)
    return out


def udp_binders(port: int, root: RootLike = HOST) -> list[int]:
    """The owner uid of every UDP socket (IPv4 and IPv6) bound to local ``port``
    in this network namespace (/proc/net/udp, /proc/net/udp6); a kernel VXLAN
    link's socket is root's."""
    uids: list[int] = []
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        for line in (_read(_at(root, table)) or "").splitlines()[1:]:
            f = line.split()
            if len(f) > 7 and f[1].rpartition(":")[2].upper() == f"{port:04X}" and f[7].isdigit():
                uids.append(int(f[7]))
    return uids


def net_devices(root: RootLike = HOST) -> list[str]:
    """Network interfaces of this network namespace (/proc/net/dev, which follows the
    reader's namespace where /sys/class/net shows the one sysfs was mounted in)."""
    lines = (_read(_at(root, "/proc/net/dev")) or "").splitlines()[2:]
    return sorted(x.partition(":")[0].strip() for x in lines if ":" in x)


def unprivileged_port_start(root: RootLike = HOST) -> int | None:
    """net.ipv4.ip_unprivileged_port_start: the lowest port any user may bind."""
    text = (_read(_at(root, "/proc/sys/net/ipv4/ip_unprivileged_port_start")) or "").strip()
    return int(text) if text.isdigit() else None


# --- tools ---------------------------------------------------------------------------


def which_under(root: RootLike) -> Which:
    """A ``which`` that looks in the standard bin directories under ``root``."""
    base = as_root(root).path

    def which(name: str) -> str | None:
        for d in BIN_DIRS:
            path = base / d / name
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
        return None

    return which


def host_which(name: str) -> str | None:
    """``shutil.which``, then the sbin directories a user's PATH may lack."""
    return shutil.which(name) or which_under(HOST)(name)


def which_for(root: RootLike = HOST) -> Which:
    """The host's PATH for the real root, the bin directories of a snapshot otherwise."""
    r = as_root(root)
    return host_which if r.is_host else which_under(r)

"""Read-only probes of what a host offers hpvc: accelerator, hugepages, cgroups, tools, network.

Every probe reads under an injectable ``root`` (``/`` or an extracted snapshot), and
tool look-ups go through an injectable ``which``, so tests build fake trees. Nothing
here changes the host: no mounts, no module loading, no writes.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hpvc.units import format_cpulist, parse_cpulist

Status = Literal["ok", "warn", "missing"]
Accelerator = Literal["kvm", "tcg"]
Which = Callable[[str], str | None]
CgroupMode = Literal["v1", "v2", "hybrid", "none"]

STATUSES: tuple[Status, ...] = ("ok", "warn", "missing")
BIN_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")
WANTED_V1 = ("cpuset", "cpu", "cpuacct", "memory", "blkio", "pids", "hugetlb", "devices", "freezer")
WANTED_V2 = ("cpuset", "cpu", "memory", "io", "pids", "hugetlb")
_SHIFT = {"GiB": 20, "MiB": 10, "KiB": 0}
_KNOWN_CONTROLLERS = frozenset(
    (*WANTED_V1, "net_cls", "net_prio", "perf_event", "rdma", "misc", "io")
)


@dataclass(frozen=True)
class Check:
    """One line of the doctor report; ``fix`` is empty when ``status`` is ok."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


def _ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail, "")


@dataclass(frozen=True)
class Report:
    """All checks of one host and the accelerator hpvc will use there."""

    checks: tuple[Check, ...]
    accelerator: Accelerator

    def summary(self) -> dict[str, int]:
        return {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES}

    def as_dict(self) -> dict[str, object]:
        return {
            "checks": [c.as_dict() for c in self.checks],
            "accelerator": self.accelerator,
            "summary": self.summary(),
        }


# --- small readers -------------------------------------------------------------------


def _at(root: Path, abs_path: str) -> Path:
    return root / abs_path.lstrip("/")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int:
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else 0


def _unescape(field_: str) -> str:
    """Undo the octal escapes of /proc/mounts (``\\040`` for a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


@dataclass(frozen=True)
class Mount:
    """One line of /proc/mounts."""

    source: str
    target: str
    fstype: str
    options: tuple[str, ...]


def read_mounts(root: Path = Path("/")) -> list[Mount]:
    """The mount table under ``root`` (empty when unreadable)."""
    mounts: list[Mount] = []
    for line in (_read(_at(root, "/proc/mounts")) or "").splitlines():
        parts = line.split()
        if len(parts) >= 4:
            target = _unescape(parts[1])
            mounts.append(Mount(parts[0], target, parts[2], tuple(parts[3].split(","))))
    return mounts


def loaded_modules(root: Path = Path("/")) -> frozenset[str]:
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


def _fmt_kb(kb: int) -> str:
    unit = next(u for u in ("GiB", "MiB", "KiB") if kb % (1 << _SHIFT[u]) == 0)
    return f"{kb >> _SHIFT[unit]}{unit}"


def _numa_nodes(root: Path) -> list[tuple[int, Path]]:
    base = _at(root, "/sys/devices/system/node")
    found = [(int(p.name[4:]), p) for p in base.glob("node*") if p.name[4:].isdigit()]
    return sorted(found)


# --- accelerator ---------------------------------------------------------------------


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


def cpu_flags(root: Path = Path("/")) -> frozenset[str]:
    """Union of the ``flags`` lines of /proc/cpuinfo."""
    flags: set[str] = set()
    for line in (_read(_at(root, "/proc/cpuinfo")) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return frozenset(flags)


def probe_kvm(root: Path = Path("/")) -> KvmState:
    """Is /dev/kvm there and usable, does the CPU have vmx/svm, is kvm_pvm loaded."""
    dev = _at(root, "/dev/kvm")
    device = os.path.exists(dev)
    usable = device and os.access(dev, os.R_OK | os.W_OK)
    flags = cpu_flags(root)
    flag = "vmx" if "vmx" in flags else "svm" if "svm" in flags else None
    return KvmState(device, usable, flag, "kvm_pvm" in loaded_modules(root))


def accelerator(root: Path = Path("/")) -> Accelerator:
    """The accelerator hpvc uses on this host: ``kvm`` only with vmx/svm, else ``tcg``."""
    return probe_kvm(root).accelerator


def check_accelerator(root: Path = Path("/")) -> Check:
    """KVM when /dev/kvm is usable and the CPU has vmx/svm; otherwise TCG, and why."""
    kvm = probe_kvm(root)
    name = "accelerator"
    if kvm.accelerator == "kvm":
        return _ok(name, f"kvm: /dev/kvm usable, CPU has {kvm.cpu_flag}")
    tcg = "tcg (slow software emulation)"
    if not kvm.device:
        fix = (
            "modprobe kvm_intel or kvm_amd"
            if kvm.cpu_flag
            else "use a host with VT-x/AMD-V enabled in firmware; hpvc runs VMs under TCG meanwhile"
        )
        return Check(name, "warn", f"{tcg}: no /dev/kvm", fix)
    if not kvm.usable:
        return Check(
            name,
            "warn",
            f"{tcg}: /dev/kvm is not readable and writable",
            "run as root or join group kvm",
        )
    why = "/dev/kvm present but the CPU flags have no vmx/svm"
    if kvm.pvm:
        why += " (kvm_pvm loaded: software nested KVM, stock guest kernels stall under it)"
    return Check(
        name, "warn", f"{tcg}: {why}", "none needed here; on a VT-x/AMD-V host hpvc uses KVM"
    )


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


def hugepage_sizes(root: Path = Path("/")) -> list[int]:
    """Hugepage sizes (kB) the kernel supports."""
    return [kb for kb, _ in _size_dirs(_at(root, "/sys/kernel/mm/hugepages"))]


def hugepage_pools(root: Path = Path("/")) -> list[HugePages]:
    """Total/free hugepages per NUMA node and size (system-wide when no node is listed)."""
    pools: list[HugePages] = []
    nodes: list[tuple[int | None, Path]] = [(n, p / "hugepages") for n, p in _numa_nodes(root)]
    if not nodes:
        nodes = [(None, _at(root, "/sys/kernel/mm/hugepages"))]
    for node, base in nodes:
        for kb, d in _size_dirs(base):
            pools.append(
                HugePages(node, kb, _read_int(d / "nr_hugepages"), _read_int(d / "free_hugepages"))
            )
    return pools


def check_hugepages(root: Path = Path("/")) -> Check:
    """Supported sizes and per-node total/free counts."""
    sizes = hugepage_sizes(root)
    if not sizes:
        return Check(
            "hugepages",
            "missing",
            "the kernel offers no hugepages (no /sys/kernel/mm/hugepages)",
            "use a kernel with CONFIG_HUGETLBFS",
        )
    by_node: dict[str, list[str]] = {}
    for pool in hugepage_pools(root):
        where = "system" if pool.node is None else f"node{pool.node}"
        by_node.setdefault(where, []).append(
            f"{_fmt_kb(pool.size_kb)} {pool.total} total {pool.free} free"
        )
    counts = "; ".join(f"{where}: {', '.join(items)}" for where, items in by_node.items())
    return _ok("hugepages", f"sizes {', '.join(_fmt_kb(kb) for kb in sizes)}; {counts}")


def check_hugetlbfs(root: Path = Path("/"), mounts: Iterable[Mount] | None = None) -> Check:
    """Is a hugetlbfs mounted anywhere."""
    found = [
        m for m in (read_mounts(root) if mounts is None else mounts) if m.fstype == "hugetlbfs"
    ]
    if not found:
        return Check(
            "hugetlbfs",
            "warn",
            "no hugetlbfs mounted",
            "hpvc mounts one at `up`; by hand: mkdir -p /dev/hugepages && "
            "mount -t hugetlbfs none /dev/hugepages",
        )
    where = []
    for m in found:
        size = next((o.split("=", 1)[1] for o in m.options if o.startswith("pagesize=")), "")
        where.append(f"{m.target} ({size})" if size else m.target)
    return _ok("hugetlbfs", "mounted at " + ", ".join(where))


def check_thp(root: Path = Path("/")) -> Check:
    """Transparent hugepage mode (informational)."""
    text = _read(_at(root, "/sys/kernel/mm/transparent_hugepage/enabled"))
    if text is None:
        return _ok("transparent-hugepages", "not available")
    chosen = re.search(r"\[(\w+)\]", text)
    mode = chosen.group(1) if chosen else text.strip()
    return _ok(
        "transparent-hugepages", f"{mode} (of: {text.replace('[', '').replace(']', '').strip()})"
    )


# --- cgroups -------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupLayout:
    """Which cgroup controllers are mounted where."""

    mode: CgroupMode
    v1: Mapping[str, str] = field(default_factory=dict)
    v2_path: str | None = None
    v2: tuple[str, ...] = ()


def _layout_from_self(root: Path) -> CgroupLayout:
    """Fallback when /proc/mounts shows no cgroup: read /proc/self/cgroup."""
    v1: dict[str, str] = {}
    v2 = False
    for line in (_read(_at(root, "/proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = True
        for c in parts[1].split(","):
            if c in _KNOWN_CONTROLLERS:
                v1[c] = ""
    mode: CgroupMode = "hybrid" if v1 and v2 else "v1" if v1 else "v2" if v2 else "none"
    return CgroupLayout(mode, v1, "" if v2 else None, ())


def cgroup_layout(root: Path = Path("/"), mounts: Iterable[Mount] | None = None) -> CgroupLayout:
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


def _describe(layout: CgroupLayout) -> str:
    parts = []
    if layout.v1:
        bases = sorted({str(Path(p).parent) for p in layout.v1.values() if p})
        where = f" under {', '.join(bases)}" if bases else ""
        parts.append(f"v1 {','.join(sorted(layout.v1))}{where}")
    if layout.v2_path is not None:
        held = ",".join(layout.v2) or "no controllers"
        parts.append(f"cgroup2 at {layout.v2_path or '?'} with {held}")
    return f"{layout.mode}: " + "; ".join(parts)


def _v1_mount_fix(layout: CgroupLayout, names: Iterable[str]) -> str:
    bases = sorted({str(Path(p).parent) for p in layout.v1.values() if p})
    base = bases[0] if bases else "/sys/fs/cgroup"
    return " && ".join(
        f"mkdir -p {base}/{c} && mount -t cgroup -o {c} cgroup {base}/{c}" for c in names
    )


def check_cgroups(root: Path = Path("/"), mounts: Iterable[Mount] | None = None) -> Check:
    """Mode and controllers; warns on hybrid with controllers on cgroup2 (crun refuses)."""
    layout = cgroup_layout(root, mounts)
    if layout.mode == "none":
        return Check(
            "cgroups",
            "missing",
            "no cgroup filesystem mounted",
            "mount -t cgroup2 none /sys/fs/cgroup",
        )
    detail = _describe(layout)
    problems: list[str] = []
    fixes: list[str] = []
    if layout.mode == "v2":
        lacking = [c for c in WANTED_V2 if c not in layout.v2]
        if lacking:
            problems.append(f"cgroup2 lacks {','.join(lacking)}")
            fixes.append(f"enable {','.join(lacking)} in the kernel / cgroup.subtree_control")
        return _cgroup_check(detail, problems, fixes)
    if layout.mode == "hybrid" and layout.v2:
        problems.append("crun refuses hybrid mode while cgroup2 holds controllers")
        fixes.append(_v1_mount_fix(layout, [c for c in layout.v2 if c not in layout.v1]))
    lacking = [c for c in WANTED_V1 if c not in layout.v1 and c not in layout.v2]
    if lacking:
        problems.append(f"v1 lacks {','.join(lacking)}")
        fixes.append(_v1_mount_fix(layout, lacking))
    return _cgroup_check(detail, problems, fixes)


def _cgroup_check(detail: str, problems: list[str], fixes: list[str]) -> Check:
    if not problems:
        return _ok("cgroups", detail)
    return Check(
        "cgroups", "warn", f"{detail} ({'; '.join(problems)})", "; ".join(f for f in fixes if f)
    )


def check_bfq(root: Path = Path("/")) -> Check:
    """Can blkio weights work: does any block device offer the bfq scheduler."""
    offered, active, total = [], [], 0
    for sched in sorted(_at(root, "/sys/block").glob("*/queue/scheduler")):
        text = _read(sched)
        if text is None:
            continue
        total += 1
        dev = sched.parent.parent.name
        if "bfq" in text.replace("[", " ").replace("]", " ").split():
            offered.append(dev)
        if "[bfq]" in text:
            active.append(dev)
    if not offered:
        why = "no block device offers bfq" if total else "no block device scheduler found"
        return Check("bfq", "warn", f"{why}: blkio weights will not apply", "modprobe bfq")
    return _ok(
        "bfq",
        f"bfq offered by {len(offered)} of {total} block devices, active on "
        f"{', '.join(active) if active else 'none'}",
    )


# --- network -------------------------------------------------------------------------


def check_bridge(root: Path = Path("/")) -> Check:
    """Linux bridge support: module loaded or a bridge already exists."""
    bridges = sorted(p.parent.name for p in _at(root, "/sys/class/net").glob("*/bridge"))
    if bridges:
        return _ok("bridge", f"bridges present: {', '.join(bridges)}")
    if "bridge" in loaded_modules(root):
        return _ok("bridge", "bridge module loaded")
    return Check("bridge", "warn", "bridge module not loaded", "modprobe bridge")


def _device(root: Path, name: str, path: str, status: Status, why: str, fix: str) -> Check:
    if os.path.exists(_at(root, path)):
        return _ok(name, f"{path} present")
    return Check(name, status, f"no {path}: {why}", fix)


def check_tun(root: Path = Path("/")) -> Check:
    """/dev/net/tun, needed for VM taps."""
    return _device(root, "tun", "/dev/net/tun", "missing", "VMs get no tap devices", "modprobe tun")


def check_vhost_net(root: Path = Path("/")) -> Check:
    """/dev/vhost-net, the in-kernel virtio-net datapath (without it: vhost=off)."""
    why = "hpvc uses vhost=off (slower VM networking)"
    return _device(root, "vhost-net", "/dev/vhost-net", "warn", why, "modprobe vhost_net")


def check_veth(root: Path = Path("/")) -> Check:
    """veth pairs for containers (informational: the kernel loads it on first use)."""
    if "veth" in loaded_modules(root):
        return _ok("veth", "veth module loaded")
    return _ok("veth", "veth not loaded yet (the kernel loads it on first use)")


# --- NUMA and limits -----------------------------------------------------------------


def check_numa(root: Path = Path("/")) -> Check:
    """Number of NUMA nodes and their CPUs."""
    nodes = _numa_nodes(root)
    if not nodes:
        online = (_read(_at(root, "/sys/devices/system/cpu/online")) or "").strip()
        count = len(parse_cpulist(online)) if online else 0
        return Check(
            "numa",
            "warn",
            f"no /sys/devices/system/node: treated as one node with {count or '?'} CPUs",
            "use a kernel with CONFIG_NUMA for placement",
        )
    per_node = []
    all_cpus: set[int] = set()
    for n, path in nodes:
        cpus = parse_cpulist(_read(path / "cpulist") or "")
        all_cpus.update(cpus)
        per_node.append(f"node{n}: {format_cpulist(cpus) or 'no CPUs'}")
    noun = "node" if len(nodes) == 1 else "nodes"
    return _ok("numa", f"{len(nodes)} {noun}, {len(all_cpus)} CPUs ({'; '.join(per_node)})")


def check_memlock(root: Path = Path("/")) -> Check:
    """Max locked memory of this process (informational; ``<locked/>`` guests need more)."""
    for line in (_read(_at(root, "/proc/self/limits")) or "").splitlines():
        if line.startswith("Max locked memory"):
            soft, hard = line.split()[3:5]
            text = [v if v == "unlimited" else _fmt_kb(int(v) // 1024) for v in (soft, hard)]
            return _ok("memlock", f"max locked memory {text[0]} (hard {text[1]})")
    return _ok("memlock", "limit unknown (no /proc/self/limits)")


# --- tools ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """A host tool hpvc needs; ``binaries`` maps each program to its Debian package."""

    name: str
    binaries: tuple[tuple[str, str], ...]
    purpose: str
    any_of: bool = False


TOOLS: tuple[Tool, ...] = (
    Tool("crun", (("crun", "crun"),), "container backend"),
    Tool("qemu", (("qemu-system-x86_64", "qemu-system-x86"),), "VM backend"),
    Tool(
        "libvirt",
        (("libvirtd", "libvirt-daemon-system"), ("virsh", "libvirt-clients")),
        "libvirt VM backend",
    ),
    Tool(
        "virt-xml-validate",
        (("virt-xml-validate", "libvirt-clients"), ("xmllint", "libxml2-utils")),
        "domain XML checks",
    ),
    Tool(
        "slurm",
        (("slurmctld", "slurm-wlm"), ("slurmd", "slurm-wlm"), ("srun", "slurm-wlm")),
        "Slurm integration",
    ),
    Tool("munge", (("munged", "munge"),), "Slurm authentication"),
    Tool(
        "mpi",
        (("mpirun.openmpi", "openmpi-bin"), ("mpiexec.mpich", "mpich"), ("mpirun", "openmpi-bin")),
        "MPI jobs",
        any_of=True,
    ),
    Tool("hpcc", (("hpcc", "hpcc"),), "HPC Challenge benchmarks"),
    Tool("fio", (("fio", "fio"),), "block I/O benchmarks"),
    Tool("hwloc", (("hwloc-calc", "hwloc"),), "topology cross-checks"),
    Tool("debootstrap", (("debootstrap", "debootstrap"),), "guest image builds"),
    Tool("iproute2", (("ip", "iproute2"),), "bridges, taps, veths"),
)


def which_under(root: Path) -> Which:
    """A ``which`` that looks in the standard bin directories under ``root``."""

    def which(name: str) -> str | None:
        for d in BIN_DIRS:
            path = root / d / name
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
        return None

    return which


def host_which(name: str) -> str | None:
    """``shutil.which``, then the sbin directories a user's PATH may lack."""
    return shutil.which(name) or which_under(Path("/"))(name)


def check_tool(tool: Tool, which: Which = host_which) -> Check:
    """Found or missing, with the Debian packages to install as the fix."""
    found = {b: p for b, _ in tool.binaries if (p := which(b))}
    lacking = [(b, pkg) for b, pkg in tool.binaries if b not in found]
    if (tool.any_of and found) or not lacking:
        return _ok(tool.name, ", ".join(found.values()))
    if tool.any_of:
        pkgs = list(dict.fromkeys(pkg for _, pkg in tool.binaries))
        fix = "apt-get install " + pkgs[0] + "".join(f" (or {p})" for p in pkgs[1:])
        names = " / ".join(b for b, _ in tool.binaries)
        return Check(tool.name, "missing", f"none of {names} ({tool.purpose})", fix)
    pkgs = list(dict.fromkeys(pkg for _, pkg in lacking))
    names = ", ".join(b for b, _ in lacking)
    return Check(
        tool.name,
        "missing",
        f"{names} not found ({tool.purpose})",
        "apt-get install " + " ".join(pkgs),
    )


# --- everything ----------------------------------------------------------------------


def run_checks(root: Path = Path("/"), which: Which | None = None) -> Report:
    """Every check, in report order. ``which`` defaults to the PATH of ``root``."""
    if which is None:
        which = host_which if root == Path("/") else which_under(root)
    mounts = read_mounts(root)
    checks = [
        check_accelerator(root),
        check_numa(root),
        check_hugepages(root),
        check_hugetlbfs(root, mounts),
        check_thp(root),
        check_cgroups(root, mounts),
        check_bfq(root),
        check_bridge(root),
        check_tun(root),
        check_vhost_net(root),
        check_veth(root),
        check_memlock(root),
        *(check_tool(t, which) for t in TOOLS),
    ]
    return Report(tuple(checks), accelerator(root))

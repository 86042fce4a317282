"""``hpvc doctor``'s checks: what a host offers and lacks for hpvc, each with a fix.

Read-only, and pure over the readers of ``hpvc.host.probe``: every check takes the
root those read under (``HOST`` or a snapshot) and, for tools, a ``which``.

Long because it is a list of small independent checks, one per host facility.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from hpvc.host import probe
from hpvc.host.accel import ACCEL_ENV, accelerator
from hpvc.host.cgroupfs import find_manager
from hpvc.host.probe import Accelerator, Mount, Which
from hpvc.plan.overlay import HOLDER_LINK, SOURCE_PORTS, VXLAN_PORT
from hpvc.sysroot import HOST, RootLike
from hpvc.units import format_cpulist

Status = Literal["ok", "warn", "missing"]

STATUSES: tuple[Status, ...] = ("ok", "warn", "missing")
_SHIFT = {"GiB": 20, "MiB": 10, "KiB": 0}


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


def _fmt_kb(kb: int) -> str:
    unit = next(u for u in ("GiB", "MiB", "KiB") if kb % (1 << _SHIFT[u]) == 0)
    return f"{kb >> _SHIFT[unit]}{unit}"


# --- accelerator ---------------------------------------------------------------------


def check_accelerator(root: RootLike = HOST, env: Mapping[str, str] | None = None) -> Check:
    """KVM when /dev/kvm is usable and the CPU has vmx/svm; otherwise TCG, and why.

    ``HPVC_ACCEL`` (read from ``env``, default the process environment) overrides
    the probe, as it does for ``hpvc up`` and ``hpvc render``.
    """
    choice = accelerator(root, env)
    if choice.forced:
        if choice.warning is None:
            return _ok("accelerator", f"{choice.name}: forced by {ACCEL_ENV}")
        return Check("accelerator", "warn", choice.warning, f"unset {ACCEL_ENV} to probe")
    return _probed_accelerator(probe.probe_kvm(root))


def _probed_accelerator(kvm: probe.KvmState) -> Check:
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


def check_hugepages(root: RootLike = HOST) -> Check:
    """Supported sizes and per-node total/free counts."""
    sizes = probe.hugepage_sizes(root)
    if not sizes:
        return Check(
            "hugepages",
            "missing",
            "the kernel offers no hugepages (no /sys/kernel/mm/hugepages)",
            "use a kernel with CONFIG_HUGETLBFS",
        )
    by_node: dict[str, list[str]] = {}
    for pool in probe.hugepage_pools(root):
        where = "system" if pool.node is None else f"node{pool.node}"
        by_node.setdefault(where, []).append(
            f"{_fmt_kb(pool.size_kb)} {pool.total} total {pool.free} free"
        )
    counts = "; ".join(f"{where}: {', '.join(items)}" for where, items in by_node.items())
    return _ok("hugepages", f"sizes {', '.join(_fmt_kb(kb) for kb in sizes)}; {counts}")


def check_hugetlbfs(root: RootLike = HOST, mounts: Iterable[Mount] | None = None) -> Check:
    """Is a hugetlbfs mounted anywhere."""
    table = probe.read_mounts(root) if mounts is None else mounts
    found = [m for m in table if m.fstype == "hugetlbfs"]
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


def check_thp(root: RootLike = HOST) -> Check:
    """Transparent hugepage mode (informational)."""
    text = probe.thp_enabled(root)
    if text is None:
        return _ok("transparent-hugepages", "not available")
    chosen = re.search(r"\[(\w+)\]", text)
    mode = chosen.group(1) if chosen else text.strip()
    return _ok(
        "transparent-hugepages", f"{mode} (of: {text.replace('[', '').replace(']', '').strip()})"
    )


# --- cgroups and block I/O -----------------------------------------------------------


def check_cgroups(root: RootLike = HOST, mounts: Iterable[Mount] | None = None) -> Check:
    """Mode and controllers; warns on hybrid with controllers on cgroup2 (crun refuses)."""
    m = find_manager(root, mounts)
    if m is None:
        return Check(
            "cgroups",
            "missing",
            "no cgroup filesystem mounted",
            "mount -t cgroup2 none /sys/fs/cgroup",
        )
    problems, fixes = m.problems()
    return _cgroup_check(m.describe(), problems, fixes)


def _cgroup_check(detail: str, problems: list[str], fixes: list[str]) -> Check:
    if not problems:
        return _ok("cgroups", detail)
    return Check(
        "cgroups", "warn", f"{detail} ({'; '.join(problems)})", "; ".join(f for f in fixes if f)
    )


def check_bfq(root: RootLike = HOST) -> Check:
    """Can blkio weights work: does any block device offer the bfq scheduler."""
    schedulers = probe.block_schedulers(root)
    offered, active = [], []
    for dev, text in schedulers.items():
        if "bfq" in text.replace("[", " ").replace("]", " ").split():
            offered.append(dev)
        if "[bfq]" in text:
            active.append(dev)
    if not offered:
        why = "no block device offers bfq" if schedulers else "no block device scheduler found"
        return Check("bfq", "warn", f"{why}: blkio weights will not apply", "modprobe bfq")
    return _ok(
        "bfq",
        f"bfq offered by {len(offered)} of {len(schedulers)} block devices, active on "
        f"{', '.join(active) if active else 'none'}",
    )


# --- network -------------------------------------------------------------------------


def check_bridge(root: RootLike = HOST) -> Check:
    """Linux bridge support: module loaded or a bridge already exists."""
    present = probe.bridges(root)
    if present:
        return _ok("bridge", f"bridges present: {', '.join(present)}")
    if "bridge" in probe.loaded_modules(root):
        return _ok("bridge", "bridge module loaded")
    return Check("bridge", "warn", "bridge module not loaded", "modprobe bridge")


def check_bridge_netfilter(root: RootLike = HOST) -> Check:
    """br_netfilter: does every frame on a cluster bridge go through the IP firewall hooks?

    Read-only: the knobs are host-wide (Docker's and Kubernetes' bridges rely on
    them), so hpvc reports them and leaves them as they are.
    """
    name = "bridge-netfilter"
    knobs = probe.bridge_netfilter(root)
    if not knobs:
        return _ok(name, "br_netfilter not loaded: bridged frames skip the IP firewall")
    on = [k for k, v in knobs.items() if v]
    if not on:
        return _ok(name, "br_netfilter loaded, bridge-nf-call-* = 0: bridged frames skip it")
    return Check(
        name,
        "warn",
        f"{', '.join(on)} = 1: every frame on a cluster bridge goes through the host's IP"
        " firewall hooks (CPU per frame: about 0.4 us per bridge crossed on the test bed;"
        " a FORWARD policy of drop, as Docker sets, cuts the cluster network)",
        "if nothing on this host needs it (Docker's and Kubernetes' bridges do): sysctl -w "
        + " ".join(f"net.bridge.{k}=0" for k in probe.BRIDGE_NF_KNOBS),
    )


def _device(root: RootLike, name: str, path: str, status: Status, why: str, fix: str) -> Check:
    if probe.exists(path, root):
        return _ok(name, f"{path} present")
    return Check(name, status, f"no {path}: {why}", fix)


def check_tun(root: RootLike = HOST) -> Check:
    """/dev/net/tun, needed for VM taps."""
    return _device(root, "tun", "/dev/net/tun", "missing", "VMs get no tap devices", "modprobe tun")


def check_vhost_net(root: RootLike = HOST) -> Check:
    """/dev/vhost-net, the in-kernel virtio-net datapath (without it: vhost=off)."""
    why = "hpvc uses vhost=off (slower VM networking)"
    return _device(root, "vhost-net", "/dev/vhost-net", "warn", why, "modprobe vhost_net")


def check_veth(root: RootLike = HOST) -> Check:
    """veth pairs for containers (informational: the kernel loads it on first use)."""
    if "veth" in probe.loaded_modules(root):
        return _ok("veth", "veth module loaded")
    return _ok("veth", "veth not loaded yet (the kernel loads it on first use)")


def check_vxlan_port(root: RootLike = HOST) -> Check:
    """Who holds the VXLAN port: hpvc's holder link (``hpvc node prepare``), nobody (any
    user may bind it and keep jobs across hosts from starting), or a user who did; and
    whether the source ports hpvc's VXLAN links send from are still root's alone (the
    VNI filter drops VXLAN from any other port as a user's)."""
    name, port = "vxlan-port", VXLAN_PORT
    prepare = "run `hpvc node prepare` as root when the host starts, before users log in"
    binders = probe.udp_binders(port, root)
    users = sorted({u for u in binders if u != 0})
    if users:
        return Check(
            name,
            "missing",
            f"UDP {port} is bound by uid {', '.join(map(str, users))}: no job across hosts"
            " can start here",
            f"end that process (ss -ulpn 'sport = :{port}' names it), then {prepare}",
        )
    if HOLDER_LINK not in probe.net_devices(root) or 0 not in binders:
        return Check(
            name, "warn", f"UDP {port} is not held for hpvc: any user may bind it first", prepare
        )
    start = probe.unprivileged_port_start(root)
    if start is not None and start < SOURCE_PORTS[1]:
        return Check(
            name,
            "warn",
            f"net.ipv4.ip_unprivileged_port_start = {start}: users may send from the source"
            f" ports of hpvc's VXLAN ({SOURCE_PORTS[0]}-{SOURCE_PORTS[1] - 1}) and inject"
            " frames into a cluster network across hosts",
            f"sysctl -w net.ipv4.ip_unprivileged_port_start={SOURCE_PORTS[1]}",
        )
    return _ok(name, f"UDP {port} held by hpvc's VXLAN link {HOLDER_LINK}; no user can bind it")


# The guest agent of VM nodes (native/agent) serves only clients from a source port
# below this one: the port every user may bind from when the sysctl is at its default.
AGENT_TRUSTED_BELOW = 1024


def check_agent_port(root: RootLike = HOST) -> Check:
    """The fence of VM guests' agents (native/agent): a Slurm task reaches its guest
    from a source port below 1024, which only root can bind while
    net.ipv4.ip_unprivileged_port_start is 1024 or more. Lower, any user on the
    host sends from such a port too."""
    name, low = "agent-port", AGENT_TRUSTED_BELOW
    start = probe.unprivileged_port_start(root)
    if start is None:
        return Check(
            name,
            "warn",
            "net.ipv4.ip_unprivileged_port_start unreadable: cannot tell whether users may"
            f" bind ports below {low}, the VM guest agents' fence",
            "run hpvc doctor on a kernel with /proc/sys/net/ipv4/ip_unprivileged_port_start",
        )
    if start < low:
        return Check(
            name,
            "warn",
            f"net.ipv4.ip_unprivileged_port_start = {start}: users may bind ports"
            f" {start}-{low - 1}, which VM guests' agents take for root's (Slurm tasks of"
            " VM nodes): another user could run commands in a job's guests",
            f"sysctl -w net.ipv4.ip_unprivileged_port_start={low}",
        )
    return _ok(
        name,
        f"net.ipv4.ip_unprivileged_port_start = {start}: only root binds ports below {low}",
    )


# --- NUMA and limits -----------------------------------------------------------------


def check_numa(root: RootLike = HOST) -> Check:
    """Number of NUMA nodes and their CPUs."""
    nodes = probe.node_cpus(root)
    if not nodes:
        count = len(probe.online_cpus(root))
        return Check(
            "numa",
            "warn",
            f"no /sys/devices/system/node: treated as one node with {count or '?'} CPUs",
            "use a kernel with CONFIG_NUMA for placement",
        )
    all_cpus = {c for cpus in nodes.values() for c in cpus}
    per_node = [f"node{n}: {format_cpulist(cpus) or 'no CPUs'}" for n, cpus in nodes.items()]
    noun = "node" if len(nodes) == 1 else "nodes"
    return _ok("numa", f"{len(nodes)} {noun}, {len(all_cpus)} CPUs ({'; '.join(per_node)})")


def check_memlock(root: RootLike = HOST) -> Check:
    """Max locked memory of this process (informational; ``<locked/>`` guests need more)."""
    limits = probe.memlock_limits(root)
    if limits is None:
        return _ok("memlock", "limit unknown (no /proc/self/limits)")
    text = [v if v == "unlimited" else _fmt_kb(int(v) // 1024) for v in limits]
    return _ok("memlock", f"max locked memory {text[0]} (hard {text[1]})")


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


def check_tool(tool: Tool, which: Which = probe.host_which) -> Check:
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


def run_checks(
    root: RootLike = HOST, which: Which | None = None, env: Mapping[str, str] | None = None
) -> Report:
    """Every check, in report order. ``which`` defaults to the PATH of ``root``;
    ``env`` (default the process environment) may hold ``HPVC_ACCEL``."""
    which = probe.which_for(root) if which is None else which
    mounts = probe.read_mounts(root)
    checks = [
        check_accelerator(root, env),
        check_numa(root),
        check_hugepages(root),
        check_hugetlbfs(root, mounts),
        check_thp(root),
        check_cgroups(root, mounts),
        check_bfq(root),
        check_bridge(root),
        check_bridge_netfilter(root),
        check_tun(root),
        check_vhost_net(root),
        check_veth(root),
        check_vxlan_port(root),
        check_agent_port(root),
        check_memlock(root),
        *(check_tool(t, which) for t in TOOLS),
    ]
    return Report(tuple(checks), accelerator(root, env).name)

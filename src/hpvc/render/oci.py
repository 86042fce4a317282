"""Plan node -> OCI runtime config.json (runtime-spec 1.0.2, as crun 1.8 takes it).

Pure: returns a dict; the container backend writes it into the node's bundle.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hpvc.plan.model import Plan, PlannedNode
from hpvc.render.context import RenderContext
from hpvc.units import format_cpulist

OCI_VERSION = "1.0.2"
CPU_SHARES_MAX = 262144  # the kernel's cap for cpu.shares
CFS_PERIOD_US = 100000

# Docker's default set plus SYS_PTRACE: Open MPI's single-copy (CMA) transport
# reads peer ranks' memory with process_vm_readv, which needs it.
CAPABILITIES = (
    "CAP_AUDIT_WRITE",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_MKNOD",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
)
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
)
READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)
# (type, major, minor) of the character devices every container may use.
DEVICES = (("c", 1, 3), ("c", 1, 5), ("c", 1, 7), ("c", 1, 8), ("c", 1, 9), ("c", 5, 0))
DEVICES_ANY_MINOR = (("c", 5, 1), ("c", 5, 2), ("c", 136, -1))  # console, ptmx, pts


def page_size_name(size_kib: int) -> str:
    """OCI hugepage size name: 2048 -> "2MB", 1048576 -> "1GB"."""
    if size_kib % (1024 * 1024) == 0:
        return f"{size_kib // (1024 * 1024)}GB"
    if size_kib % 1024 == 0:
        return f"{size_kib // 1024}MB"
    return f"{size_kib}KB"


def _mount(dest: str, kind: str, source: str, options: list[str]) -> dict[str, Any]:
    return {"destination": dest, "type": kind, "source": source, "options": options}


def _mounts(plan: Plan, node: PlannedNode, ctx: RenderContext) -> list[dict[str, Any]]:
    ns = ["nosuid", "noexec", "nodev"]
    user = ["nosuid", "nodev"] if ctx.tenant else []  # a tenant's: no setuid, no devices
    mounts = [
        _mount("/proc", "proc", "proc", []),
        _mount("/dev", "tmpfs", "tmpfs", ["nosuid", "strictatime", "mode=755", "size=65536k"]),
        _mount(
            "/dev/pts",
            "devpts",
            "devpts",
            ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        ),
        # The runtime default is 64k; MPI's shared-memory transport needs real room.
        # With locality, co-resident nodes share one host tmpfs instead.
        _mount("/dev/shm", "bind", ctx.shared_shm, ["rbind", "nosuid", "nodev"])
        if ctx.shared_shm
        else _mount("/dev/shm", "tmpfs", "shm", [*ns, "mode=1777", f"size={ctx.shm_size_mib}m"]),
        _mount("/dev/mqueue", "mqueue", "mqueue", ns),
        _mount("/sys", "sysfs", "sysfs", [*ns, "ro"]),
        _mount("/sys/fs/cgroup", "cgroup", "cgroup", [*ns, "relatime", "ro"]),
        _mount("/etc/hosts", "bind", ctx.hosts_file(plan.cluster), ["rbind", "ro", *user]),
    ]
    if node.hugepages is not None:
        # The host's hugetlbfs mount of this page size; co-resident nodes share it.
        hp = ctx.hugetlbfs_path(node.hugepages.size_kib)
        mounts.append(_mount("/dev/hugepages", "bind", hp, ["rbind", "nosuid", "nodev"]))
    node_dir = ctx.node_dir(plan.cluster, node.name)
    binds = [*ctx.binds, *((os.path.join(node_dir, s), d, ro) for s, d, ro in ctx.node_binds)]
    for src, dst, ro in binds:
        mounts.append(_mount(dst, "bind", src, ["rbind", "ro" if ro else "rw", *user]))
    return mounts


def _namespaces(plan: Plan, node: PlannedNode, ctx: RenderContext) -> list[dict[str, str]]:
    spaces: list[dict[str, str]] = [{"type": t} for t in ("pid", "mount", "uts", "ipc")]
    if ctx.shared_ns_pid is not None:
        for sp in spaces:
            if sp["type"] in ("pid", "ipc"):
                sp["path"] = f"/proc/{ctx.shared_ns_pid}/ns/{sp['type']}"
    net: dict[str, str] = {"type": "network"}
    path = ctx.netns_path(plan.cluster, node.name)
    if path:
        net["path"] = path
    return [*spaces, net]


def _cpu(node: PlannedNode) -> dict[str, Any]:
    n = len(node.vcpus)
    cpu: dict[str, Any] = {"shares": min(1024 * n, CPU_SHARES_MAX)}
    if node.pinning == "shared":
        # Shared CPUs: cap the node at its vCPU count of CPU time.
        cpu["quota"] = n * CFS_PERIOD_US
        cpu["period"] = CFS_PERIOD_US
    cpu["cpus"] = format_cpulist(node.cpuset)
    if node.numa:
        cpu["mems"] = format_cpulist([c.host_node for c in node.numa])
    return cpu


def _throttle(major: int, minor: int, rate: int | None) -> list[dict[str, int]]:
    return [] if rate is None else [{"major": major, "minor": minor, "rate": rate}]


def block_io(node: PlannedNode, ctx: RenderContext) -> dict[str, Any] | None:
    """blkio throttles of the node on the context's block device, or None.

    ``weight`` is deliberately absent: crun 1.8 cannot set it on these hosts
    (no blkio.weight file); the host layer writes blkio.bfq.weight instead.
    """
    io = node.io
    if io is None or ctx.block_device is None:
        return None
    major, minor = ctx.block_device
    out: dict[str, Any] = {}
    for key, rate in (
        ("throttleReadBpsDevice", io.read_bps),
        ("throttleWriteBpsDevice", io.write_bps),
        ("throttleReadIOPSDevice", io.read_iops),
        ("throttleWriteIOPSDevice", io.write_iops),
    ):
        if rate is not None:
            out[key] = _throttle(major, minor, rate)
    return out or None


def _devices() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = [{"allow": False, "access": "rwm"}]
    for kind, major, minor in (*DEVICES, *DEVICES_ANY_MINOR):
        rule: dict[str, Any] = {"allow": True, "type": kind, "major": major}
        if minor >= 0:
            rule["minor"] = minor
        rules.append({**rule, "access": "rwm"})
    return rules


def _resources(node: PlannedNode, ctx: RenderContext) -> dict[str, Any]:
    # Normal memory: the node's memory less its hugepages (limited apart below),
    # so that normal plus hugepage memory stays within the node's memory.
    limit = node.normal_mib * 1024 * 1024
    res: dict[str, Any] = {
        "devices": _devices(),
        "memory": {"limit": limit, "swap": limit},  # memory+swap = memory: no swap
        "cpu": _cpu(node),
        "pids": {"limit": ctx.pids_limit},
    }
    blkio = block_io(node, ctx)
    if blkio is not None:
        res["blockIO"] = blkio
    if node.hugepages is not None:
        hp = node.hugepages
        res["hugepageLimits"] = [
            {"pageSize": page_size_name(hp.size_kib), "limit": hp.size_kib * 1024 * hp.count}
        ]
    return res


def _process(ctx: RenderContext) -> dict[str, Any]:
    caps = list(CAPABILITIES)
    return {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": list(ctx.command),
        "env": list(ctx.env),
        "cwd": "/",
        "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
        # No rlimits: nodes inherit the runtime's. A fixed RLIMIT_NOFILE above the
        # host's hard limit makes crun fail with EPERM on some hosts.
        "noNewPrivileges": True,
    }


def render_oci_config(plan: Plan, node: PlannedNode, ctx: RenderContext) -> dict[str, Any]:
    """The OCI runtime config of one container node."""
    return {
        "ociVersion": OCI_VERSION,
        "process": _process(ctx),
        "root": {
            "path": ctx.node_container_rootfs(plan.cluster, node.name, plan.image),
            "readonly": ctx.rootfs_readonly,
        },
        "hostname": node.name,
        "mounts": _mounts(plan, node, ctx),
        "annotations": {"org.hpvc.cluster": plan.cluster, "org.hpvc.node": node.name},
        "linux": {
            "resources": _resources(node, ctx),
            "cgroupsPath": ctx.cgroup_path(plan.cluster, node.name),
            "namespaces": _namespaces(plan, node, ctx),
            # Ping without privileges (ICMP datagram sockets), as Podman does: a
            # task from Slurm runs with an empty capability bounding set, so
            # ping's file capability (cap_net_raw) no longer applies.
            "sysctl": {"net.ipv4.ping_group_range": "0 2147483647"},
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }


def dumps(config: dict[str, Any]) -> str:
    """config.json text: indented, key order kept, newline-terminated."""
    return json.dumps(config, indent=2) + "\n"

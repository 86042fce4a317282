"""Plan node -> QEMU command line for the direct-QEMU backend (pure).

The argv is the equivalent of the libvirt domain XML. QEMU cannot pin its own
threads, so the renderer also returns the pinning the backend applies after
start (``-name ...,debug-threads=on`` names the vCPU threads "CPU n/KVM|TCG").
"""

from __future__ import annotations

from dataclasses import dataclass

from hpvc.plan.model import NumaCell, Plan, PlannedNode
from hpvc.render.context import AGENT_KEY_FWCFG, SHARED_DISK_SERIAL, RenderContext, tap_name
from hpvc.render.libvirt import domain_name, guest_topology
from hpvc.units import format_cpulist


@dataclass(frozen=True)
class QemuPinning:
    """What the backend pins once QEMU runs: vCPU index -> host CPUs, emulator CPUs.

    A dedicated vCPU maps to one host CPU; a shared one to the node's cpuset.
    """

    vcpus: tuple[tuple[int, tuple[int, ...]], ...]
    emulator: tuple[int, ...]


@dataclass(frozen=True)
class QemuLaunch:
    """Everything the direct-QEMU backend needs to start and tune one node."""

    argv: tuple[str, ...]
    pinning: QemuPinning
    tap: str
    qmp_socket: str
    pidfile: str
    # The serial console: QEMU writes it to ``console_fifo``, which hpvc's reader
    # (hpvc.host.console_ring) copies into ``console_log``, kept to a cap.
    console_fifo: str | None = None
    console_log: str | None = None


def _v(value: str) -> str:
    """Escape a value inside a QEMU option string (a comma is written twice)."""
    return value.replace(",", ",,")


def _backend(
    cell_id: int, mib: int, cell: NumaCell | None, node: PlannedNode, hp: str, shared: bool
) -> str:
    """A memory-backend object: hugetlbfs file or RAM, preallocated, bound to its
    host node; ``shared`` (virtiofs: vhost-user maps the guest's memory) makes
    RAM a memfd with share=on (hugetlbfs files are shared already)."""
    if node.hugepages is not None:
        opts = f"memory-backend-file,id=mem{cell_id},size={mib}M,mem-path={_v(hp)}"
        opts += ",prealloc=on,share=on"
    elif shared:
        opts = f"memory-backend-memfd,id=mem{cell_id},size={mib}M,prealloc=on,share=on"
    else:
        opts = f"memory-backend-ram,id=mem{cell_id},size={mib}M,prealloc=on"
    if cell is not None:
        opts += f",host-nodes={cell.host_node},policy=bind"
    return opts


def _memory_args(node: PlannedNode, ctx: RenderContext) -> list[str]:
    hp = ctx.hugetlbfs_path(node.hugepages.size_kib) if node.hugepages else ""
    args = ["-m", f"{node.memory_mib}M"]
    shared = bool(ctx.virtiofs)
    if not node.numa:
        return [*args, "-object", _backend(0, node.memory_mib, None, node, hp, shared)]
    for cell in sorted(node.numa, key=lambda c: c.guest_node):
        i = cell.guest_node
        args += ["-object", _backend(i, cell.memory_mib, cell, node, hp, shared)]
        cpus = "".join(f",cpus={r}" for r in format_cpulist(cell.vcpus).split(",") if r)
        args += ["-numa", f"node,nodeid={i}{cpus},memdev=mem{i}"]
    return args


def _machine_args(node: PlannedNode, ctx: RenderContext) -> list[str]:
    machine = "q35,mem-merge=off"
    if not node.numa:
        machine += ",memory-backend=mem0"
    # The accelerator goes in -accel only: QEMU refuses -accel with -machine accel=.
    if ctx.accel == "kvm":
        accel, cpu = "kvm", "host,-arch-capabilities"
    else:
        accel, cpu = "tcg,thread=multi", "max"
    sockets, cores, threads = guest_topology(node)
    smp = f"{len(node.vcpus)},sockets={sockets},cores={cores},threads={threads}"
    # A guest may be migrated stopped (hpvc.backends.vm.migration: TCG before
    # QEMU 9.0; hpvc.backends.qemu.region: an ivshmem region's node): without the
    # paused run state in the stream the target starts the guest at the end of
    # the copy. (A checkpoint's restore starts its QEMUs with -S and resumes them.)
    glob = ["-global", "migration.store-global-state=off"]
    return ["-machine", machine, "-accel", accel, "-cpu", cpu, "-smp", smp, *glob]


def _device_args(plan: Plan, node: PlannedNode, ctx: RenderContext) -> list[str]:
    disk = ctx.disk_image(plan.cluster, node.name)
    vhost = "on" if ctx.use_vhost() else "off"
    console = (
        f"socket,id=console0,path={_v(ctx.console_socket(plan.cluster, node.name))}"
        f",server=on,wait=off,logfile={_v(ctx.console_fifo(plan.cluster, node.name))}"
    )
    return [
        # aio=native needs O_DIRECT: cache=none gives it.
        "-drive",
        f"file={_v(disk)},if=none,id=disk0,format={ctx.disk_format},cache=none,aio=native",
        "-device",
        "virtio-blk-pci,drive=disk0",
        "-netdev",
        f"tap,id=net0,ifname={tap_name(plan.cluster, node.name)},script=no,downscript=no"
        f",vhost={vhost}",
        "-device",
        f"virtio-net-pci,netdev=net0,mac={node.mac},host_mtu={plan.network.mtu}",
        "-chardev",
        console,
        "-serial",
        "chardev:console0",
    ]


def shared_disk_args(plan: Plan, node: PlannedNode, ctx: RenderContext) -> list[str]:
    """The NFS server's backing disk (raw ext4, found in the guest by its serial)."""
    image = ctx.shared_disk(plan.cluster, node.name, plan.shared)
    if image is None:
        return []
    return [
        "-drive",
        f"file={_v(image)},if=none,id=disk1,format=raw,cache=none,aio=native",
        "-device",
        f"virtio-blk-pci,drive=disk1,serial={SHARED_DISK_SERIAL}",
    ]


def virtiofs_args(ctx: RenderContext) -> list[str]:
    """One vhost-user-fs device per shared host folder, on its virtiofsd's socket
    (QEMU connects as root, before it drops to its cluster's uid)."""
    args: list[str] = []
    for i, (tag, sock) in enumerate(ctx.virtiofs):
        args += ["-chardev", f"socket,id=fs{i},path={_v(sock)}"]
        args += ["-device", f"vhost-user-fs-pci,chardev=fs{i},tag={_v(tag)}"]
    return args


def ivshmem_args(ctx: RenderContext) -> list[str]:
    """The shared ivshmem-plain region of co-resident nodes (share=on: one file, many VMs)."""
    if ctx.ivshmem is None:
        return []
    path, mib = ctx.ivshmem
    # master=on: QEMU blocks migration of an ivshmem in peer mode (the default),
    # and hpvc checkpoint saves a VM by migration; every co-resident node saves
    # the region at the same frozen instant, so each restores the same bytes.
    return [
        "-object",
        f"memory-backend-file,id=ivshmem0,mem-path={_v(path)},size={mib}M,share=on",
        "-device",
        "ivshmem-plain,memdev=ivshmem0,master=on",
    ]


# QEMU's seccomp filter: no obsolete system calls, no fork/exec, no changes of
# scheduling or priorities (hpvc pins the threads from outside, as root).
# elevateprivileges stays allowed: -runas drops root with setgid/setuid after the
# filter is installed, and a filter that denies them kills QEMU then ("Bad system
# call"); once dropped, every uid is the cluster's, no capability is left and
# no_new_privs is set, so nothing can raise them again.
SANDBOX = "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny"


def sandbox_args(ctx: RenderContext) -> list[str]:
    """QEMU as the cluster's uid, in a seccomp sandbox (none when ``qemu_uid`` is None)."""
    if ctx.qemu_uid is None:
        return []
    if ctx.qemu_uid <= 0:
        raise ValueError(f"QEMU's uid must not be root's: {ctx.qemu_uid}")
    return ["-runas", f"{ctx.qemu_uid}:{ctx.qemu_uid}", "-sandbox", SANDBOX]


def agent_key_args(ctx: RenderContext) -> list[str]:
    """The agent key's file as a fw_cfg entry: its path on the command line, not the key."""
    if ctx.agent_key is None:
        return []
    return ["-fw_cfg", f"name={AGENT_KEY_FWCFG},file={_v(ctx.agent_key)}"]


def _boot_args(ctx: RenderContext) -> list[str]:
    if not ctx.kernel:
        return []
    args = ["-kernel", ctx.kernel]
    if ctx.initrd:
        args += ["-initrd", ctx.initrd]
    return [*args, "-append", ctx.full_kernel_args()]


def qemu_name(plan: Plan, node: PlannedNode) -> str:
    """The ``-name`` value of a node's QEMU: what finds its process again."""
    return f"{domain_name(plan, node)},debug-threads=on"


def qemu_argv(plan: Plan, node: PlannedNode, ctx: RenderContext) -> list[str]:
    """The QEMU command line of one VM node (binary first)."""
    qmp = ctx.qmp_socket(plan.cluster, node.name)
    return [
        ctx.qemu_binary,
        "-name",
        qemu_name(plan, node),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        *_machine_args(node, ctx),
        *_memory_args(node, ctx),
        *_device_args(plan, node, ctx),
        *shared_disk_args(plan, node, ctx),
        *virtiofs_args(ctx),
        *ivshmem_args(ctx),
        *_boot_args(ctx),
        *agent_key_args(ctx),
        "-rtc",
        "base=utc",
        "-qmp",
        f"unix:{_v(qmp)},server=on,wait=off",
        "-pidfile",
        ctx.pidfile(plan.cluster, node.name),
        *sandbox_args(ctx),
    ]


def qemu_pinning(node: PlannedNode) -> QemuPinning:
    """vCPU -> host CPUs (one for dedicated, the cpuset for shared) and emulator CPUs."""
    pins = tuple(
        (v.vcpu, (v.pcpu,) if v.pcpu is not None else tuple(node.cpuset))
        for v in sorted(node.vcpus, key=lambda v: v.vcpu)
    )
    return QemuPinning(vcpus=pins, emulator=tuple(node.emulator_cpus))


def render_qemu(plan: Plan, node: PlannedNode, ctx: RenderContext) -> QemuLaunch:
    """argv, pinning, tap name, QMP socket and pid file of one VM node."""
    return QemuLaunch(
        argv=tuple(qemu_argv(plan, node, ctx)),
        pinning=qemu_pinning(node),
        tap=tap_name(plan.cluster, node.name),
        qmp_socket=ctx.qmp_socket(plan.cluster, node.name),
        pidfile=ctx.pidfile(plan.cluster, node.name),
        console_fifo=ctx.console_fifo(plan.cluster, node.name),
        console_log=ctx.console_log(plan.cluster, node.name),
    )

"""Plan node -> libvirt domain XML (pure; checked with ``virt-xml-validate``).

The tuning is the one the research reproduces: vCPUs pinned one to one,
guest NUMA cells mirrored onto host nodes with strict memory binding, memory
backed by preallocated hugepages, no page sharing, virtio disk and network.
"""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET

from hpvc.plan.model import Plan, PlannedNode
from hpvc.render.context import AGENT_KEY_FWCFG, SHARED_DISK_SERIAL, RenderContext, tap_name
from hpvc.units import format_cpulist

_UUID_NS = uuid.UUID("6f1d4a52-57a8-4c3e-9d0b-4b7e2f6c1a90")
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"  # <qemu:commandline>
ET.register_namespace("qemu", QEMU_NS)
IVSHMEM_SLOT = "0x10"  # the ivshmem device's slot on pcie.0 (see _qemu_commandline)


def domain_name(plan: Plan, node: PlannedNode) -> str:
    """The domain (and QEMU process) name of a node."""
    return f"hpvc-{plan.cluster}-{node.name}"


def domain_uuid(plan: Plan, node: PlannedNode) -> str:
    """A stable UUID, so re-rendering a node gives the same domain."""
    return node_uuid(plan.cluster, node.name)


def node_uuid(cluster: str, node: str) -> str:
    """The UUID of node ``node`` of cluster ``cluster``'s domain."""
    return str(uuid.uuid5(_UUID_NS, f"{cluster}/{node}"))


def owner_of(name: str, domain_uuid: str) -> tuple[str, str] | None:
    """(cluster, node) of a domain hpvc rendered, told by its name and UUID (cluster
    names may hold '-': the UUID says where the cluster's name ends); None for a
    domain hpvc did not name, even one called ``hpvc-...``."""
    rest = name.removeprefix("hpvc-")
    if rest == name:
        return None
    for i, c in enumerate(rest):
        cluster, node = rest[:i], rest[i + 1 :]
        if c == "-" and cluster and node and node_uuid(cluster, node) == domain_uuid.lower():
            return cluster, node
    return None


def guest_topology(node: PlannedNode) -> tuple[int, int, int]:
    """(sockets, cores, threads): one socket per guest NUMA cell when cells split evenly.

    Cells must hold equal, consecutive vCPU blocks (cell i = vCPUs i*k..i*k+k-1)
    for sockets to line up with cells; otherwise one socket holds every vCPU.
    """
    n = len(node.vcpus)
    cells = sorted(node.numa, key=lambda c: c.guest_node)
    if len(cells) > 1 and n % len(cells) == 0:
        per = n // len(cells)
        blocks = [tuple(range(i * per, (i + 1) * per)) for i in range(len(cells))]
        if [tuple(sorted(c.vcpus)) for c in cells] == blocks:
            return len(cells), per, 1
    return 1, n, 1


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


def _memory(dom: ET.Element, node: PlannedNode) -> None:
    kib = str(node.memory_mib * 1024)
    _sub(dom, "memory", kib, unit="KiB")
    _sub(dom, "currentMemory", kib, unit="KiB")
    backing = _sub(dom, "memoryBacking")
    if node.hugepages is not None:
        pages = _sub(backing, "hugepages")
        attrs = {"size": str(node.hugepages.size_kib), "unit": "KiB"}
        if node.numa:
            attrs["nodeset"] = format_cpulist([c.guest_node for c in node.numa])
        _sub(pages, "page", **attrs)
    _sub(backing, "nosharepages")
    _sub(backing, "allocation", mode="immediate")


def _cpus(dom: ET.Element, node: PlannedNode) -> None:
    floating = [v for v in node.vcpus if v.pcpu is None]
    vcpu_attrs = {"placement": "static"}
    if floating:
        vcpu_attrs["cpuset"] = format_cpulist(node.cpuset)
    _sub(dom, "vcpu", str(len(node.vcpus)), **vcpu_attrs)
    pinned = [v for v in node.vcpus if v.pcpu is not None]
    if not pinned and not node.emulator_cpus:
        return
    tune = _sub(dom, "cputune")
    for v in sorted(pinned, key=lambda p: p.vcpu):
        _sub(tune, "vcpupin", vcpu=str(v.vcpu), cpuset=str(v.pcpu))
    if node.emulator_cpus:
        _sub(tune, "emulatorpin", cpuset=format_cpulist(node.emulator_cpus))


def _numatune(dom: ET.Element, node: PlannedNode) -> None:
    if not node.numa:
        return
    tune = _sub(dom, "numatune")
    hosts = format_cpulist([c.host_node for c in node.numa])
    _sub(tune, "memory", mode="strict", nodeset=hosts)
    for c in sorted(node.numa, key=lambda c: c.guest_node):
        _sub(tune, "memnode", cellid=str(c.guest_node), mode="strict", nodeset=str(c.host_node))


def _os(dom: ET.Element, ctx: RenderContext) -> None:
    os_el = _sub(dom, "os")
    _sub(os_el, "type", "hvm", arch="x86_64", machine="q35")
    if ctx.kernel:
        _sub(os_el, "kernel", ctx.kernel)
        if ctx.initrd:
            _sub(os_el, "initrd", ctx.initrd)
        _sub(os_el, "cmdline", ctx.full_kernel_args())
    else:
        _sub(os_el, "boot", dev="hd")
    features = _sub(dom, "features")
    _sub(features, "acpi")  # without ACPI and APIC the guest sees one CPU
    _sub(features, "apic")


def _cpu(dom: ET.Element, node: PlannedNode, ctx: RenderContext) -> None:
    if ctx.accel == "kvm":
        cpu = _sub(dom, "cpu", mode="host-passthrough", check="none", migratable="off")
    else:
        cpu = _sub(dom, "cpu", mode="maximum", check="none")  # TCG: QEMU's -cpu max
    sockets, cores, threads = guest_topology(node)
    _sub(cpu, "topology", sockets=str(sockets), cores=str(cores), threads=str(threads))
    if ctx.accel == "kvm":
        # KVM (and PVM) hosts abort on MSR 0x10a with the host's arch-capabilities.
        _sub(cpu, "feature", policy="disable", name="arch-capabilities")
    if node.numa:
        numa = _sub(cpu, "numa")
        for c in sorted(node.numa, key=lambda c: c.guest_node):
            _sub(
                numa,
                "cell",
                id=str(c.guest_node),
                cpus=format_cpulist(c.vcpus),
                memory=str(c.memory_mib * 1024),
                unit="KiB",
            )


def _clock(dom: ET.Element, ctx: RenderContext) -> None:
    clock = _sub(dom, "clock", offset="utc")
    if ctx.accel == "kvm":
        _sub(clock, "timer", name="kvmclock", present="yes")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")


def _devices(dom: ET.Element, plan: Plan, node: PlannedNode, ctx: RenderContext) -> None:
    dev = _sub(dom, "devices")
    _sub(dev, "emulator", ctx.qemu_binary)
    disk = _sub(dev, "disk", type="file", device="disk")
    # io='native' needs O_DIRECT, which cache='none' gives.
    _sub(disk, "driver", name="qemu", type=ctx.disk_format, cache="none", io="native")
    _sub(disk, "source", file=ctx.disk_image(plan.cluster, node.name))
    _sub(disk, "target", dev="vda", bus="virtio")
    image = ctx.shared_disk(plan.cluster, node.name, plan.shared)
    if image is not None:  # the NFS server's backing (raw ext4), found by its serial
        shared = _sub(dev, "disk", type="file", device="disk")
        _sub(shared, "driver", name="qemu", type="raw", cache="none", io="native")
        _sub(shared, "source", file=image)
        _sub(shared, "target", dev="vdb", bus="virtio")
        _sub(shared, "serial", SHARED_DISK_SERIAL)
    nic = _sub(dev, "interface", type="bridge")
    _sub(nic, "source", bridge=plan.network.bridge)
    _sub(nic, "target", dev=tap_name(plan.cluster, node.name))
    _sub(nic, "mac", address=node.mac)
    _sub(nic, "model", type="virtio")
    _sub(nic, "driver", name="vhost" if ctx.use_vhost() else "qemu")
    _sub(nic, "mtu", size=str(plan.network.mtu))
    serial = _sub(dev, "serial", type="pty")
    _sub(serial, "log", file=ctx.console_log(plan.cluster, node.name), append="off")
    _sub(serial, "target", port="0")
    console = _sub(dev, "console", type="pty")
    _sub(console, "target", type="serial", port="0")
    _sub(dev, "memballoon", model="none")  # a balloon would undo the pinned, preallocated memory


def _qemu_commandline(dom: ET.Element, ctx: RenderContext) -> None:
    """The ivshmem region, as the same QEMU arguments the direct backend gives.

    Not libvirt's ``<shmem name=...>``: that maps ``/dev/shm/<name>``, a name
    directly in a folder every user may write, which a user can take first;
    hpvc's regions are in a root-only folder (``hpvc.host.ivshmem``), a path a
    name without '/' cannot reach.

    The device gets a fixed slot on the root bus, ``IVSHMEM_SLOT``: libvirt does not
    see devices given on ``<qemu:commandline>``, lays out its own PCI addresses
    from slot 1 up (its pcie-root-ports, packed as functions of slots 1, 2, ...)
    and QEMU refuses to start when a device it placed first holds one of them.
    Slot 0x10 is far above what libvirt assigns a domain of hpvc's few devices
    and below q35's fixed ones (0x1f: LPC/SATA/SMBus)."""
    if ctx.ivshmem is None:
        return
    path, mib = ctx.ivshmem
    mem = f"mem-path={path.replace(',', ',,')},size={mib}M,share=on"  # QEMU doubles a comma
    line = _sub(dom, f"{{{QEMU_NS}}}commandline")
    for arg in ("-object", f"memory-backend-file,id=ivshmem0,{mem}", "-device"):
        _sub(line, f"{{{QEMU_NS}}}arg", value=arg)
    # master=on: migratable, as render.qemu.ivshmem_args says
    device = f"ivshmem-plain,memdev=ivshmem0,master=on,bus=pcie.0,addr={IVSHMEM_SLOT}"
    _sub(line, f"{{{QEMU_NS}}}arg", value=device)


def _sysinfo(dom: ET.Element, ctx: RenderContext) -> None:
    """The agent key's file as a fw_cfg entry (libvirt 6.5 and later), as the
    direct backend's ``-fw_cfg``: the guest reads the key, no command line holds it."""
    if ctx.agent_key is None:
        return
    info = _sub(dom, "sysinfo", type="fwcfg")
    _sub(info, "entry", name=AGENT_KEY_FWCFG, file=ctx.agent_key)


def _seclabel(dom: ET.Element, ctx: RenderContext) -> None:
    """QEMU as the cluster's uid from its start (libvirt's DAC label), chowning
    nothing (``relabel='no'``): hpvc lets that uid open the domain's files
    itself (``hpvc.host.qemu_access``). libvirt then adds its own ``-sandbox``
    (qemu.conf's ``seccomp_sandbox``, on by default); with no label, QEMU runs
    as qemu.conf's ``user``."""
    if ctx.qemu_uid is None:
        return
    if ctx.qemu_uid <= 0:
        raise ValueError(f"QEMU's uid must not be root's: {ctx.qemu_uid}")
    label = _sub(dom, "seclabel", type="static", model="dac", relabel="no")
    _sub(label, "label", f"+{ctx.qemu_uid}:+{ctx.qemu_uid}")


PLACEMENT = ("vcpu", "cputune", "numatune")  # what a new place changes in a domain


def placed_domain_xml(xml: str, node: PlannedNode) -> str:
    """A domain's XML (libvirt's own, e.g. a save image's) with ``node``'s place:
    its ``<vcpu>``, ``<cputune>`` and ``<numatune>`` rendered for ``node`` where the
    old ones were; everything else (devices, addresses, labels) as it was. What
    libvirt lets a restore change: none of it is guest ABI."""
    dom = ET.fromstring(xml)
    kids = list(dom)
    where = next((i for i, k in enumerate(kids) if k.tag in PLACEMENT), None)
    if where is None or dom.tag != "domain":
        raise ValueError("not a domain XML with a <vcpu> element")
    for k in kids:
        if k.tag in PLACEMENT:
            dom.remove(k)
    fresh = ET.Element("domain")
    _cpus(fresh, node)
    _numatune(fresh, node)
    for offset, element in enumerate(fresh):
        dom.insert(where + offset, element)
    return ET.tostring(dom, encoding="unicode") + "\n"


def render_domain_xml(plan: Plan, node: PlannedNode, ctx: RenderContext) -> str:
    """The libvirt domain XML of one VM node, pretty-printed and deterministic."""
    dom = ET.Element("domain", {"type": "kvm" if ctx.accel == "kvm" else "qemu"})
    _sub(dom, "name", domain_name(plan, node))
    _sub(dom, "uuid", domain_uuid(plan, node))
    _sub(dom, "description", f"hpvc cluster {plan.cluster}, {node.role} node {node.name}")
    _memory(dom, node)
    _cpus(dom, node)
    _numatune(dom, node)
    _os(dom, ctx)
    _sysinfo(dom, ctx)
    _cpu(dom, node, ctx)
    _clock(dom, ctx)
    _devices(dom, plan, node, ctx)
    _seclabel(dom, ctx)
    _qemu_commandline(dom, ctx)
    ET.indent(dom, space="  ")
    return ET.tostring(dom, encoding="unicode") + "\n"

"""Renderers: focused checks against the plan, golden files, libvirt schema validation.

Regenerate the golden files with ``HPVC_UPDATE_GOLDEN=1 pytest tests/unit/test_render.py``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from hpvc.cli import main
from hpvc.plan import host_overlay, plan_cluster
from hpvc.plan.model import (
    HostPlan,
    HugepageNeed,
    IOPlan,
    NetworkPlan,
    NumaCell,
    Plan,
    PlannedNode,
    VcpuPin,
)
from hpvc.plan.network import filter_table
from hpvc.plan.overlay import SOURCE_PORTS
from hpvc.render import (
    RenderContext,
    ethers,
    guest_network,
    guest_network_script,
    hostfile,
    hosts,
    locality_json,
    qemu_argv,
    qemu_pinning,
    render_cluster,
    render_domain_xml,
    render_oci_config,
    render_qemu,
    tap_name,
)
from hpvc.render.context import IFNAMSIZ
from hpvc.render.libvirt import guest_topology
from hpvc.render.network import network_script, vni_filter
from hpvc.spec import parse_spec
from hpvc.topology import read_topology
from hpvc.topology.inventory import read_inventory
from hpvc.units import parse_cpulist
from tests.helpers import ROOT, requires

GOLDEN = Path(ROOT) / "tests" / "golden"
UPDATE = os.environ.get("HPVC_UPDATE_GOLDEN") == "1"
BASE = "/var/lib/hpvc"
NET = NetworkPlan(
    subnet="10.88.0.0/24", gateway="10.88.0.1", prefixlen=24, mtu=9000, bridge="hpvc-demo"
)


# --- hand-built plans ------------------------------------------------------------------


def make_node(
    name: str,
    index: int,
    *,
    kind: str = "vm",
    role: str = "compute",
    pins: tuple[int | None, ...] = (4, 5, 20, 21),
    cells: tuple[tuple[int, int, tuple[int, ...]], ...] = ((0, 1024, (0, 1)), (1, 1024, (2, 3))),
    hugepages: int | None = 2048,
    emulator: tuple[int, ...] = (0, 1),
    io: IOPlan | None = None,
    huge_mib: int | None = None,
) -> PlannedNode:
    """A node; ``cells`` are (host node, MiB, vCPUs) per guest cell, in guest order;
    ``huge_mib`` of its memory in ``hugepages`` pages (default: all, a VM's)."""
    numa = tuple(NumaCell(i, h, mib, v) for i, (h, mib, v) in enumerate(cells))
    cell_of = {v: c.guest_node for c in numa for v in c.vcpus}
    memory = sum(c.memory_mib for c in numa) or 2048
    floating = None in pins
    return PlannedNode(
        name=name,
        role=role,
        kind=kind,
        host="hostA",
        partition="hpc",
        pinning="shared" if floating else "dedicated",
        vcpus=tuple(VcpuPin(i, p, cell_of.get(i, 0)) for i, p in enumerate(pins)),
        cpuset=(8, 9, 10, 11) if floating else tuple(sorted(p for p in pins if p is not None)),
        emulator_cpus=emulator,
        numa=numa,
        memory_mib=memory,
        hugepages=(
            HugepageNeed(hugepages, (memory if huge_mib is None else huge_mib) * 1024 // hugepages)
            if hugepages
            else None
        ),
        mac=f"52:54:00:58:00:{index + 2:02x}",
        ip=f"10.88.0.{index + 2}",
        io=io,
    )


def make_plan(*nodes: PlannedNode, cluster: str = "demo", kind: str = "vm") -> Plan:
    return Plan(
        cluster=cluster,
        kind=kind,
        image="hpc",
        network=NET,
        nodes=nodes,
        hosts=(HostPlan("hostA", (0, 1), (), tuple(n.name for n in nodes)),),
    )


IO = IOPlan(read_bps=50_000_000, write_bps=20_000_000, read_iops=1000, write_iops=500, weight=500)


def hand_vm_plan() -> Plan:
    head = make_node("head0", 0, role="head", pins=(None, None), cells=((0, 512, (0, 1)),))
    big = make_node("compute0", 1)
    flat = make_node("compute1", 2, pins=(6, 7), cells=(), hugepages=None)
    return make_plan(head, big, flat)


def hand_container_plan() -> Plan:
    """A head without hugepages, computes with part of their memory in pages."""
    head = make_node(
        "head0",
        0,
        kind="container",
        role="head",
        pins=(None,),
        cells=((0, 1024, (0,)),),
        hugepages=None,
    )
    big = make_node("compute0", 1, kind="container", emulator=(), io=IO, huge_mib=1536)
    huge1g = make_node(
        "compute1",
        2,
        kind="container",
        pins=(6, 7),
        cells=((2, 2048, (0, 1)),),
        hugepages=1048576,
        emulator=(),
        io=IOPlan(write_bps=5_000_000, weight=100),
        huge_mib=1024,
    )
    return make_plan(head, big, huge1g, kind="container")


def ctx(accel: str = "kvm", **kw: object) -> RenderContext:
    base: dict[str, object] = {
        "base_dir": BASE,
        "kernel": f"{BASE}/images/hpc/vmlinuz",
        "initrd": f"{BASE}/images/hpc/initrd.img",
        "block_device": (8, 16),
    }
    base.update(kw)
    return RenderContext(accel="kvm" if accel == "kvm" else "tcg", **base)  # type: ignore[arg-type]


def dom(plan: Plan, name: str, c: RenderContext | None = None) -> ET.Element:
    return ET.fromstring(render_domain_xml(plan, plan.node(name), c or ctx()))


# --- libvirt XML -----------------------------------------------------------------------


def test_vcpupin_per_vcpu_equals_plan_pins() -> None:
    plan = hand_vm_plan()
    node = plan.node("compute0")
    pins = {p.get("vcpu"): p.get("cpuset") for p in dom(plan, "compute0").iter("vcpupin")}
    assert pins == {str(v.vcpu): str(v.pcpu) for v in node.vcpus}
    assert dom(plan, "compute0").findtext("vcpu") == "4"


def test_emulatorpin_equals_emulator_cpus() -> None:
    el = dom(hand_vm_plan(), "compute0").find("cputune/emulatorpin")
    assert el is not None and parse_cpulist(el.get("cpuset", "")) == [0, 1]


def test_shared_pinning_uses_vcpu_cpuset_not_pins() -> None:
    root = dom(hand_vm_plan(), "head0")
    vcpu = root.find("vcpu")
    assert vcpu is not None and vcpu.get("cpuset") == "8-11"
    assert not list(root.iter("vcpupin"))


def test_memnode_nodeset_equals_cell_host_node() -> None:
    plan = hand_vm_plan()
    root = dom(plan, "compute0")
    memnodes = {m.get("cellid"): m.get("nodeset") for m in root.iter("memnode")}
    assert memnodes == {str(c.guest_node): str(c.host_node) for c in plan.node("compute0").numa}
    mem = root.find("numatune/memory")
    assert mem is not None and (mem.get("mode"), mem.get("nodeset")) == ("strict", "0-1")
    assert all(m.get("mode") == "strict" for m in root.iter("memnode"))


def test_guest_numa_cells_match_plan() -> None:
    cells = dom(hand_vm_plan(), "compute0").findall("cpu/numa/cell")
    assert [(c.get("id"), c.get("cpus"), c.get("memory")) for c in cells] == [
        ("0", "0-1", "1048576"),
        ("1", "2-3", "1048576"),
    ]


def test_hugepage_page_size_and_nosharepages() -> None:
    root = dom(hand_vm_plan(), "compute0")
    page = root.find("memoryBacking/hugepages/page")
    assert page is not None
    assert (page.get("size"), page.get("unit"), page.get("nodeset")) == ("2048", "KiB", "0-1")
    flat = dom(hand_vm_plan(), "compute1")
    assert flat.find("memoryBacking/hugepages") is None
    for r in (root, flat):
        assert r.find("memoryBacking/nosharepages") is not None


def test_no_numa_cells_no_numatune() -> None:
    root = dom(hand_vm_plan(), "compute1")
    assert root.find("numatune") is None and root.find("cpu/numa") is None


def test_kvm_vs_tcg_domain() -> None:
    plan = hand_vm_plan()
    kvm = dom(plan, "compute0", ctx("kvm"))
    tcg = dom(plan, "compute0", ctx("tcg"))
    assert kvm.get("type") == "kvm" and tcg.get("type") == "qemu"
    cpu_k, cpu_t = kvm.find("cpu"), tcg.find("cpu")
    assert cpu_k is not None and cpu_t is not None
    assert cpu_k.get("mode") == "host-passthrough" and cpu_t.get("mode") == "maximum"
    feat = cpu_k.find("feature")
    assert feat is not None and (feat.get("policy"), feat.get("name")) == (
        "disable",
        "arch-capabilities",
    )
    assert kvm.find("clock/timer[@name='kvmclock']") is not None
    assert tcg.find("clock/timer") is None
    nic_k, nic_t = kvm.find("devices/interface/driver"), tcg.find("devices/interface/driver")
    assert nic_k is not None and nic_t is not None
    assert (nic_k.get("name"), nic_t.get("name")) == ("vhost", "qemu")


def test_features_console_and_devices() -> None:
    root = dom(hand_vm_plan(), "compute0")
    assert root.find("features/acpi") is not None and root.find("features/apic") is not None
    console = root.find("devices/console")
    assert console is not None and console.get("type") == "pty"
    balloon = root.find("devices/memballoon")
    assert balloon is not None and balloon.get("model") == "none"
    drv = root.find("devices/disk/driver")
    assert drv is not None and (drv.get("cache"), drv.get("io")) == ("none", "native")
    mtu = root.find("devices/interface/mtu")
    assert mtu is not None and mtu.get("size") == "9000"
    assert root.findtext("os/cmdline", "").startswith("console=ttyS0 root=/dev/vda rw")
    assert "no_timer_check" in root.findtext("os/cmdline", "")


def test_kernel_optional() -> None:
    root = dom(hand_vm_plan(), "compute0", RenderContext())
    assert root.find("os/kernel") is None and root.find("os/boot") is not None


@pytest.mark.parametrize(
    ("pins", "cells", "want"),
    [
        ((1, 2, 3, 4), ((0, 512, (0, 1)), (1, 512, (2, 3))), (2, 2, 1)),
        ((1, 2, 3), ((0, 512, (0, 1)), (1, 512, (2,))), (1, 3, 1)),
        ((1, 2, 3, 4), ((0, 512, (0, 2)), (1, 512, (1, 3))), (1, 4, 1)),
        ((1, 2), (), (1, 2, 1)),
    ],
)
def test_guest_topology_consistent_with_vcpus(
    pins: tuple[int, ...],
    cells: tuple[tuple[int, int, tuple[int, ...]], ...],
    want: tuple[int, int, int],
) -> None:
    node = make_node("n", 0, pins=pins, cells=cells)
    got = guest_topology(node)
    assert got == want and got[0] * got[1] * got[2] == len(pins)


def test_xml_is_deterministic() -> None:
    plan = hand_vm_plan()
    assert render_cluster(plan, ctx()) == render_cluster(plan, ctx())


# --- QEMU ------------------------------------------------------------------------------


def _opts(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_tap_name_fits_ifnamsiz_and_is_stable() -> None:
    names = {tap_name(c, f"compute{i}") for c in ("a", "a-b", "long-cluster-nm") for i in range(50)}
    assert len(names) == 150
    assert all(len(n) <= IFNAMSIZ for n in names)
    assert tap_name("a-b", "c") != tap_name("a", "b-c")
    assert tap_name("demo", "head0") == tap_name("demo", "head0")


def test_qemu_prealloc_and_bind_per_cell() -> None:
    plan = hand_vm_plan()
    node = plan.node("compute0")
    argv = qemu_argv(plan, node, ctx())
    objs = _opts(argv, "-object")
    assert len(objs) == len(node.numa)
    for cell, obj in zip(node.numa, objs, strict=True):
        assert obj.startswith(f"memory-backend-file,id=mem{cell.guest_node},size=1024M")
        assert "prealloc=on" in obj.split(",") and "policy=bind" in obj.split(",")
        assert f"host-nodes={cell.host_node}" in obj.split(",")
        assert f"mem-path={BASE}/hugepages/2048kB" in obj.split(",")
    assert _opts(argv, "-numa") == [
        "node,nodeid=0,cpus=0-1,memdev=mem0",
        "node,nodeid=1,cpus=2-3,memdev=mem1",
    ]


def test_qemu_ram_backend_without_hugepages_or_cells() -> None:
    plan = hand_vm_plan()
    argv = qemu_argv(plan, plan.node("compute1"), ctx())
    assert _opts(argv, "-object") == ["memory-backend-ram,id=mem0,size=2048M,prealloc=on"]
    assert _opts(argv, "-machine") == ["q35,mem-merge=off,memory-backend=mem0"]
    assert not _opts(argv, "-numa")


def test_qemu_virtiofs_shares_the_memory_and_adds_a_device_per_bind() -> None:
    """vhost-user needs the guest's memory shared: RAM becomes a memfd with
    share=on (its preallocation and host-node binding kept), hugetlbfs stays."""
    plan = hand_vm_plan()
    fs = (("hpvcfs0", f"{BASE}/run/demo/compute1/hpvcfs0.sock"), ("hpvcfs1", "/r/a,b.sock"))
    flat = qemu_argv(plan, plan.node("compute1"), ctx(virtiofs=fs))
    assert _opts(flat, "-object") == [
        "memory-backend-memfd,id=mem0,size=2048M,prealloc=on,share=on"
    ]
    assert _opts(flat, "-chardev")[-2:] == [
        f"socket,id=fs0,path={BASE}/run/demo/compute1/hpvcfs0.sock",
        "socket,id=fs1,path=/r/a,,b.sock",
    ]
    devices = _opts(flat, "-device")
    assert "vhost-user-fs-pci,chardev=fs0,tag=hpvcfs0" in devices
    assert "vhost-user-fs-pci,chardev=fs1,tag=hpvcfs1" in devices
    cells = _opts(qemu_argv(plan, plan.node("compute0"), ctx(virtiofs=fs)), "-object")
    assert all(o.startswith("memory-backend-file") and "share=on" in o for o in cells)
    numa = make_plan(make_node("compute2", 3, hugepages=None))
    cells = _opts(qemu_argv(numa, numa.node("compute2"), ctx(virtiofs=fs)), "-object")
    assert cells == [
        f"memory-backend-memfd,id=mem{i},size=1024M,prealloc=on,share=on,host-nodes={i},policy=bind"
        for i in (0, 1)
    ]
    plain = qemu_argv(plan, plan.node("compute1"), ctx())
    assert not any("vhost-user-fs" in d for d in _opts(plain, "-device"))


def test_qemu_accel_cpu_and_devices() -> None:
    plan = hand_vm_plan()
    node = plan.node("compute0")
    tcg = qemu_argv(plan, node, ctx("tcg"))
    kvm = qemu_argv(plan, node, ctx("kvm"))
    assert _opts(tcg, "-accel") == ["tcg,thread=multi"] and _opts(tcg, "-cpu") == ["max"]
    assert _opts(kvm, "-accel") == ["kvm"] and _opts(kvm, "-cpu") == ["host,-arch-capabilities"]
    # A guest migrated stopped is started by its target (backends/vm/migration.py).
    assert _opts(tcg, "-global") == _opts(kvm, "-global") == ["migration.store-global-state=off"]
    assert all("accel=" not in m for m in _opts(tcg, "-machine"))  # QEMU refuses both forms
    assert _opts(tcg, "-smp") == ["4,sockets=2,cores=2,threads=1"]
    assert _opts(tcg, "-name") == ["hpvc-demo-compute0,debug-threads=on"]
    drive = _opts(tcg, "-drive")[0].split(",")
    assert "cache=none" in drive and "aio=native" in drive
    net = _opts(tcg, "-netdev")[0].split(",")
    assert f"ifname={tap_name('demo', 'compute0')}" in net and "vhost=off" in net
    assert "host_mtu=9000" in _opts(tcg, "-device")[1]
    assert _opts(tcg, "-append") == ["console=ttyS0 root=/dev/vda rw no_timer_check"]
    assert _opts(tcg, "-qmp") == [f"unix:{BASE}/run/demo/compute0/qmp.sock,server=on,wait=off"]


def test_qemu_escapes_commas_in_paths() -> None:
    plan = hand_vm_plan()
    c = ctx(disk_images=(("compute0", "/img/a,b.raw"),))
    drive = _opts(qemu_argv(plan, plan.node("compute0"), c), "-drive")[0]
    assert drive.startswith("file=/img/a,,b.raw,if=none")


def test_qemu_pinning_matches_plan() -> None:
    plan = hand_vm_plan()
    dedicated = qemu_pinning(plan.node("compute0"))
    assert dedicated.vcpus == ((0, (4,)), (1, (5,)), (2, (20,)), (3, (21,)))
    assert dedicated.emulator == (0, 1)
    shared = qemu_pinning(plan.node("head0"))
    assert shared.vcpus == ((0, (8, 9, 10, 11)), (1, (8, 9, 10, 11)))
    launch = render_qemu(plan, plan.node("compute0"), ctx())
    assert launch.tap == tap_name("demo", "compute0") and launch.argv[0].endswith("x86_64")


def test_qemu_script_round_trips() -> None:
    plan = hand_vm_plan()
    script = render_cluster(plan, ctx())["compute0.qemu.sh"]
    exec_line = next(line for line in script.splitlines() if line.startswith("exec "))
    assert shlex.split(exec_line)[1:] == qemu_argv(plan, plan.node("compute0"), ctx())


# --- OCI -------------------------------------------------------------------------------


def oci(name: str, c: RenderContext | None = None) -> dict[str, object]:
    plan = hand_container_plan()
    return render_oci_config(plan, plan.node(name), c or ctx())


def test_oci_cpus_mems_memory_match_plan() -> None:
    plan = hand_container_plan()
    for node in plan.nodes:
        res = render_oci_config(plan, node, ctx())["linux"]["resources"]
        assert parse_cpulist(res["cpu"]["cpus"]) == list(node.cpuset)
        assert parse_cpulist(res["cpu"]["mems"]) == sorted({c.host_node for c in node.numa})
        # Normal memory plus hugepages: the node's memory, no more.
        huge = sum(h["limit"] for h in res.get("hugepageLimits", []))
        limit = node.memory_mib * 1024 * 1024 - huge
        assert res["memory"] == {"limit": limit, "swap": limit}
        assert limit >= 64 << 20
        assert res["cpu"]["shares"] == 1024 * len(node.vcpus)


def test_oci_shared_node_gets_quota() -> None:
    cpu = oci("head0")["linux"]["resources"]["cpu"]  # type: ignore[index]
    assert (cpu["quota"], cpu["period"]) == (100000, 100000)
    assert "quota" not in oci("compute0")["linux"]["resources"]["cpu"]  # type: ignore[index]


def test_oci_hugepage_limits() -> None:
    res = oci("compute0")["linux"]["resources"]  # type: ignore[index]
    assert res["hugepageLimits"] == [{"pageSize": "2MB", "limit": 1536 << 20}]
    assert res["memory"]["limit"] == (2048 - 1536) << 20
    res1g = oci("compute1")["linux"]["resources"]  # type: ignore[index]
    assert res1g["hugepageLimits"] == [{"pageSize": "1GB", "limit": 1024 << 20}]
    assert res1g["memory"]["limit"] == 1024 << 20
    head = oci("head0")["linux"]["resources"]  # type: ignore[index]
    assert "hugepageLimits" not in head and head["memory"]["limit"] == 1024 << 20


def test_oci_plan_of_an_older_hpvc_keeps_its_memory_limit() -> None:
    """A container node planned before hugepage_memory holds all its memory in
    pages: it renders as it was planned (memory limit = its memory), never 0."""
    node = make_node("compute0", 1, kind="container", emulator=())
    plan = make_plan(node, kind="container")
    res = render_oci_config(plan, node, ctx())["linux"]["resources"]
    assert res["memory"]["limit"] == 2048 << 20
    assert res["hugepageLimits"] == [{"pageSize": "2MB", "limit": 2048 << 20}]


def test_oci_block_io_matches_plan_and_never_sets_weight() -> None:
    res = oci("compute0")["linux"]["resources"]  # type: ignore[index]
    dev = {"major": 8, "minor": 16}
    assert res["blockIO"] == {
        "throttleReadBpsDevice": [{**dev, "rate": 50_000_000}],
        "throttleWriteBpsDevice": [{**dev, "rate": 20_000_000}],
        "throttleReadIOPSDevice": [{**dev, "rate": 1000}],
        "throttleWriteIOPSDevice": [{**dev, "rate": 500}],
    }
    only_w = oci("compute1")["linux"]["resources"]["blockIO"]  # type: ignore[index]
    assert only_w == {"throttleWriteBpsDevice": [{**dev, "rate": 5_000_000}]}
    assert "blockIO" not in oci("head0")["linux"]["resources"]  # type: ignore[index]
    no_dev = oci("compute0", ctx(block_device=None))["linux"]["resources"]  # type: ignore[index]
    assert "blockIO" not in no_dev


def test_oci_namespaces_mounts_and_cgroup() -> None:
    cfg = oci("compute0", ctx(shm_size_mib=2048))
    linux = cfg["linux"]
    assert isinstance(linux, dict)
    spaces = {n["type"]: n.get("path") for n in linux["namespaces"]}
    assert spaces == {
        "pid": None,
        "mount": None,
        "uts": None,
        "ipc": None,
        "network": "/run/netns/hpvc-demo-compute0",
    }
    assert linux["cgroupsPath"] == "/hpvc/demo/compute0"
    mounts = {m["destination"]: m for m in cfg["mounts"]}  # type: ignore[attr-defined]
    assert "size=2048m" in mounts["/dev/shm"]["options"]
    assert mounts["/dev/hugepages"]["source"] == f"{BASE}/hugepages/2048kB"
    assert mounts["/etc/hosts"]["source"] == f"{BASE}/clusters/demo/hosts"
    assert cfg["hostname"] == "compute0" and cfg["ociVersion"] == "1.0.2"
    fresh = oci("compute0", ctx(netns_dir=None))["linux"]["namespaces"]  # type: ignore[index]
    assert {"type": "network"} in fresh


# --- files -----------------------------------------------------------------------------


def test_hostfile_compute_only_or_all() -> None:
    assert hostfile(hand_vm_plan()) == "compute0 slots=4\ncompute1 slots=2\n"
    lone = make_plan(make_node("head0", 0, role="head", pins=(1, 2), cells=()))
    assert hostfile(lone) == "head0 slots=2\n"


def test_hosts_ethers_locality() -> None:
    plan = hand_vm_plan()
    text = hosts(plan)
    assert "10.88.0.2\thead0\n" in text and "10.88.0.4\tcompute1\n" in text
    assert ethers(plan).splitlines()[1] == "52:54:00:58:00:03 10.88.0.3"
    assert json.loads(locality_json(plan)) == {"hostA": ["head0", "compute0", "compute1"]}


def test_guest_network() -> None:
    plan = hand_vm_plan()
    node = plan.node("compute0")
    unit = guest_network(plan, node)
    assert f"MACAddress={node.mac}" in unit and "Address=10.88.0.3/24" in unit
    assert "Gateway=10.88.0.1" in unit and "MTUBytes=9000" in unit
    script = guest_network_script(plan, node)
    assert "ip addr add 10.88.0.3/24" in script and "mtu 9000" in script


# --- golden files ----------------------------------------------------------------------


def check_golden(case: str, artifacts: dict[str, str]) -> None:
    """Compare byte for byte with tests/golden/<case>/, or rewrite it under UPDATE."""
    folder = GOLDEN / case
    if UPDATE:
        shutil.rmtree(folder, ignore_errors=True)
        for rel, text in artifacts.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text, encoding="utf-8")
        return
    missing = [rel for rel in artifacts if not (folder / rel).is_file()]
    assert not missing, f"golden files missing in {folder}: {missing} (HPVC_UPDATE_GOLDEN=1)"
    on_disk = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert on_disk == set(artifacts), f"stale golden files: {sorted(on_disk - set(artifacts))}"
    for rel, text in artifacts.items():
        assert (folder / rel).read_text(encoding="utf-8") == text, f"{case}/{rel} differs"


HAND_CASES: dict[str, tuple[Callable[[], Plan], str]] = {
    "hand-vm-kvm": (hand_vm_plan, "kvm"),
    "hand-vm-tcg": (hand_vm_plan, "tcg"),
    "hand-container": (hand_container_plan, "kvm"),
}


@pytest.mark.parametrize("case", sorted(HAND_CASES))
def test_golden_hand_built(case: str) -> None:
    make, accel = HAND_CASES[case]
    check_golden(case, render_cluster(make(), ctx(accel)))


def _validate(path: Path) -> None:
    r = subprocess.run(
        ["virt-xml-validate", str(path), "domain"], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, f"{path}: {r.stdout}{r.stderr}"


def test_golden_xml_validates_against_libvirt_schema() -> None:
    requires("virt-xml-validate")
    files = sorted(GOLDEN.rglob("*.xml"))
    assert files, "no golden XML (HPVC_UPDATE_GOLDEN=1)"
    for path in files:
        _validate(path)


def test_variants_validate(tmp_path: Path) -> None:
    requires("virt-xml-validate")
    plan = hand_vm_plan()
    variants = [ctx("tcg"), RenderContext(), ctx("kvm", vhost=False)]
    for i, c in enumerate(variants):
        for node in plan.nodes:
            path = tmp_path / f"{i}-{node.name}.xml"
            path.write_text(render_domain_xml(plan, node, c))
            _validate(path)


# --- golden files from real plans (planner on topology snapshots) ----------------------

AMD = "64amd64-4s2n4ca2co"  # 4 sockets, 2 NUMA nodes each, 2M pools
INTEL = "16em64t-4s2c2t"  # 4 sockets, hyper-threads, no hugepage pools


def spec_data(kind: str, hugepages: str, partition: str, vcpus: int, mib: int) -> dict[str, object]:
    """A shared head and two dedicated compute nodes big enough to span two NUMA nodes."""
    io = {"read_bps": "50MB", "write_bps": "20MB", "read_iops": 2000, "weight": 500}
    return {
        "name": f"g{kind[:2]}",
        "kind": kind,
        "network": {"subnet": "10.90.0.0/24", "mtu": 9000},
        "tuning": {
            "pinning": "dedicated",
            "hugepages": hugepages,
            "numa": "mirror",
            "partition": partition,
        },
        "nodes": [
            {"role": "head", "vcpus": 2, "memory": "512MiB", "pinning": "shared"},
            {
                "role": "compute",
                "count": 2,
                "vcpus": vcpus,
                "memory": f"{mib}MiB",
                "io": io,
                # A container's compute nodes: half their memory in hugepages.
                **(
                    {"hugepage_memory": f"{mib // 2}MiB"}
                    if kind == "container" and hugepages != "none"
                    else {}
                ),
            },
        ],
    }


# case -> (snapshot, kind, hugepages, partition, compute vCPUs, compute MiB, accelerator)
REAL_CASES = {
    "vm-amd-2m-kvm": (AMD, "vm", "2M", "hpc", 12, 12288, "kvm"),
    "vm-intel-tcg": (INTEL, "vm", "none", "hpc", 6, 1024, "tcg"),
    "ct-amd-2m": (AMD, "container", "2M", "hpc", 12, 12288, "kvm"),
    "ct-intel-commodity": (INTEL, "container", "none", "commodity", 6, 2048, "kvm"),
}


def real_plan(snapshots: dict[str, Path], case: str) -> Plan:
    snap, kind, hugepages, partition, vcpus, mib, _ = REAL_CASES[case]
    spec = parse_spec(spec_data(kind, hugepages, partition, vcpus, mib))
    return plan_cluster(spec, [(snap, read_topology(snapshots[snap]))])


@pytest.mark.parametrize("case", sorted(REAL_CASES))
def test_golden_real_plans(snapshots: dict[str, Path], case: str) -> None:
    plan = real_plan(snapshots, case)
    check_golden(case, render_cluster(plan, ctx(REAL_CASES[case][6])))


@pytest.mark.parametrize("case", sorted(REAL_CASES))
def test_real_plans_render_what_they_plan(snapshots: dict[str, Path], case: str) -> None:
    """The same focused checks, on whatever the planner produced."""
    plan = real_plan(snapshots, case)
    for node in plan.nodes:
        if node.kind == "vm":
            root = ET.fromstring(render_domain_xml(plan, node, ctx()))
            pins = {p.get("vcpu"): p.get("cpuset") for p in root.iter("vcpupin")}
            assert pins == {str(v.vcpu): str(v.pcpu) for v in node.vcpus if v.pcpu is not None}
            cells = {m.get("cellid"): m.get("nodeset") for m in root.iter("memnode")}
            assert cells == {str(c.guest_node): str(c.host_node) for c in node.numa}
            sockets, cores, threads = guest_topology(node)
            assert sockets * cores * threads == len(node.vcpus)
            objs = _opts(qemu_argv(plan, node, ctx()), "-object")
            assert all("prealloc=on" in o and "policy=bind" in o for o in objs)
        else:
            res = render_oci_config(plan, node, ctx())["linux"]["resources"]
            assert parse_cpulist(res["cpu"]["cpus"]) == sorted(node.cpuset)
            assert ("hugepageLimits" in res) == (node.hugepages is not None)
            huge = sum(h["limit"] for h in res.get("hugepageLimits", []))
            assert res["memory"]["limit"] + huge == node.memory_mib << 20
            assert ("blockIO" in res) == (node.io is not None and node.io.read_bps is not None)


# --- golden files of a cluster across hosts (an inventory with fabric addresses) -------

ACROSS = "ct-across-hosts"
ACROSS_SPEC: dict[str, object] = {
    "name": "gx",
    "kind": "container",
    "network": {"subnet": "10.90.0.0/24"},  # no mtu: the fabric's minus 50
    "tuning": {"pinning": "dedicated", "hugepages": "none", "partition": "hpc"},
    "nodes": [
        {"role": "head", "vcpus": 1, "memory": "512MiB", "pinning": "shared"},
        {"role": "compute", "count": 4, "vcpus": 32, "memory": "2GiB"},
    ],
}


def inventory_file(snapshots: dict[str, Path], folder: Path) -> Path:
    """Two AMD hosts on a 9216-byte fabric, one Intel host on a 9000-byte one."""
    path = folder / "hosts.toml"
    path.write_text(
        f'[[hosts]]\nname = "amd"\ncount = 2\ntopology = "{snapshots[AMD]}"\n'
        'fabric = "10.0.0.1"\nfabric_mtu = 9216\n'
        f'[[hosts]]\nname = "intel"\ntopology = "{snapshots[INTEL]}"\nfabric = "10.0.1.1"\n'
    )
    return path


def across_plan(snapshots: dict[str, Path], folder: Path) -> Plan:
    inv = read_inventory(inventory_file(snapshots, folder))
    return plan_cluster(parse_spec(ACROSS_SPEC), inv.hosts, fabric=inv.fabric)


def test_golden_across_hosts(snapshots: dict[str, Path], tmp_path: Path) -> None:
    plan = across_plan(snapshots, tmp_path)
    # The four 32-vCPU computes fill both AMD hosts; the head floats on the Intel one.
    assert plan.locality() == {
        "amd0": ["compute0", "compute1"],
        "amd1": ["compute2", "compute3"],
        "intel": ["head0"],
    }
    assert plan.network.mtu == 8950 and plan.network.fabric_mtu == 9000
    check_golden(ACROSS, render_cluster(plan, ctx()))


def _script_facts(text: str) -> dict[str, object]:
    """What a network script does, read back from its commands."""
    lines = [ln.split("  #")[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    words = [shlex.split(ln) for ln in lines]
    add = next(w for w in words if w[:3] == ["ip", "link", "add"])
    rules = [ln for ln in lines if ln.startswith("add rule ")]
    accept = next(ln for ln in rules if ln.endswith(" accept"))
    rule = shlex.split(next(ln for ln in rules if " input " in ln and "drop" in ln))
    peers = accept.split("saddr {")[1].split("}")[0].strip().split(", ")
    hooks = {shlex.split(ln)[4]: shlex.split(ln)[5:] for ln in rules if not ln.endswith(" accept")}
    fdb = [(w[3], w[5], w[7]) for w in words if w[:2] == ["bridge", "fdb"] and "dst" in w]
    bridge = [(w[3], w[5]) for w in words if w[:2] == ["bridge", "fdb"] and "master" in w]
    assert all(
        w[-2:] == ["master", "static"]
        for w in words
        if w[:2] == ["bridge", "fdb"] and "master" in w
    )
    return {
        "link": add[3],
        "vni": int(add[add.index("id") + 1]),
        "local": add[add.index("local") + 1],
        "port": int(add[add.index("dstport") + 1]),
        "nolearning": "nolearning" in add,
        "srcport": [int(x) for x in add[add.index("srcport") + 1 : add.index("srcport") + 3]],
        "accept_sport": accept.split("udp sport ")[1].split()[0],
        "drops": sorted(hooks),
        "output": hooks["output"],
        "table": rule[3],
        "comment": rule[-1],
        "filter": (int(rule[rule.index("dport") + 1]), int(rule[rule.index("@th,96,24") + 1])),
        "peers": peers,
        "fdb": fdb,
        "bridge": bridge,
    }


def test_network_scripts_say_what_host_vxlan_applies(
    snapshots: dict[str, Path], tmp_path: Path
) -> None:
    from hpvc.host import vxlan

    plan = across_plan(snapshots, tmp_path)
    for host, _ in plan.network.vteps:
        ov = host_overlay(plan, host)
        assert ov is not None
        facts = _script_facts(network_script(plan, host))
        assert facts["link"] == vxlan.link_name(plan.cluster)
        assert (facts["vni"], facts["local"], facts["port"]) == (ov.vni, ov.local, ov.port)
        assert facts["nolearning"] is True
        # The filter: only the cluster's hosts may send into its VNI.
        assert facts["table"] == filter_table(ov.vni)
        assert facts["filter"] == (ov.port, ov.vni)
        # Only from the other hosts (not this one: local sends arrive on lo), from the
        # kernel's source ports, below 1024, which are the ones its link sends from.
        assert facts["peers"] == sorted(v.address for v in ov.remotes)
        assert ov.local not in facts["peers"]
        assert facts["srcport"] == list(SOURCE_PORTS) and SOURCE_PORTS[1] <= 1024
        assert facts["accept_sport"] == f"{SOURCE_PORTS[0]}-{SOURCE_PORTS[1] - 1}"
        assert (
            facts["comment"]
            == "hpvc: only the cluster's other hosts' kernels may send into this VNI"
        )
        # A local user's socket (another source port) is dropped before it leaves; nothing
        # into the VNI is routed through.
        assert facts["drops"] == ["forward", "input", "output"]
        assert "udp sport != " + facts["accept_sport"] in " ".join(facts["output"])
        expected = []
        for v in ov.remotes:
            expected.append(("00:00:00:00:00:00", facts["link"], v.address))
            expected += [(mac, facts["link"], v.address) for _, _, mac in v.nodes]
        assert facts["fdb"] == expected
        # The bridge knows each remote node is behind the VXLAN port (no flooding).
        remote = [(mac, facts["link"]) for v in ov.remotes for _, _, mac in v.nodes]
        assert facts["bridge"] == remote
    one_host = render_cluster(real_plan(snapshots, "ct-amd-2m"), ctx())
    assert not [rel for rel in one_host if rel.startswith("network-")]


def test_host_vxlan_applies_the_filter_render_spells(
    snapshots: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One spelling of the VNI filter: what ``hpvc up`` feeds nft is what the script shows."""
    from hpvc.host import vxlan
    from hpvc.host.journal import Journal

    plan = across_plan(snapshots, tmp_path)
    host = plan.network.vteps[0][0]
    ov = host_overlay(plan, host)
    assert ov is not None
    fed: list[tuple[list[str], str]] = []

    def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        fed.append((argv, str(kw["input"])))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(vxlan, "_nft", lambda: "/usr/sbin/nft")
    monkeypatch.setattr(vxlan.subprocess, "run", run)
    vxlan._filter(Journal(tmp_path / "j.jsonl"), ov)
    ((argv, text),) = fed
    assert argv == ["/usr/sbin/nft", "-f", "-"]
    assert text == vni_filter(ov)
    script = network_script(plan, host)
    assert f"nft -f - <<'EOF'\n{text}EOF\n" in script


# --- the command -----------------------------------------------------------------------


def test_cli_render_snapshot(
    snapshots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "vm.toml"
    spec.write_text(
        'name = "cli"\nkind = "vm"\n[[nodes]]\nrole = "head"\n'
        '[[nodes]]\nrole = "compute"\ncount = 2\nvcpus = 2\nmemory = "2GiB"\n'
    )
    out = tmp_path / "out"
    argv = ["render", str(spec), "--out", str(out), "--topology-root", str(snapshots[AMD])]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--accel", "tcg", "--state-dir", "/srv/hpvc", "--json"])
    assert e.value.code == 0
    files = json.loads(capsys.readouterr().out)
    names = sorted(Path(f).name for f in files)
    assert names == sorted(
        [
            f"{n}.{x}"
            for n in ("head0", "compute0", "compute1")
            for x in ("xml", "qemu.sh", "network")
        ]
        + ["hostfile", "hosts", "ethers", "locality.json", "plan.json"]
    )
    assert os.access(out / "compute0.qemu.sh", os.X_OK)
    xml = (out / "compute0.xml").read_text()
    assert '<domain type="qemu">' in xml and "/srv/hpvc/clusters/cli/nodes/compute0" in xml
    assert json.loads((out / "plan.json").read_text())["cluster"] == "cli"
    assert (out / "hostfile").read_text() == "compute0 slots=2\ncompute1 slots=2\n"


def test_cli_render_across_hosts_writes_a_network_script_per_host(
    snapshots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "gx.toml"
    spec.write_text(
        'name = "gx"\nkind = "container"\n[network]\nsubnet = "10.90.0.0/24"\n'
        '[tuning]\npinning = "dedicated"\nhugepages = "none"\npartition = "hpc"\n'
        '[[nodes]]\nrole = "head"\nvcpus = 1\nmemory = "512MiB"\npinning = "shared"\n'
        '[[nodes]]\nrole = "compute"\ncount = 4\nvcpus = 32\nmemory = "2GiB"\n'
    )
    inv = inventory_file(snapshots, tmp_path)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["render", str(spec), "--out", str(out), "--hosts", str(inv)])
    assert e.value.code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "network across hosts: VXLAN VNI" in printed and "node MTU 8950" in printed
    for host in ("amd0", "amd1", "intel"):
        script = out / f"network-{host}.sh"
        assert os.access(script, os.X_OK)
        assert script.read_text() == (GOLDEN / ACROSS / script.name).read_text()


def test_cli_render_bad_input_exits_2(
    snapshots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "c.toml"
    spec.write_text('name = "c"\n[[nodes]]\nrole = "head"\n')
    root = str(snapshots[AMD])
    bad = [
        ["--block-device", "sda"],
        ["--accel", "hvf"],
        ["--initrd", "/boot/initrd.img"],
    ]
    for extra in bad:
        with pytest.raises(SystemExit) as e:
            main(
                ["render", str(spec), "--out", str(tmp_path / "o"), "--topology-root", root, *extra]
            )
        assert e.value.code == 2, extra
        assert capsys.readouterr().err.startswith("hpvc: ")
    with pytest.raises(SystemExit) as e:
        main(["render", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "o")])
    assert e.value.code == 2


def test_cli_help_has_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["render", "--help"])
    out = capsys.readouterr().out
    assert "Examples" in out and "hpvc render examples/cluster.toml --out" in out


def test_a_placed_domain_keeps_everything_but_its_place() -> None:
    """A node's libvirt XML given another place (libvirt/migrate.py): vCPU pins,
    emulator CPUs and the cells' host nodes change where they were; every other
    element is the same, in the same order."""
    from hpvc.render.libvirt import placed_domain_xml, render_domain_xml

    plan = hand_vm_plan()
    node = plan.node("compute0")
    xml = render_domain_xml(plan, node, ctx())
    there = make_node("compute0", 1, pins=(12, 13, 28, 29), emulator=(2, 3),
                      cells=((1, 1024, (0, 1)), (0, 1024, (2, 3))))  # fmt: skip
    moved = ET.fromstring(placed_domain_xml(xml, there))
    before = ET.fromstring(xml)
    assert [k.tag for k in moved] == [k.tag for k in before]
    pins = {p.get("vcpu"): p.get("cpuset") for p in moved.iter("vcpupin")}
    assert pins == {"0": "12", "1": "13", "2": "28", "3": "29"}
    assert moved.find("cputune/emulatorpin").get("cpuset") == "2-3"  # type: ignore[union-attr]
    cells = {m.get("cellid"): m.get("nodeset") for m in moved.iter("memnode")}
    assert cells == {"0": "1", "1": "0"}
    same = [k.tag for k in before if k.tag not in ("vcpu", "cputune", "numatune")]
    for tag in same:
        assert ET.tostring(moved.find(tag)) == ET.tostring(before.find(tag)), tag  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        placed_domain_xml("<network/>", there)

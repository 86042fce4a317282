"""The direct-QEMU backend on the real host: tap on a bridge, QEMU, pinning, memory, undo.

No guest OS: with no kernel QEMU sits in its firmware, which is enough, since the
vCPU threads, memory backends and QMP all exist. The plan comes from this host's
own topology (``plan_cluster`` on ``read_topology("/")``); names are unique to
this process and test, traffic stays inside the test's own bridge (10.217.x.0/24),
and the fixture undoes the journal and checks that nothing is left, removing
leftovers of its own names when undo is broken.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from hpvc.backends.qemu import process as vm_qemu
from hpvc.errors import DoesNotFit, HpvcError
from hpvc.host import console_ring, hugepages, net, procfs
from hpvc.host.journal import Journal
from hpvc.plan import Plan, plan_cluster
from hpvc.render.context import RenderContext
from hpvc.render.qemu import QemuLaunch, render_qemu
from hpvc.spec.model import Spec
from hpvc.topology import read_topology
from tests.helpers import requires

pytestmark = pytest.mark.integration

PID = os.getpid()
MIB = 1 << 20


def _requires_qemu() -> None:
    requires("root", "ip")
    if shutil.which("qemu-system-x86_64") is None:
        why = "qemu-system-x86_64 not installed (make setup)"
        if os.environ.get("HPVC_REQUIRE_ALL") == "1":
            pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {why}")
        pytest.skip(why)


@dataclass
class Vm:
    """One test's names, journal, directories and started QEMUs."""

    tmp: Path
    label: str
    journal: Journal = field(init=False)
    bridge: str = field(init=False)
    taps: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # -name of every QEMU it starts

    def __post_init__(self) -> None:
        self.journal = Journal(self.tmp / "journal")
        self.bridge = net.short_ifname("hvtb", str(PID), self.label)

    def plan(
        self, pinning: str, vcpus: int, hugepages: str = "none", memory: str = "256MiB"
    ) -> Plan:
        spec = Spec.model_validate(
            {
                "name": f"q{PID % 100000}{self.label}"[:15],
                "kind": "vm",
                "network": {"subnet": f"10.217.{PID % 250}.0/24"},
                "tuning": {"pinning": pinning, "hugepages": hugepages},
                "nodes": [{"role": "compute", "vcpus": vcpus, "memory": memory}],
            }
        )
        try:
            return plan_cluster(spec, [("local", read_topology("/"))])
        except DoesNotFit as e:  # too few CPUs or memory: hardware
            pytest.skip(f"this host cannot hold the node: {e}")

    def context(self, plan: Plan, hugetlbfs: tuple[tuple[int, str], ...] = ()) -> RenderContext:
        disk = self.tmp / "disk.raw"
        with open(disk, "wb") as f:
            f.truncate(MIB)
        return RenderContext(
            base_dir=str(self.tmp / "base"),
            run_dir=str(self.tmp / "run"),
            accel="tcg",
            disk_images=((plan.nodes[0].name, str(disk)),),
            hugetlbfs=hugetlbfs,
        )

    def start(self, plan: Plan, ctx: RenderContext) -> tuple[QemuLaunch, int]:
        gw, network = plan.network.gateway, plan.network
        net.ensure_bridge(self.journal, self.bridge, gw, network.prefixlen, network.mtu)
        launch = render_qemu(plan, plan.nodes[0], ctx)
        self.taps.append(launch.tap)
        net.create_tap(self.journal, launch.tap, self.bridge, network.mtu)
        self.names.append(vm_qemu.name_of(launch.argv))
        pid = vm_qemu.start_qemu(self.journal, launch, log=self.tmp / "qemu.log")
        return launch, pid

    def leftovers(self) -> list[str]:
        left = [n for n in [self.bridge, *self.taps] if _link_exists(n)]
        return left + [f"QEMU {pid}" for name in self.names for pid in procfs.find_qemu(name)]

    def force_remove(self) -> None:
        """Last resort after a failed undo: our own QEMUs (checked by name) and links."""
        for name in self.names:
            for pid in procfs.find_qemu(name):  # matched by its -name, so ours
                os.kill(pid, 9)
        for link in [*self.taps, self.bridge]:
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)


def console_readers(launch: QemuLaunch) -> list[int]:
    """PIDs of hpvc's console readers (hpvc.host.console_reader) of this launch's log."""
    return [
        pid
        for pid in procfs.pids()
        if (argv := procfs.cmdline(pid))
        and str(console_ring.READER) in argv
        and launch.console_log in argv
    ]


def _link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


@pytest.fixture
def vm(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Vm]:
    _requires_qemu()
    label = str(abs(hash(request.node.name)) % 1000)
    env = Vm(tmp_path, label)
    yield env
    errors = env.journal.undo_all()
    left = env.leftovers()
    if left:
        env.force_remove()
    assert errors == []
    assert left == []


def _assert_gone(env: Vm, launch: QemuLaunch, pid: int) -> None:
    assert env.journal.undo_all() == []
    assert not os.path.exists(f"/proc/{pid}")
    assert not _link_exists(launch.tap)
    for path in vm_qemu.launch_files(launch.argv).sockets:
        assert not os.path.exists(path)
    assert not os.path.exists(launch.pidfile)
    assert launch.console_fifo is not None and not os.path.exists(launch.console_fifo)
    assert console_readers(launch) == []  # the serial console's reader ended too


@pytest.mark.parametrize(("pinning", "vcpus"), [("dedicated", 1), ("shared", 2)])
def test_start_pin_read_back_undo(vm: Vm, pinning: str, vcpus: int) -> None:
    plan = vm.plan(pinning, vcpus)
    node = plan.nodes[0]
    launch, pid = vm.start(plan, vm.context(plan))
    tap = Path("/sys/class/net") / launch.tap
    assert os.path.basename(os.readlink(tap / "master")) == vm.bridge
    assert int((tap / "mtu").read_text()) == plan.network.mtu

    pinned = vm_qemu.apply_pinning(launch.qmp_socket, pid, launch.pinning)
    want = {v.vcpu: {v.pcpu} if v.pcpu is not None else set(node.cpuset) for v in node.vcpus}
    assert [v["vcpu"] for v in pinned["vcpus"]] == sorted(want)
    for v in pinned["vcpus"]:
        assert os.sched_getaffinity(v["tid"]) == want[v["vcpu"]]
        assert v["name"] == f"CPU {v['vcpu']}/TCG"
    vcpu_tids = {v["tid"] for v in pinned["vcpus"]}
    others = [t for t in procfs.task_ids(pid) if t not in vcpu_tids]
    assert pid in others
    for tid in others:
        assert os.sched_getaffinity(tid) == set(node.emulator_cpus), tid

    back = vm_qemu.read_back(pid, launch.qmp_socket)
    assert {v["vcpu"]: set(v["cpus"]) for v in back["vcpus"]} == want
    assert all(set(t["cpus"]) == set(node.emulator_cpus) for t in back["emulator"])
    assert len(back["memdevs"]) == len(node.numa)
    for dev, cell in zip(back["memdevs"], node.numa, strict=True):
        assert (dev["policy"], dev["host_nodes"]) == ("bind", [cell.host_node])
        assert dev["prealloc"] is True
        assert dev["size"] == cell.memory_mib * MIB
    assert back["memory"]["base-memory"] == node.memory_mib * MIB
    assert back["kvm"]["enabled"] is False

    _assert_gone(vm, launch, pid)


def _hugetlb_kib(pid: int) -> int:
    """Hugetlb memory mapped by a process (shared and private), from /proc/PID/smaps."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if line.startswith(("Shared_Hugetlb:", "Private_Hugetlb:")):
            total += int(line.split()[1])
    return total


def test_hugetlbfs_backend_is_preallocated(vm: Vm) -> None:
    plan = vm.plan("dedicated", 1, hugepages="2M", memory="128MiB")
    node = plan.nodes[0]
    assert node.hugepages is not None and node.hugepages.count == 64
    host_node = node.numa[0].host_node if node.numa else 0
    try:
        hugepages.grow_pool(vm.journal, host_node, 2048, 64)
    except HpvcError as e:  # memory short or fragmented: the host's, not hpvc's
        pytest.skip(f"the 2M pool cannot grow by 64 pages here: {e}")
    mount = vm.tmp / "hugetlbfs-2M"
    hugepages.ensure_hugetlbfs(vm.journal, mount, 2048)
    launch, pid = vm.start(plan, vm.context(plan, hugetlbfs=((2048, str(mount)),)))

    (dev,) = vm_qemu.read_back(pid, launch.qmp_socket)["memdevs"]
    assert (dev["prealloc"], dev["share"], dev["policy"]) == (True, True, "bind")
    assert dev["host_nodes"] == [host_node]
    assert _hugetlb_kib(pid) >= 128 * 1024  # every page is there before the guest runs

    _assert_gone(vm, launch, pid)
    assert not os.path.ismount(mount)


def test_a_qemu_that_cannot_start_says_why(vm: Vm) -> None:
    plan = vm.plan("shared", 1)
    missing = vm.tmp / "missing.raw"
    ctx = replace(vm.context(plan), disk_images=((plan.nodes[0].name, str(missing)),))
    with pytest.raises(HpvcError, match=r"exited while starting.*missing\.raw"):
        vm.start(plan, ctx)
    assert [c.kind for c in vm.journal.entries()] == ["bridge", "tap", "console-ring", "qemu"]

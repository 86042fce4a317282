"""`hpvc doctor` and the host probes, against fake roots under tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpvc.cli import main
from hpvc.host import doctor, probe
from hpvc.host.accel import accelerator
from hpvc.sysroot import SysRoot

VMX_CPUINFO = "processor\t: 0\nflags\t\t: fpu vme de pse msr vmx sse2\n\n"
PLAIN_CPUINFO = "processor\t: 0\nflags\t\t: fpu vme de pse msr hypervisor sse2\n\n"
HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup /sys/fs/cgroup/blkio cgroup rw,relatime,blkio 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


def put(root: Path, path: str, text: str = "") -> Path:
    """Write ``text`` at ``root/path``, creating parents."""
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def no_tools(name: str) -> str | None:
    return None


@pytest.fixture(autouse=True)
def _no_accel_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe decides unless a test sets HPVC_ACCEL itself."""
    monkeypatch.delenv("HPVC_ACCEL", raising=False)


# --- accelerator ---------------------------------------------------------------------


def test_kvm_usable_with_vmx(tmp_path: Path) -> None:
    put(tmp_path, "dev/kvm")
    put(tmp_path, "proc/cpuinfo", VMX_CPUINFO)
    check = doctor.check_accelerator(tmp_path)
    assert accelerator(tmp_path, env={}).name == "kvm"
    assert check.status == "ok"
    assert "vmx" in check.detail
    assert check.fix == ""


def test_svm_also_gives_kvm(tmp_path: Path) -> None:
    put(tmp_path, "dev/kvm")
    put(tmp_path, "proc/cpuinfo", VMX_CPUINFO.replace("vmx", "svm"))
    assert accelerator(tmp_path, env={}).name == "kvm"


def test_kvm_device_without_vmx_and_pvm_module_is_tcg(tmp_path: Path) -> None:
    put(tmp_path, "dev/kvm")
    put(tmp_path, "proc/cpuinfo", PLAIN_CPUINFO)
    put(tmp_path, "proc/modules", "kvm_pvm 139264 0 - Live 0x0\nkvm 1142784 1 kvm_pvm, Live 0x0\n")
    check = doctor.check_accelerator(tmp_path)
    assert accelerator(tmp_path, env={}).name == "tcg"
    assert check.status == "warn"
    assert "kvm_pvm" in check.detail
    assert "vmx/svm" in check.detail


def test_pvm_seen_under_sys_module(tmp_path: Path) -> None:
    put(tmp_path, "dev/kvm")
    put(tmp_path, "proc/cpuinfo", PLAIN_CPUINFO)
    (tmp_path / "sys/module/kvm_pvm").mkdir(parents=True)
    assert "kvm_pvm" in doctor.check_accelerator(tmp_path).detail


def test_no_dev_kvm_is_tcg(tmp_path: Path) -> None:
    put(tmp_path, "proc/cpuinfo", VMX_CPUINFO)
    check = doctor.check_accelerator(tmp_path)
    assert accelerator(tmp_path, env={}).name == "tcg"
    assert check.status == "warn"
    assert "no /dev/kvm" in check.detail
    assert "kvm_pvm" not in check.detail
    assert "modprobe" in check.fix


def test_hpvc_accel_overrides_the_probe_in_the_report(tmp_path: Path) -> None:
    put(tmp_path, "dev/kvm")
    put(tmp_path, "proc/cpuinfo", VMX_CPUINFO)
    forced = doctor.check_accelerator(tmp_path, env={"HPVC_ACCEL": "tcg"})
    assert forced.status == "warn" and "forced by HPVC_ACCEL" in forced.detail
    assert forced.fix == "unset HPVC_ACCEL to probe"
    assert doctor.check_accelerator(tmp_path, env={"HPVC_ACCEL": "kvm"}).status == "ok"
    report = doctor.run_checks(tmp_path, which=no_tools, env={"HPVC_ACCEL": "tcg"})
    assert report.accelerator == "tcg"


# --- hugepages -----------------------------------------------------------------------


def make_pools(root: Path) -> None:
    """2MiB and 1GiB pools on node0 and node1 with distinct counts."""
    for kb in (2048, 1048576):
        (root / f"sys/kernel/mm/hugepages/hugepages-{kb}kB").mkdir(parents=True)
    counts = {
        (0, 2048): (512, 500),
        (0, 1048576): (2, 1),
        (1, 2048): (256, 7),
        (1, 1048576): (4, 3),
    }
    for (node, kb), (total, free) in counts.items():
        base = f"sys/devices/system/node/node{node}/hugepages/hugepages-{kb}kB"
        put(root, f"{base}/nr_hugepages", f"{total}\n")
        put(root, f"{base}/free_hugepages", f"{free}\n")


def test_hugepage_pools_two_sizes_two_nodes(tmp_path: Path) -> None:
    make_pools(tmp_path)
    assert probe.hugepage_sizes(tmp_path) == [2048, 1048576]
    pools = {(p.node, p.size_kb): (p.total, p.free) for p in probe.hugepage_pools(tmp_path)}
    assert pools == {
        (0, 2048): (512, 500),
        (0, 1048576): (2, 1),
        (1, 2048): (256, 7),
        (1, 1048576): (4, 3),
    }
    check = doctor.check_hugepages(tmp_path)
    assert check.status == "ok"
    assert "sizes 2MiB, 1GiB" in check.detail
    assert "node0: 2MiB 512 total 500 free, 1GiB 2 total 1 free" in check.detail
    assert "node1: 2MiB 256 total 7 free, 1GiB 4 total 3 free" in check.detail


def test_no_hugepages_is_missing(tmp_path: Path) -> None:
    assert doctor.check_hugepages(tmp_path).status == "missing"


def test_hugetlbfs_mount_detected(tmp_path: Path) -> None:
    assert doctor.check_hugetlbfs(tmp_path).status == "warn"
    assert "hpvc mounts one" in doctor.check_hugetlbfs(tmp_path).fix
    put(tmp_path, "proc/mounts", "hugetlbfs /dev/hugepages hugetlbfs rw,pagesize=2M 0 0\n")
    check = doctor.check_hugetlbfs(tmp_path)
    assert check.status == "ok"
    assert "/dev/hugepages (2M)" in check.detail


def test_thp_mode(tmp_path: Path) -> None:
    put(tmp_path, "sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n")
    assert doctor.check_thp(tmp_path).detail.startswith("madvise")


# --- cgroups and bfq -----------------------------------------------------------------


def test_hybrid_cgroups_with_hugetlb_on_cgroup2_warns(tmp_path: Path) -> None:
    put(tmp_path, "proc/mounts", HYBRID_MOUNTS)
    put(tmp_path, "sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n")
    layout = probe.cgroup_layout(tmp_path)
    assert layout.mode == "hybrid"
    assert layout.v1["memory"] == "/sys/fs/cgroup/memory"
    assert "hugetlb" not in layout.v1
    assert layout.v2 == ("hugetlb",)
    check = doctor.check_cgroups(tmp_path)
    assert check.status == "warn"
    assert "crun" in check.detail
    assert check.fix == (
        "mkdir -p /sys/fs/cgroup/hugetlb && "
        "mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb"
    )


def test_hybrid_with_hugetlb_bound_to_v1_is_ok(tmp_path: Path) -> None:
    mounts = HYBRID_MOUNTS + "cgroup /sys/fs/cgroup/hugetlb cgroup rw,hugetlb 0 0\n"
    put(tmp_path, "proc/mounts", mounts)
    put(tmp_path, "sys/fs/cgroup/unified/cgroup.controllers", "")
    check = doctor.check_cgroups(tmp_path)
    assert probe.cgroup_layout(tmp_path).mode == "hybrid"
    assert check.status == "ok", check


def test_pure_v2_and_v1_modes(tmp_path: Path) -> None:
    put(tmp_path, "proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    put(tmp_path, "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids\n")
    assert probe.cgroup_layout(tmp_path).mode == "v2"
    assert doctor.check_cgroups(tmp_path).status == "ok"
    put(tmp_path, "proc/mounts", "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n")
    check = doctor.check_cgroups(tmp_path)
    assert probe.cgroup_layout(tmp_path).mode == "v1"
    assert check.status == "warn"
    assert "cpuset" in check.detail


def test_cgroups_from_proc_self_cgroup(tmp_path: Path) -> None:
    put(tmp_path, "proc/self/cgroup", "2:memory:/\n1:cpu,cpuacct:/\n0::/\n")
    layout = probe.cgroup_layout(tmp_path)
    assert layout.mode == "hybrid"
    assert {"memory", "cpu", "cpuacct"} <= set(layout.v1)
    assert doctor.check_cgroups(Path(tmp_path / "empty")).status == "missing"


def test_proc_cgroups_of_a_process(tmp_path: Path) -> None:
    put(tmp_path, "proc/42/cgroup", "3:memory:/hpvc/c/n\n2:cpu,cpuacct:/hpvc/c/n\n0::/x\n")
    assert probe.proc_cgroups(42, tmp_path) == [
        ("memory", "/hpvc/c/n"),
        ("cpu,cpuacct", "/hpvc/c/n"),
        ("", "/x"),
    ]
    assert probe.proc_cgroups(43, tmp_path) == []


def test_mounts_under(tmp_path: Path) -> None:
    put(tmp_path, "proc/mounts", "proc /srv/a\\040b/proc proc rw 0 0\nx /srv/ab x rw 0 0\n")
    assert probe.mounts_under(Path("/srv/a b"), SysRoot(tmp_path)) == ["/srv/a b/proc"]


def test_bfq(tmp_path: Path) -> None:
    put(tmp_path, "sys/block/vda/queue/scheduler", "[mq-deadline] none\n")
    check = doctor.check_bfq(tmp_path)
    assert check.status == "warn"
    assert check.fix == "modprobe bfq"
    put(tmp_path, "sys/block/sda/queue/scheduler", "mq-deadline [bfq] none\n")
    check = doctor.check_bfq(tmp_path)
    assert check.status == "ok"
    assert "1 of 2" in check.detail
    assert "active on sda" in check.detail


# --- tools, network, NUMA ------------------------------------------------------------


def test_missing_tool_names_debian_package() -> None:
    def which(name: str) -> str | None:
        return None if name == "crun" else f"/usr/bin/{name}"

    checks = {c.name: c for c in (doctor.check_tool(t, which) for t in doctor.TOOLS)}
    assert checks["crun"].status == "missing"
    assert checks["crun"].fix == "apt-get install crun"
    assert checks["qemu"].status == "ok"
    assert checks["qemu"].fix == ""


def test_every_tool_has_its_package() -> None:
    checks = {c.name: c for c in (doctor.check_tool(t, no_tools) for t in doctor.TOOLS)}
    assert all(c.status == "missing" for c in checks.values())
    assert checks["qemu"].fix == "apt-get install qemu-system-x86"
    assert checks["slurm"].fix == "apt-get install slurm-wlm"
    assert checks["munge"].fix == "apt-get install munge"
    assert "openmpi-bin" in checks["mpi"].fix and "mpich" in checks["mpi"].fix
    assert checks["hwloc"].fix == "apt-get install hwloc"
    assert checks["iproute2"].fix == "apt-get install iproute2"
    assert "libvirt-daemon-system" in checks["libvirt"].fix


def test_partial_libvirt_and_any_mpi() -> None:
    have = {"virsh", "mpiexec.mpich"}

    def which(name: str) -> str | None:
        return f"/usr/bin/{name}" if name in have else None

    libvirt = next(t for t in doctor.TOOLS if t.name == "libvirt")
    mpi = next(t for t in doctor.TOOLS if t.name == "mpi")
    check = doctor.check_tool(libvirt, which)
    assert (check.status, check.fix) == ("missing", "apt-get install libvirt-daemon-system")
    assert doctor.check_tool(mpi, which).status == "ok"


def test_which_under_root(tmp_path: Path) -> None:
    tool = put(tmp_path, "usr/sbin/libvirtd", "#!/bin/sh\n")
    tool.chmod(0o755)
    put(tmp_path, "usr/bin/virsh", "not executable")
    which = probe.which_under(tmp_path)
    assert which("libvirtd") == str(tool)
    assert which("virsh") is None


def test_network_checks(tmp_path: Path) -> None:
    assert doctor.check_bridge(tmp_path).fix == "modprobe bridge"
    assert doctor.check_tun(tmp_path).status == "missing"
    vhost = doctor.check_vhost_net(tmp_path)
    assert vhost.status == "warn" and "vhost=off" in vhost.detail
    put(tmp_path, "proc/modules", "bridge 311296 0 - Live 0x0\nveth 36864 0 - Live 0x0\n")
    put(tmp_path, "dev/net/tun")
    put(tmp_path, "dev/vhost-net")
    for check in (doctor.check_bridge, doctor.check_tun, doctor.check_vhost_net, doctor.check_veth):
        assert check(tmp_path).status == "ok"
    assert doctor.check_veth(tmp_path).detail == "veth module loaded"


def test_bridge_netfilter_is_reported_never_changed(tmp_path: Path) -> None:
    check = doctor.check_bridge_netfilter(tmp_path)
    assert check.status == "ok" and "not loaded" in check.detail
    for knob in ("iptables", "ip6tables", "arptables"):
        put(tmp_path, f"proc/sys/net/bridge/bridge-nf-call-{knob}", "0\n")
    assert doctor.check_bridge_netfilter(tmp_path).status == "ok"
    put(tmp_path, "proc/sys/net/bridge/bridge-nf-call-iptables", "1\n")
    check = doctor.check_bridge_netfilter(tmp_path)
    assert check.status == "warn"
    assert check.detail.startswith("bridge-nf-call-iptables = 1: every frame on a cluster bridge")
    assert "net.bridge.bridge-nf-call-iptables=0" in check.fix and "Docker" in check.fix
    assert "bridge-netfilter" in {
        c.name for c in doctor.run_checks(tmp_path, which=no_tools).checks
    }


def test_numa_nodes_and_cpus(tmp_path: Path) -> None:
    put(tmp_path, "sys/devices/system/node/node0/cpulist", "0-3,8\n")
    put(tmp_path, "sys/devices/system/node/node1/cpulist", "4-7\n")
    check = doctor.check_numa(tmp_path)
    assert check.detail == "2 nodes, 9 CPUs (node0: 0-3,8; node1: 4-7)"


# --- the whole report and the CLI ----------------------------------------------------


def test_report_summary_counts(tmp_path: Path) -> None:
    put(tmp_path, "dev/kvm")
    put(tmp_path, "proc/cpuinfo", VMX_CPUINFO)
    make_pools(tmp_path)
    report = doctor.run_checks(tmp_path, which=no_tools)
    assert report.accelerator == "kvm"
    summary = report.summary()
    assert sum(summary.values()) == len(report.checks)
    assert summary["missing"] >= len(doctor.TOOLS)
    assert all((c.fix == "") == (c.status == "ok") for c in report.checks)


def test_cli_json_on_live_host(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--json"])
    assert exit_info.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"checks", "accelerator", "summary"}
    assert data["accelerator"] in ("kvm", "tcg")
    assert set(data["summary"]) == {"ok", "warn", "missing"}
    assert sum(data["summary"].values()) == len(data["checks"])
    for check in data["checks"]:
        assert set(check) == {"name", "status", "detail", "fix"}
        assert check["status"] in ("ok", "warn", "missing")
    names = {c["name"] for c in data["checks"]}
    assert {"accelerator", "hugepages", "cgroups", "crun", "numa"} <= names


def test_cli_table_and_strict_on_fake_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--root", str(tmp_path)])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "accelerator: tcg" in out
    assert "missing" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--strict", "--root", str(tmp_path)])
    assert exit_info.value.code == 1
    assert "doctor --strict" in capsys.readouterr().err


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    out = capsys.readouterr().out
    assert "Examples" in out and "hpvc doctor --json" in out


def test_the_report_says_whether_a_resident_hpvc_answers(tmp_path: Path) -> None:
    import socket

    from hpvc.cluster import doctor as cluster_doctor

    path = str(tmp_path / "serve.sock")
    missing = cluster_doctor.resident_check(path)
    assert (missing.name, missing.status) == ("resident hpvc", "warn")
    assert missing.fix.startswith("hpvc serve")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        assert cluster_doctor.resident_check(path).status == "ok"
    # A snapshot is not this host: nothing about its resident hpvc.
    names = [c.name for c in cluster_doctor.run_checks(tmp_path, which=lambda _: None).checks]
    assert "resident hpvc" not in names


def test_agent_port_fence_follows_the_sysctl(tmp_path: Path) -> None:
    """Issue 25, item 8: VM guests' agents trust source ports below 1024; doctor says
    when users may bind them (the sysctl lowered) and how to put it back."""
    sysctl = "proc/sys/net/ipv4/ip_unprivileged_port_start"
    check = doctor.check_agent_port(tmp_path)
    assert check.status == "warn" and "unreadable" in check.detail, check
    put(tmp_path, sysctl, "1024\n")
    assert doctor.check_agent_port(tmp_path).status == "ok"
    put(tmp_path, sysctl, "0\n")
    check = doctor.check_agent_port(tmp_path)
    assert check.status == "warn", check
    assert "ports 0-1023" in check.detail, check
    assert check.fix == "sysctl -w net.ipv4.ip_unprivileged_port_start=1024"
    put(tmp_path, sysctl, "80\n")
    assert "ports 80-1023" in doctor.check_agent_port(tmp_path).detail
    names = [c.name for c in doctor.run_checks(tmp_path, which=no_tools, env={}).checks]
    assert names.count("agent-port") == 1, names

"""The pure parts of moving a VM node between a Slurm job's hosts (hpvc.slurm.migrate,
hpvc.host.vxlan.follow_batch): the job's memory per host from scontrol, the
site's remote command, the forwarding entries each host gets, what the guest
sees of a placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.backends.vm.migration import MigrationSettings
from hpvc.errors import InputError
from hpvc.host.vxlan import follow_batch
from hpvc.slurm.migrate import allocation_memory, guest_view, settings_args, via_argv

SCONTROL = """JobId=7 JobName=wrap
   NodeList=n[1-2]
   TRES=cpu=2,mem=800M,node=2,billing=2
     Nodes=n1 CPU_IDs=0 Mem=400 GRES=
     Nodes=n2 CPU_IDs=1 Mem=500 GRES=
   MinCPUsNode=1 MinMemoryNode=400M
"""


def test_allocation_memory_per_host() -> None:
    assert allocation_memory(SCONTROL) == {"n1": 400, "n2": 500}
    ranged = "     Nodes=n[3-4] CPU_IDs=0-1 Mem=1024 GRES=\n"
    assert allocation_memory(ranged) == {"n3": 1024, "n4": 1024}
    assert allocation_memory("JobId=7 NodeList=n1\n") == {}


def test_via_puts_the_host_in_the_template_quoted() -> None:
    argv = via_argv("ssh -o BatchMode=yes {host}", "n2", ["hpvc", "node", "ls"])
    assert argv == ["ssh", "-o", "BatchMode=yes", "n2", "hpvc", "node", "ls"]
    odd = via_argv("on.sh {host}", "a b", ["x"])
    assert odd == ["on.sh", "a b", "x"]
    with pytest.raises(InputError, match="has no"):
        via_argv("ssh n2", "n2", ["x"])


def test_settings_travel_to_the_target() -> None:
    s = MigrationSettings(bandwidth_mib_s=100, downtime_ms=30, multifd=0, timeout_s=60)
    assert settings_args(s) == [
        "--bandwidth=100",
        "--downtime-ms=30",
        "--multifd=0",
        "--timeout=60",
    ]


def test_follow_points_the_mac_at_the_new_host() -> None:
    away = follow_batch("vxabc", "52:54:00:00:00:05", "10.250.0.3", "10.250.0.2")
    assert away.splitlines() == [
        "fdb replace 52:54:00:00:00:05 dev vxabc dst 10.250.0.3 self permanent",
        "fdb replace 52:54:00:00:00:05 dev vxabc master static",
    ]
    # The node arrived here: the link forgets it; the bridge learns it on its tap.
    here = follow_batch("vxabc", "52:54:00:00:00:05", None, "10.250.0.2")
    assert here.splitlines() == [
        "fdb del 52:54:00:00:00:05 dev vxabc master",
        "fdb del 52:54:00:00:00:05 dev vxabc dst 10.250.0.2 self",
    ]
    assert follow_batch("vxabc", "52:54:00:00:00:05", None, None) == ""


def _node(pcpu: int, host_node: int, mac: str = "52:54:00:00:00:05") -> dict[str, object]:
    return {
        "vcpus": [{"vcpu": 0, "pcpu": pcpu, "guest_node": 0}],
        "numa": [{"guest_node": 0, "host_node": host_node, "memory_mib": 384, "vcpus": [0]}],
        "memory_mib": 384,
        "hugepages": None,
        "mac": mac,
        "ip": "10.88.60.3",
    }


def test_guest_view_ignores_the_host_side_only() -> None:
    assert guest_view(_node(0, 0)) == guest_view(_node(1, 1))  # other CPUs and host node
    assert guest_view(_node(0, 0)) != guest_view(_node(0, 0, mac="52:54:00:00:00:06"))
    bigger = {**_node(0, 0), "memory_mib": 512}
    assert guest_view(_node(0, 0)) != guest_view(bigger)


def test_guards_let_only_the_source_reach_the_target() -> None:
    from hpvc.host.migration_guard import source_rules, target_rules

    t = target_rules("hpvc-mig-x", "10.250.0.3", 40000, "10.250.0.2")
    assert (
        "add rule inet hpvc-mig-x input ip daddr 10.250.0.3 tcp dport 40000"
        " ip saddr != 10.250.0.2 counter drop" in t.splitlines()
    )
    s = source_rules("hpvc-mig-x", "10.250.0.3", 40000, 1234).splitlines()
    assert (
        "add rule inet hpvc-mig-x output ip daddr 10.250.0.3 tcp dport 40000"
        " meta skuid != { 0, 1234 } counter drop" in s
    )
    assert "add rule inet hpvc-mig-x forward ip daddr 10.250.0.3 tcp dport 40000 counter drop" in s
    assert s.count("add table inet hpvc-mig-x") == 1


def test_disk_access_reaches_only_the_disk_and_is_undone(tmp_path: Path) -> None:
    """The QEMU uid gets search on the folders down to the disk and read-write on
    it (setfacl), and nothing once the journal is undone."""
    import shutil
    import subprocess

    from hpvc.host import disk_access
    from hpvc.host.journal import Journal

    if shutil.which("setfacl") is None:
        pytest.fail("setfacl missing (apt-get install acl; scripts/setup.sh installs it)")
    disk = tmp_path / "clusters" / "j1-0" / "nodes" / "compute1" / "disk.qcow2"
    disk.parent.mkdir(parents=True)
    disk.write_bytes(b"")
    for p in (tmp_path / "clusters", tmp_path / "clusters" / "j1-0"):
        p.chmod(0o700)  # hpvc's own folders: root's alone
    (tmp_path / "clusters" / "j1-0" / "nodes").chmod(0o755)
    closed = disk_access.closed_folders(disk)
    assert tmp_path / "clusters" in closed and tmp_path / "clusters" / "j1-0" in closed
    assert tmp_path / "clusters" / "j1-0" / "nodes" not in closed  # o+x already
    j = Journal(tmp_path / "journal")
    disk_access.grant(j, disk, tmp_path, 65534)

    def acl(p: Path) -> str:
        return subprocess.run(["getfacl", "-cpn", str(p)], capture_output=True, text=True).stdout

    assert "user:65534:--x" in acl(tmp_path / "clusters" / "j1-0")
    assert "user:65534:rw-" in acl(disk)
    assert j.undo_all() == []
    assert "65534" not in acl(disk) and "65534" not in acl(tmp_path / "clusters")

"""The one root object every host reader takes (architecture rule 2)."""

from __future__ import annotations

from pathlib import Path

from hpvc.sysroot import HOST, SysRoot, as_root
from hpvc.topology import offline_cpus, read_topology


def test_at_joins_absolute_paths_under_the_root(tmp_path: Path) -> None:
    assert HOST.at("/proc/mounts") == Path("/proc/mounts")
    assert SysRoot(tmp_path).at("/sys/block") == tmp_path / "sys/block"
    assert SysRoot(tmp_path).at("dev/kvm") == tmp_path / "dev/kvm"
    assert HOST.is_host and not SysRoot(tmp_path).is_host
    assert str(SysRoot(tmp_path)) == str(tmp_path)


def test_as_root_accepts_a_sysroot_a_path_or_a_string(tmp_path: Path) -> None:
    root = SysRoot(tmp_path)
    assert as_root(root) is root
    assert as_root(tmp_path) == root
    assert as_root(str(tmp_path)) == root
    assert as_root(None) is HOST
    assert as_root("/") == HOST


def test_topology_reads_under_a_sysroot(tmp_path: Path) -> None:
    cpu = tmp_path / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-1\n")
    (cpu / "present").write_text("0-2\n")
    for n in (0, 1):
        (cpu / f"cpu{n}/topology").mkdir(parents=True)
    assert read_topology(SysRoot(tmp_path)).online_cpus == read_topology(tmp_path).online_cpus
    assert offline_cpus(SysRoot(tmp_path)) == (2,)

"""A cluster's NFS-server cgroup (hpvc.host.io_coord) on fake cgroupfs trees.

Made with its journal step before anything else, undone leaving nothing (the
parents it made too), kept with the PIDs named while tasks are in it;
throttles written and read back (v1 files, v2 io.max); the cgroup's own
counters read; where a folder's data ends up (the disk, through a loop).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpvc.errors import HpvcError, InputError
from hpvc.host import io_coord
from hpvc.host.journal import Journal
from tests.unit.test_cgroups import CG, FakeKernel, _v1_tree, _v2_tree


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    k = FakeKernel(tmp_path)
    monkeypatch.setattr(io_coord, "_rmdir", k.rmdir)
    return k


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state" / "journal")


def test_v1_server_cgroup_journaled_then_made_and_undone(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    (root / CG / "blkio/hpvc/c1").mkdir(parents=True)  # the cluster's, made at prepare
    procs = io_coord.server_cgroup(
        journal, "c1", export_dir=tmp_path / "export", stable_writes=True, root=root
    )
    assert procs == root / CG / "blkio/hpvc/c1/nfs-server/cgroup.procs"
    (step,) = journal.entries()
    assert step.kind == "io-server-cgroup"
    assert step.args["path"] == "/hpvc/c1/nfs-server" and step.args["stable_writes"] is True
    assert step.args["export"] == str(tmp_path / "export") and step.args["made_parents"] == []
    cg = io_coord.find("c1", root)
    assert cg is not None and cg.version == "v1" and cg.procs == procs
    assert journal.undo_all() == []
    assert not procs.parent.exists() and (root / CG / "blkio/hpvc/c1").is_dir()  # not ours


def test_undo_removes_the_parents_it_made_and_keeps_a_busy_cgroup(
    tmp_path: Path, journal: Journal, kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(io_coord, "SETTLE_S", 0.1)
    root = _v1_tree(tmp_path)
    procs = io_coord.server_cgroup(journal, "c2", export_dir=tmp_path, root=root)
    procs.write_text("4242\n")
    (left,) = journal.undo_all()
    assert "tasks are still in it (4242)" in left and procs.parent.is_dir()
    procs.write_text("")
    assert journal.undo_all() == []
    assert not (root / CG / "blkio/hpvc").exists()  # /hpvc and /hpvc/c2 were made here


def test_a_bad_cluster_name_is_refused_before_anything(tmp_path: Path, journal: Journal) -> None:
    root = _v1_tree(tmp_path)
    with pytest.raises(InputError):
        io_coord.server_cgroup(journal, "../x", export_dir=tmp_path, root=root)
    assert journal.entries() == []


def test_v1_throttles_and_counters(tmp_path: Path, journal: Journal, kernel: FakeKernel) -> None:
    root = _v1_tree(tmp_path)
    io_coord.server_cgroup(journal, "c1", export_dir=tmp_path, root=root)
    cg = io_coord.find("c1", root)
    assert cg is not None
    io_coord.set_limits(cg, (254, 0), {"write": 20_000_000})
    assert (cg.dir / "blkio.throttle.write_bps_device").read_text() == "254:0 20000000"
    assert io_coord.limits(cg) == {"254:0": {"read": None, "write": 20_000_000}}
    io_coord.set_limits(cg, (254, 0), {"write": None})
    assert io_coord.limits(cg) == {"254:0": {"read": None, "write": None}}
    with pytest.raises(InputError):
        io_coord.set_limits(cg, (254, 0), {"write": 0})
    (cg.dir / "blkio.throttle.io_service_bytes").write_text(
        "7:3 Read 100\n7:3 Write 5000\n7:3 Sync 0\n254:0 Write 7\nTotal 5107\n"
    )
    assert io_coord.io_bytes(cg) == {
        "7:3": {"read": 100, "write": 5000},
        "254:0": {"read": 0, "write": 7},
    }


def test_v2_io_max_and_io_stat(tmp_path: Path, journal: Journal, kernel: FakeKernel) -> None:
    root = _v2_tree(tmp_path)
    procs = io_coord.server_cgroup(journal, "c1", export_dir=tmp_path, root=root)
    assert procs == root / CG / "hpvc/c1/nfs-server/cgroup.procs"
    assert "io" in (root / CG / "hpvc/c1/cgroup.subtree_control").read_text()
    cg = io_coord.find("c1", root)
    assert cg is not None and cg.version == "v2"
    io_coord.set_limits(cg, (8, 0), {"read": 5_000_000})
    assert (cg.dir / "io.max").read_text() == "8:0 rbps=5000000"
    (cg.dir / "io.stat").write_text("8:0 rbytes=10 wbytes=20 rios=1 wios=2\n")
    assert io_coord.io_bytes(cg) == {"8:0": {"read": 10, "write": 20}}


def test_no_block_io_controller_is_one_clear_error(tmp_path: Path, journal: Journal) -> None:
    root = _v2_tree(tmp_path, delegated="cpu")
    (root / CG / "cgroup.controllers").write_text("cpu memory")
    with pytest.raises(HpvcError, match="no blkio"):
        io_coord.server_cgroup(journal, "c1", export_dir=tmp_path, root=root)


def _fake_dev(root: Path, path: Path) -> str:
    st = os.stat(path)
    key = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    (root / "sys/dev/block" / key).mkdir(parents=True, exist_ok=True)
    return key


def test_storage_of_a_folder_and_of_a_loop_file_system(tmp_path: Path) -> None:
    root = tmp_path / "root"
    export = tmp_path / "export"
    export.mkdir()
    assert io_coord.storage(export, root) is None  # no such device under the root
    key = _fake_dev(root, export)
    disk = tuple(int(x) for x in key.split(":"))
    assert io_coord.storage(export, root) == io_coord.Storage(disk)  # type: ignore[arg-type]
    loop = root / "sys/dev/block" / key / "loop"  # pretend the export is a loop file system
    loop.mkdir()
    (loop / "backing_file").write_text(f"{tmp_path / 'export.img'}\n")
    got = io_coord.storage(export, root)
    assert got is not None and got.loop == disk
    assert got.devices() == (disk,)
    assert io_coord.storage(tmp_path / "missing", root) is None

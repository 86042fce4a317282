"""The cgroup managers (hpvc.host.cgroupfs): which one a host's layout gets, each
one's operations on a fake root of its layout, and the undo of journals an older
hpvc wrote. Most tests run once per layout and ask the same questions of both
managers: the answers differ only where the kernel's files do."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hpvc.errors import HpvcError
from hpvc.host import cgroups, hugepages, io_coord, journal
from hpvc.host.cgroupfs import find_manager, manager
from hpvc.host.cgroupfs.base import CgroupManager
from hpvc.host.cgroupfs.v1 import V1Manager
from hpvc.host.cgroupfs.v2 import V2Manager
from hpvc.host.journal import Journal
from hpvc.host.probe import Mount
from tests.unit.test_cgroups import CG, FakeKernel, _v1_tree, _v2_tree, _write

TREES: dict[str, Callable[[Path], Path]] = {"v1": _v1_tree, "v2": _v2_tree}
NODE = "/hpvc/c/n0"
SRC = Path(__file__).resolve().parents[2] / "src" / "hpvc"


@pytest.fixture(params=["v1", "v2"])
def m(request: pytest.FixtureRequest, tmp_path: Path) -> CgroupManager:
    return manager(TREES[request.param](tmp_path))


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    k = FakeKernel(tmp_path)
    monkeypatch.setattr(cgroups, "_rmdir", k.rmdir)
    monkeypatch.setattr(cgroups, "_runner", k.run)
    monkeypatch.setattr(io_coord, "_rmdir", k.rmdir)
    return k


# --- the choice ----------------------------------------------------------------------


def test_a_hybrid_host_gets_the_v1_manager(tmp_path: Path) -> None:
    got = manager(_v1_tree(tmp_path))
    assert type(got) is V1Manager and got.version == "v1"
    assert got.layout.mode == "hybrid"


def test_a_pure_v1_host_gets_the_v1_manager(tmp_path: Path) -> None:
    _write(tmp_path / "proc/mounts", f"cgroup /{CG}/memory cgroup rw,memory 0 0\n")
    assert type(manager(tmp_path)) is V1Manager


def test_a_v2_host_gets_the_v2_manager(tmp_path: Path) -> None:
    got = manager(_v2_tree(tmp_path))
    assert type(got) is V2Manager and got.version == "v2"


def test_no_cgroup_filesystem_gets_no_manager(tmp_path: Path) -> None:
    _write(tmp_path / "proc/mounts", "proc /proc proc rw 0 0\n")
    assert find_manager(tmp_path) is None
    with pytest.raises(HpvcError, match="no cgroup filesystem is mounted"):
        manager(tmp_path)


def test_without_cgroup_mounts_proc_self_cgroup_decides(tmp_path: Path) -> None:
    _write(tmp_path / "a/proc/self/cgroup", "2:memory:/\n0::/\n")
    _write(tmp_path / "b/proc/self/cgroup", "0::/\n")
    assert type(find_manager(tmp_path / "a")) is V1Manager
    assert type(find_manager(tmp_path / "b")) is V2Manager


def test_a_mount_table_already_read_is_the_one_used(tmp_path: Path) -> None:
    root = _v1_tree(tmp_path)
    (root / CG / "cgroup.controllers").write_text("cpu io")
    got = find_manager(root, [Mount("cgroup2", f"/{CG}", "cgroup2", ("rw",))])
    assert type(got) is V2Manager and got.layout.v2 == ("cpu", "io")


# --- where ---------------------------------------------------------------------------


def test_v1_folders_are_per_controller(tmp_path: Path) -> None:
    root = _v1_tree(tmp_path)
    m = manager(root)
    assert m.dir("memory", NODE) == root / CG / "memory/hpvc/c/n0"
    assert m.dir("io", NODE) is None  # not a v1 controller
    assert m.io_mount() == f"/{CG}/blkio"
    assert m.hierarchies() == [f"/{CG}/{c}" for c in m.CONTROLLERS]  # not systemd, unified


def test_v2_folders_are_one_tree(tmp_path: Path) -> None:
    root = _v2_tree(tmp_path)
    m = manager(root)
    assert m.dir("memory", NODE) == m.dir("blkio", NODE) == root / CG / "hpvc/c/n0"
    assert m.hierarchies() == [f"/{CG}"]
    assert m.io_mount() == f"/{CG}"
    (root / CG / "cgroup.controllers").write_text("cpu memory")
    assert manager(root).io_mount() is None  # no io controller


def test_exists_in_the_hierarchies_hpvc_uses(m: CgroupManager) -> None:
    assert not m.exists(NODE)
    d = m.dir("pids", NODE)
    assert d is not None
    d.mkdir(parents=True)
    assert m.exists(NODE)


# --- making --------------------------------------------------------------------------


def test_make_cluster_puts_the_cpus_where_the_layout_keeps_them(m: CgroupManager) -> None:
    exclusive, _ = m.make_cluster("hpvc", "c", "0-1", "0", False)
    d = m.dir("cpuset", "/hpvc/c")
    assert d is not None and exclusive is False
    assert (d / "cpuset.cpus").read_text() == "0-1"
    assert (d / "cpuset.mems").read_text() == "0"
    assert all((Path(str(m.root)) / t.lstrip("/") / "hpvc/c").is_dir() for t in m.hierarchies())


def test_enable_writes_subtree_control_on_v2_only(m: CgroupManager, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    _write(b / "cgroup.subtree_control", "cpu io")  # what the kernel shows once enabled
    m.enable((a, b), ["io", "cpu"])
    expect = {"v1": None, "v2": "+io +cpu"}[m.version]
    got = (a / "cgroup.subtree_control").read_text() if expect else None
    assert got == expect
    assert (b / "cgroup.subtree_control").read_text() == "cpu io"  # nothing to add


def test_hugetlb_mount_target_only_where_v1_lacks_hugetlb(tmp_path: Path) -> None:
    assert manager(_v1_tree(tmp_path / "a", hugetlb=False)).hugetlb_mount_target() == (
        f"/{CG}/hugetlb"
    )
    assert manager(_v1_tree(tmp_path / "b")).hugetlb_mount_target() is None
    assert manager(_v2_tree(tmp_path / "c")).hugetlb_mount_target() is None


# --- block I/O -----------------------------------------------------------------------


def test_io_weight_file_of_each_layout(m: CgroupManager, tmp_path: Path) -> None:
    d = tmp_path / "node"
    name = {"v1": "blkio.bfq.weight", "v2": "io.bfq.weight"}[m.version]
    with pytest.raises(HpvcError, match="modprobe bfq"):
        m.set_io_weight(d, 500)
    _write(d / name, "default 100\n")
    assert m.set_io_weight(d, 500) == f"{name} = 500"
    assert (d / name).read_text() == "500"


def test_a_throttle_is_written_once_and_read_back(m: CgroupManager, tmp_path: Path) -> None:
    d = tmp_path / "node"
    d.mkdir()
    said = m.check_throttle(d, "8:0", "read_bps", 100)
    assert said.endswith("(crun had not set it)")
    assert m.check_throttle(d, "8:0", "read_bps", 100) == ""  # held now: not written again
    assert m.bps_limits(d) == {"8:0": {"read": 100, "write": None}}


def test_bps_limits_set_and_lifted(m: CgroupManager, tmp_path: Path) -> None:
    d = tmp_path / "server"
    d.mkdir()
    m.set_bps(d, "254:0", "write", 5_000_000)
    assert m.bps_limits(d) == {"254:0": {"read": None, "write": 5_000_000}}
    m.set_bps(d, "254:0", "write", None)
    assert m.bps_limits(d) == {"254:0": {"read": None, "write": None}}


def test_io_bytes_of_each_layout(m: CgroupManager, tmp_path: Path) -> None:
    d = tmp_path / "server"
    name, text = {
        "v1": ("blkio.throttle.io_service_bytes", "8:0 Read 10\n8:0 Write 20\nTotal 30\n"),
        "v2": ("io.stat", "8:0 rbytes=10 wbytes=20 rios=1 wios=2\n"),
    }[m.version]
    _write(d / name, text)
    assert m.io_bytes(d) == {"8:0": {"read": 10, "write": 20}}


# --- reading back --------------------------------------------------------------------


def test_cpu_seconds_of_each_layout(m: CgroupManager) -> None:
    controller, name, text = {
        "v1": ("cpuacct", "cpuacct.usage", "2500000000\n"),
        "v2": ("cpu", "cpu.stat", "usage_usec 2500000\nuser_usec 1\n"),
    }[m.version]
    d = m.dir(controller, NODE)
    assert d is not None and m.cpu_seconds(NODE) is None
    _write(d / name, text)
    assert m.cpu_seconds(NODE) == 2.5


def test_hugetlb_pages_of_each_layout(m: CgroupManager) -> None:
    text = {  # v1's total line leaves out the children; its hierarchical one counts them
        "v1": "total=0 N0=0 N1=0\nhierarchical_total=6291456 N0=4194304 N1=2097152\n",
        "v2": "total=6291456 N0=4194304 N1=2097152\n",
    }[m.version]
    d = m.dir("hugetlb", "/hpvc/c")
    assert d is not None
    _write(d / "hugetlb.2MB.numa_stat", text)
    assert m.hugetlb_numa("/hpvc/c", 2048) == {0: 4194304, 1: 2097152}
    assert m.hugetlb_numa("/hpvc/gone", 2048) == {}
    root = m.root
    assert hugepages.cgroup_pages(["/hpvc/c", "/hpvc/gone"], 2048, root) == {0: 2, 1: 1}
    _write(d / "hugetlb.2MB.numa_stat", "garbage\n")
    assert hugepages.cgroup_pages(["/hpvc/c"], 2048, root) is None


def test_tasks_below_a_cgroup(m: CgroupManager) -> None:
    d = m.dir("pids", NODE)
    assert d is not None and m.tasks(NODE) == []
    _write(d / "cgroup.procs", "7\n")
    _write(d / "inner/cgroup.procs", "9\n8\n")
    assert m.tasks(NODE) == [7, 8, 9]


def test_limits_say_which_layout_and_have_the_same_keys(tmp_path: Path) -> None:
    got = {}
    for version, tree in TREES.items():
        m = manager(tree(tmp_path / version))
        d = m.dir("memory", NODE)
        assert d is not None
        d.mkdir(parents=True)
        got[version] = m.limits(NODE, "/hpvc/c")
        assert got[version]["cgroup"] == version and got[version]["path"] == NODE
    assert set(got["v1"]) == set(got["v2"])


def test_procs_files_a_joining_process_writes(tmp_path: Path) -> None:
    root = _v1_tree(tmp_path)
    _write(
        root / "proc/42/cgroup", "3:memory:/hpvc/c/n\n2:freezer:/slurm\n1:name=systemd:/s\n0::/x\n"
    )
    for rel in ("memory/hpvc/c/n", "freezer/slurm", "systemd/s", "unified/x"):
        _write(root / CG / rel / "cgroup.procs", "")
    m = manager(root)
    assert m.procs_files(42) == tuple(
        f"/{CG}/{rel}/cgroup.procs"
        for rel in ("memory/hpvc/c/n", "freezer/slurm", "systemd/s", "unified/x")
    )
    assert m.procs_files(42, {"memory", "cpu"}) == (
        f"/{CG}/memory/hpvc/c/n/cgroup.procs",
        f"/{CG}/unified/x/cgroup.procs",
    )
    assert m.procs_files(43) == ()
    v2 = _v2_tree(tmp_path / "v2")
    _write(v2 / "proc/42/cgroup", "0::/hpvc/c/n\n")
    _write(v2 / CG / "hpvc/c/n/cgroup.procs", "")
    assert manager(v2).procs_files(42, {"memory"}) == (f"/{CG}/hpvc/c/n/cgroup.procs",)


# --- what hpvc doctor says -----------------------------------------------------------


def test_describe_and_problems(tmp_path: Path) -> None:
    v1 = manager(_v1_tree(tmp_path / "a", hugetlb=False))
    assert v1.describe().startswith("hybrid: v1 blkio,cpu,")
    assert f"cgroup2 at /{CG}/unified with hugetlb" in v1.describe()
    problems, fixes = v1.problems()
    assert problems == ["crun refuses hybrid mode while cgroup2 holds controllers"]
    assert fixes == [f"mkdir -p /{CG}/hugetlb && mount -t cgroup -o hugetlb cgroup /{CG}/hugetlb"]
    v2 = manager(_v2_tree(tmp_path / "b"))
    assert v2.describe() == f"v2: cgroup2 at /{CG} with cpuset,cpu,io,memory,pids,hugetlb"
    assert v2.problems() == ([], [])
    (tmp_path / "b" / CG / "cgroup.controllers").write_text("cpu memory")
    assert manager(tmp_path / "b").problems()[0] == ["cgroup2 lacks cpuset,io,pids,hugetlb"]


# --- journals written by an older hpvc -----------------------------------------------


def test_undo_kinds_live_where_older_journals_name_them() -> None:
    where = {k: journal._UNDO[k].__module__ for k in ("cgroup", "cgroup-v1-mount")}
    assert where == {"cgroup": "hpvc.host.cgroups", "cgroup-v1-mount": "hpvc.host.cgroups"}
    assert journal._UNDO["blk-scheduler"].__module__ == "hpvc.host.blkio"
    assert journal._UNDO["io-server-cgroup"].__module__ == "hpvc.host.io_coord"


def _older(path: Path, *lines: dict[str, object]) -> Journal:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    return Journal(path)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_an_older_journal_of_cluster_cgroups_is_undone(
    tmp_path: Path, kernel: FakeKernel, version: str
) -> None:
    root = TREES[version](tmp_path)
    m = manager(root)
    m.make_cluster("hpvc", "c", "0", "0", False)
    server = root / (m.io_mount() or "").lstrip("/") / "hpvc/c/nfs-server"
    server.mkdir()
    args = {"root": str(root), "path": "/hpvc/c", "hierarchies": m.hierarchies()}
    old = _older(
        tmp_path / "state/j",
        {"kind": "cgroup", "module": "hpvc.host.cgroups", "args": args},
        {
            "kind": "io-server-cgroup",
            "module": "hpvc.host.io_coord",
            "args": {
                "root": str(root),
                "path": "/hpvc/c/nfs-server",
                "hierarchy": m.io_mount(),
                "export": str(tmp_path),
                "stable_writes": False,
                "made_parents": [],
            },
        },
    )
    assert old.undo_all() == []
    assert not server.exists()
    assert not any((root / t.lstrip("/") / "hpvc").exists() for t in m.hierarchies())


def test_an_older_journal_of_the_hugetlb_mount_is_undone(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path, hugetlb=False)
    target = f"/{CG}/hugetlb"
    kernel.run(["mount", "-t", "cgroup", "-o", "hugetlb", "cgroup", str(root / CG / "hugetlb")])
    args = {"root": str(root), "target": target, "controller": "hugetlb", "created_dir": False}
    old = _older(
        tmp_path / "state/h",
        {"kind": "cgroup-v1-mount", "module": "hpvc.host.cgroups", "args": args},
    )
    assert old.undo_all() == []
    assert kernel.argv[-1] == ["umount", str(root / CG / "hugetlb")]


# --- the rule ------------------------------------------------------------------------

BRANCH = re.compile(
    r"\.v2_path\b|layout\.(v1|v2|mode)\b|version\s*[!=]=\s*\"v[12]\"|cgroup_layout\("
)
CHOOSERS = ("host/cgroupfs/", "host/probe.py")  # the managers, and the layout's reader


def test_no_cgroup_version_branch_outside_the_managers() -> None:
    found = [
        f"{p.relative_to(SRC)}:{n}: {line.strip()}"
        for p in sorted(SRC.rglob("*.py"))
        if not str(p.relative_to(SRC)).startswith(CHOOSERS)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if BRANCH.search(line)
    ]
    assert found == [], "ask the cgroup manager (hpvc.host.cgroupfs) instead:\n" + "\n".join(found)


def test_the_rule_fires() -> None:
    assert BRANCH.search("    if layout.v2_path is not None:")
    assert BRANCH.search('    if cg.version == "v1":')
    assert not BRANCH.search("    m = find_manager(root)")

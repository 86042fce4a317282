"""cgroups on fake cgroupfs trees (v1 hybrid as on these hosts, and v2): create, undo, read back."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpvc.errors import HpvcError, InputError
from hpvc.host import blkio, cgroups
from hpvc.host.blkio import device_name, ensure_bfq, parse_device_map, parse_io_max
from hpvc.host.cgroups import (
    apply_node_extras,
    cluster_cgroup_exists,
    ensure_cluster_cgroup,
    ensure_hugetlb_v1,
    node_tasks,
    read_node_limits,
)
from hpvc.host.journal import Journal
from hpvc.plan.model import IOPlan

CG = "sys/fs/cgroup"
V1 = ("cpuset", "cpu", "cpuacct", "memory", "devices", "freezer", "blkio", "pids")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v1_tree(root: Path, hugetlb: bool = True) -> Path:
    """The hybrid layout of these hosts: v1 controllers, name=systemd, cgroup2 at unified."""
    names = [*V1, "hugetlb"] if hugetlb else list(V1)
    lines = ["tmpfs /sys/fs/cgroup tmpfs rw 0 0"]
    lines += [f"cgroup /{CG}/{c} cgroup rw,relatime,{c} 0 0" for c in names]
    lines += [
        f"cgroup /{CG}/systemd cgroup rw,relatime,name=systemd 0 0",
        f"cgroup2 /{CG}/unified cgroup2 rw,relatime 0 0",
    ]
    _write(root / "proc/mounts", "\n".join(lines) + "\n")
    for c in [*names, "systemd", "unified"]:
        (root / CG / c).mkdir(parents=True, exist_ok=True)
    _write(root / CG / "unified/cgroup.controllers", "" if hugetlb else "hugetlb")
    cs = root / CG / "cpuset"
    _write(cs / "cpuset.cpus", "0-3")
    _write(cs / "cpuset.mems", "0-1")
    _write(cs / "cpuset.cpu_exclusive", "1")
    return root


def _v2_tree(root: Path, delegated: str = "cpuset cpu io memory pids hugetlb") -> Path:
    _write(root / "proc/mounts", f"cgroup2 /{CG} cgroup2 rw,nsdelegate 0 0\n")
    _write(root / CG / "cgroup.controllers", "cpuset cpu io memory pids hugetlb")
    _write(root / CG / "cgroup.subtree_control", delegated)
    return root


class FakeKernel:
    """rmdir and commands as the kernel would answer them, with a log of calls."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rmdirs: list[str] = []
        self.argv: list[list[str]] = []

    def rmdir(self, d: Path) -> None:
        if any(p.is_dir() for p in d.iterdir()):
            raise OSError(errno.EBUSY, "Device or resource busy")
        procs = d / "cgroup.procs"
        if procs.exists() and procs.read_text().split():
            raise OSError(errno.EBUSY, "Device or resource busy")
        for f in d.iterdir():
            f.unlink()
        os.rmdir(d)
        self.rmdirs.append(str(d.relative_to(self.root)))

    def run(self, argv: Sequence[str]) -> None:
        self.argv.append(list(argv))
        mounts = self.root / "proc/mounts"
        if argv[0] == "mount":
            target = "/" + str(Path(argv[-1]).relative_to(self.root))
            opts = argv[argv.index("-o") + 1]
            mounts.write_text(mounts.read_text() + f"cgroup {target} cgroup rw,{opts} 0 0\n")
        elif argv[0] == "umount":
            target = "/" + str(Path(argv[-1]).relative_to(self.root))
            keep = [ln for ln in mounts.read_text().splitlines() if ln.split()[1] != target]
            mounts.write_text("\n".join(keep) + "\n")
        elif argv[0] == "modprobe":
            for sched in self.root.glob("sys/block/*/queue/scheduler"):
                sched.write_text(sched.read_text().strip() + " bfq\n")


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    k = FakeKernel(tmp_path)
    monkeypatch.setattr(cgroups, "_rmdir", k.rmdir)
    monkeypatch.setattr(cgroups, "_runner", k.run)
    monkeypatch.setattr(blkio, "_runner", k.run)  # modprobe bfq
    return k


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state" / "journal")


def _crun_node(root: Path, cluster: str, node: str, hierarchies: Sequence[str]) -> None:
    """What crun leaves: the node's cgroup in every hierarchy, systemd and unified included."""
    for h in hierarchies:
        (root / CG / h / "hpvc" / cluster / node).mkdir(parents=True, exist_ok=True)


# --- ensure_cluster_cgroup / undo, v1 ------------------------------------------------


def test_v1_creates_both_levels_in_every_crun_hierarchy(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    cg = ensure_cluster_cgroup(journal, "c1", cpus="2-3", mems=[1], exclusive=False, root=root)
    assert (cg.path, cg.version, cg.exclusive, cg.notes) == ("/hpvc/c1", "v1", False, ())
    for c in (*V1, "hugetlb"):
        assert (root / CG / c / "hpvc/c1").is_dir(), c
    assert not (root / CG / "systemd/hpvc").exists()  # crun makes those itself
    cs = root / CG / "cpuset/hpvc"
    assert (cs / "cpuset.cpus").read_text() == "0-3"  # the root's, copied
    assert (cs / "cpuset.mems").read_text() == "0-1"
    assert (cs / "c1/cpuset.cpus").read_text() == "2-3"
    assert (cs / "c1/cpuset.mems").read_text() == "1"
    assert not (cs / "c1/cpuset.cpu_exclusive").exists()
    (entry,) = journal.entries()
    assert entry.kind == "cgroup"
    assert entry.args["path"] == "/hpvc/c1"
    assert entry.args["root"] == str(root)
    assert len(entry.args["hierarchies"]) == 9


def test_v1_exclusive_is_refused_under_a_shared_parent(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    cg = ensure_cluster_cgroup(journal, "hpc", cpus="0-1", mems="0", exclusive=True, root=root)
    assert cg.exclusive is False
    assert "only under an exclusive parent" in cg.notes[0]
    assert not (root / CG / "cpuset/hpvc/hpc/cpuset.cpu_exclusive").exists()


def test_v1_exclusive_under_an_exclusive_parent(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    top = root / CG / "cpuset/hpvc"
    _write(top / "cpuset.cpu_exclusive", "1")  # an administrator's choice
    _write(top / "cpuset.cpus", "0-2")
    cg = ensure_cluster_cgroup(journal, "hpc", cpus="0-1", mems="0", exclusive=True, root=root)
    assert (cg.exclusive, cg.notes) == (True, ())
    assert (top / "hpc/cpuset.cpu_exclusive").read_text() == "1"
    assert (top / "cpuset.cpus").read_text() == "0-2"  # an exclusive parent is left alone


def test_v1_without_hugetlb_says_crun_will_refuse(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path, hugetlb=False)
    cg = ensure_cluster_cgroup(journal, "c", cpus="0", mems="0", exclusive=False, root=root)
    assert "lacks hugetlb" in cg.notes[0] and "ensure_hugetlb_v1" in cg.notes[0]


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "-x", "x" * 65])
def test_bad_cluster_names_are_input_errors(tmp_path: Path, journal: Journal, name: str) -> None:
    with pytest.raises(InputError):
        ensure_cluster_cgroup(journal, name, cpus="0", mems="0", exclusive=False, root=tmp_path)
    assert journal.entries() == []


def test_undo_removes_leaf_first_everywhere_crun_left_cgroups(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    ensure_cluster_cgroup(journal, "c1", cpus="0", mems="0", exclusive=False, root=root)
    _crun_node(root, "c1", "n0", ["cpuset", "memory", "systemd", "unified"])
    assert cluster_cgroup_exists("c1", root)
    assert journal.undo_all() == []
    assert not cluster_cgroup_exists("c1", root)
    for h in (*V1, "hugetlb", "systemd", "unified"):
        assert not (root / CG / h / "hpvc").exists(), h
    order = kernel.rmdirs
    for h in ("cpuset", "systemd", "unified"):
        node, cl, top = (f"{CG}/{h}/hpvc{s}" for s in ("/c1/n0", "/c1", ""))
        assert order.index(node) < order.index(cl) < order.index(top)
    assert journal.entries() == []


def test_undo_keeps_the_parent_while_another_cluster_is_in_it(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    a, b = Journal(tmp_path / "a"), Journal(tmp_path / "b")
    ensure_cluster_cgroup(a, "a", cpus="0", mems="0", exclusive=False, root=root)
    ensure_cluster_cgroup(b, "b", cpus="1", mems="0", exclusive=False, root=root)
    assert a.undo_all() == []
    assert not cluster_cgroup_exists("a", root)
    assert (root / CG / "cpuset/hpvc/b").is_dir()
    assert b.undo_all() == []
    assert not (root / CG / "cpuset/hpvc").exists()


def test_undo_never_kills_and_lists_the_pids_left(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    ensure_cluster_cgroup(journal, "c1", cpus="0", mems="0", exclusive=False, root=root)
    _crun_node(root, "c1", "n0", ["pids", "memory"])
    procs = root / CG / "pids/hpvc/c1/n0/cgroup.procs"
    procs.write_text("4242\n4243\n")
    errors = journal.undo_all()
    assert len(errors) == 1 and "4242 4243" in errors[0] and "stop those" in errors[0]
    assert (root / CG / "pids/hpvc/c1/n0").is_dir()
    assert not (root / CG / "memory/hpvc").exists()  # what could go, went
    assert [e.kind for e in journal.entries()] == ["cgroup"]  # kept for a retry
    procs.write_text("")
    assert journal.undo_all() == []
    assert not cluster_cgroup_exists("c1", root)


def test_undo_after_a_crash_before_mkdir_is_a_no_op(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    journal.record("cgroup", root=str(root), path="/hpvc/gone", hierarchies=[f"/{CG}/cpuset"])
    assert journal.undo_all() == []
    assert kernel.rmdirs == []


@pytest.mark.parametrize("path", ["/", "/hpvc", "/other/c", "/hpvc/../x"])
def test_undo_touches_nothing_outside_hpvc(
    tmp_path: Path, journal: Journal, kernel: FakeKernel, path: str
) -> None:
    root = _v1_tree(tmp_path)
    (root / CG / "cpuset/other/c").mkdir(parents=True)
    journal.record("cgroup", root=str(root), path=path, hierarchies=[f"/{CG}/cpuset"])
    assert "not a path below /hpvc" in journal.undo_all()[0]
    assert kernel.rmdirs == []


# --- hugetlb on v1 -------------------------------------------------------------------


def test_hugetlb_is_bound_to_v1_on_a_hybrid_host(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path, hugetlb=False)
    assert ensure_hugetlb_v1(journal, root) is True
    target = root / CG / "hugetlb"
    assert kernel.argv == [["mount", "-t", "cgroup", "-o", "hugetlb", "cgroup", str(target)]]
    (entry,) = journal.entries()
    assert entry.kind == "cgroup-v1-mount"
    assert entry.args["target"] == f"/{CG}/hugetlb" and entry.args["created_dir"] is True
    assert ensure_hugetlb_v1(journal, root) is False  # now mounted: nothing more
    assert journal.undo_all() == []
    assert kernel.argv[-1] == ["umount", str(target)]
    assert not target.exists()


def test_hugetlb_mount_stays_while_any_hpvc_cgroup_exists(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path, hugetlb=False)
    host, cluster = Journal(tmp_path / "host"), Journal(tmp_path / "cluster")
    ensure_hugetlb_v1(host, root)
    ensure_cluster_cgroup(cluster, "c", cpus="0", mems="0", exclusive=False, root=root)
    assert host.undo_all() == []  # a no-op: the cluster still relies on it
    assert not any(a[0] == "umount" for a in kernel.argv)
    assert (root / CG / "hugetlb/hpvc/c").is_dir()
    assert cluster.undo_all() == []


def test_hugetlb_mount_not_needed_on_v2_or_when_present(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    assert ensure_hugetlb_v1(journal, _v1_tree(tmp_path / "a")) is False
    assert ensure_hugetlb_v1(journal, _v2_tree(tmp_path / "b")) is False
    assert journal.entries() == [] and kernel.argv == []


def test_fake_root_never_runs_host_commands(tmp_path: Path, journal: Journal) -> None:
    with pytest.raises(RuntimeError, match="fake root"):
        ensure_hugetlb_v1(journal, _v1_tree(tmp_path, hugetlb=False))


# --- v2 ------------------------------------------------------------------------------


def test_v2_enables_delegated_controllers_and_sets_the_cpuset(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v2_tree(tmp_path, delegated="cpuset cpu io memory pids")
    cg = ensure_cluster_cgroup(journal, "c", cpus=[0, 1, 2], mems="0", exclusive=True, root=root)
    top = root / CG / "hpvc"
    assert cg.version == "v2" and cg.dirs == (top / "c",)
    assert (top / "cgroup.subtree_control").read_text() == "+cpuset +cpu +memory +io +pids"
    assert (top / "c/cgroup.subtree_control").read_text() == "+cpuset +cpu +memory +io +pids"
    assert (top / "c/cpuset.cpus").read_text() == "0-2"
    assert "does not delegate hugetlb" in cg.notes[0]
    assert cg.exclusive is False and "exclusive" in cg.notes[1]
    assert journal.undo_all() == []
    assert not top.exists()


def test_v2_partition_root_under_a_partition_root(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v2_tree(tmp_path)
    _write(root / CG / "hpvc/cpuset.cpus.partition", "root")
    cg = ensure_cluster_cgroup(journal, "c", cpus="1", mems="0", exclusive=True, root=root)
    assert cg.exclusive is True and cg.notes == ()
    assert (root / CG / "hpvc/c/cpuset.cpus.partition").read_text() == "root"


def _v2_node(root: Path) -> Path:
    cl = root / CG / "hpvc/c"
    _write(cl / "cpuset.cpus.effective", "0-3\n")
    _write(cl / "cpuset.mems.effective", "0\n")
    _write(cl / "cpuset.cpus.partition", "member\n")
    d = cl / "n0"
    files = {
        "cpuset.cpus.effective": "1\n",
        "cpuset.mems.effective": "0\n",
        "memory.max": "max\n",
        "memory.current": "1048576\n",
        "cpu.weight": "100\n",
        "cpu.max": "50000 100000\n",
        "io.max": "8:0 rbps=1048576 wbps=max riops=max wiops=200\n253:0 rbps=5 wbps=max "
        "riops=max wiops=max\n",
        "io.bfq.weight": "default 300\n8:0 500\n",
        "pids.max": "100\n",
        "pids.current": "3\n",
        "hugetlb.2MB.max": "16777216\n",
        "hugetlb.2MB.current": "4194304\n",
        "hugetlb.2MB.rsvd.max": "max\n",
        "hugetlb.1GB.max": "max\n",
        "hugetlb.1GB.current": "0\n",
        "cgroup.procs": "7\n",
    }
    for name, text in files.items():
        _write(d / name, text)
    _write(d / "inner/cgroup.procs", "9\n8\n")
    return d


def test_v2_read_back(tmp_path: Path) -> None:
    root = _v2_tree(tmp_path)
    _v2_node(root)
    got = read_node_limits("c", "n0", root)
    assert got == {
        "cgroup": "v2",
        "path": "/hpvc/c/n0",
        "cpus": "1",
        "mems": "0",
        "cluster_cpus": "0-3",
        "cluster_mems": "0",
        "cpu_exclusive": False,
        "memory_limit": None,
        "memory_usage": 1048576,
        "cpu_shares": None,
        "cpu_weight": 100,
        "cpu_quota_us": 50000,
        "cpu_period_us": 100000,
        "io": {
            "read_bps": {"8:0": 1048576, "253:0": 5},
            "write_bps": {},
            "read_iops": {},
            "write_iops": {"8:0": 200},
        },
        "io_weight": 300,
        "pids_max": 100,
        "pids_current": 3,
        "hugetlb": {
            "1048576kB": {"limit": None, "usage": 0},
            "2048kB": {"limit": 16777216, "usage": 4194304},
        },
    }
    assert node_tasks("c", "n0", root) == [7, 8, 9]


def test_v2_apply_io_max_only_where_crun_did_not(tmp_path: Path) -> None:
    root = _v2_tree(tmp_path)
    d = _v2_node(root)
    done = apply_node_extras(
        "c", "n0", io=IOPlan(read_bps=1048576, write_bps=2048), device=(8, 0), root=root
    )
    assert done == ["io.max = 8:0 wbps=2048 (crun had not set it)"]
    assert (d / "io.max").read_text() == "8:0 wbps=2048"  # what a write says; the kernel merges


# --- read-back and node extras, v1 ---------------------------------------------------


def _v1_node(root: Path) -> None:
    _crun_node(root, "c", "n0", [*V1, "hugetlb"])
    base = root / CG
    files = {
        "cpuset/hpvc/c/cpuset.cpus": "0-1\n",
        "cpuset/hpvc/c/cpuset.mems": "0\n",
        "cpuset/hpvc/c/cpuset.cpu_exclusive": "0\n",
        "cpuset/hpvc/c/n0/cpuset.cpus": "1\n",
        "cpuset/hpvc/c/n0/cpuset.mems": "0\n",
        "memory/hpvc/c/n0/memory.limit_in_bytes": "268435456\n",
        "memory/hpvc/c/n0/memory.usage_in_bytes": "4096\n",
        "cpu/hpvc/c/n0/cpu.shares": "512\n",
        "cpu/hpvc/c/n0/cpu.cfs_quota_us": "-1\n",
        "cpu/hpvc/c/n0/cpu.cfs_period_us": "100000\n",
        "blkio/hpvc/c/n0/blkio.throttle.read_bps_device": "7:0 10485760\n",
        "blkio/hpvc/c/n0/blkio.throttle.write_bps_device": "",
        "blkio/hpvc/c/n0/blkio.throttle.read_iops_device": "",
        "blkio/hpvc/c/n0/blkio.throttle.write_iops_device": "",
        "blkio/hpvc/c/n0/blkio.bfq.weight": "100\n",
        "pids/hpvc/c/n0/pids.max": "max\n",
        "pids/hpvc/c/n0/pids.current": "2\n",
        "pids/hpvc/c/n0/cgroup.procs": "11\n12\n",
        "hugetlb/hpvc/c/n0/hugetlb.2MB.limit_in_bytes": "9223372036854771712\n",
        "hugetlb/hpvc/c/n0/hugetlb.2MB.usage_in_bytes": "0\n",
    }
    for name, text in files.items():
        _write(base / name, text)
    _write(root / "sys/block/loop0/queue/scheduler", "[none] mq-deadline kyber bfq\n")
    (root / "sys/dev/block").mkdir(parents=True)
    (root / "sys/dev/block/7:0").symlink_to("../../block/loop0")


def test_v1_read_back(tmp_path: Path) -> None:
    root = _v1_tree(tmp_path)
    _v1_node(root)
    got = read_node_limits("c", "n0", root)
    assert got["cgroup"] == "v1" and got["path"] == "/hpvc/c/n0"
    assert (got["cpus"], got["mems"], got["cluster_cpus"], got["cpu_exclusive"]) == (
        "1",
        "0",
        "0-1",
        False,
    )
    assert (got["memory_limit"], got["memory_usage"]) == (268435456, 4096)
    assert (got["cpu_shares"], got["cpu_quota_us"], got["cpu_period_us"]) == (512, None, 100000)
    assert got["io"]["read_bps"] == {"7:0": 10485760} and got["io"]["write_iops"] == {}
    assert (got["io_weight"], got["pids_max"], got["pids_current"]) == (100, None, 2)
    assert got["hugetlb"] == {"2048kB": {"limit": None, "usage": 0}}
    assert node_tasks("c", "n0", root) == [11, 12]


def test_read_back_of_a_node_that_is_not_running(tmp_path: Path) -> None:
    root = _v1_tree(tmp_path)
    with pytest.raises(HpvcError, match="is the node running"):
        read_node_limits("c", "n9", root)
    assert node_tasks("c", "n9", root) == []


def test_v1_weight_needs_bfq_on_the_device(tmp_path: Path) -> None:
    root = _v1_tree(tmp_path)
    _v1_node(root)
    with pytest.raises(HpvcError, match="uses the none scheduler; weights need bfq") as e:
        apply_node_extras("c", "n0", io=IOPlan(weight=500), device=(7, 0), root=root)
    assert "echo bfq > /sys/block/loop0/queue/scheduler" in e.value.fix


def test_v1_extras_set_weight_and_missing_throttles(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    _v1_node(root)
    assert ensure_bfq(journal, "loop0", root) == ["loop0: I/O scheduler none -> bfq"]
    sched = root / "sys/block/loop0/queue/scheduler"
    sched.write_text("none mq-deadline kyber [bfq]\n")  # what the kernel then shows
    io = IOPlan(read_bps=10485760, write_bps=5242880, weight=900)
    done = apply_node_extras("c", "n0", io=io, device=(7, 0), root=root)
    d = root / CG / "blkio/hpvc/c/n0"
    assert done == [
        "blkio.bfq.weight = 900",
        "blkio.throttle.write_bps_device = 7:0 5242880 (crun had not set it)",
    ]
    assert (d / "blkio.bfq.weight").read_text() == "900"
    assert (d / "blkio.throttle.read_bps_device").read_text() == "7:0 10485760\n"  # untouched
    assert journal.undo_all() == []
    assert sched.read_text() == "none"


def test_extras_without_a_device_or_io(tmp_path: Path) -> None:
    root = _v1_tree(tmp_path)
    _v1_node(root)
    assert apply_node_extras("c", "n0", io=None, device=None, root=root) == []
    done = apply_node_extras("c", "n0", io=IOPlan(read_iops=10), device=None, root=root)
    assert done == ["block I/O throttles not checked: no block device given"]


# --- bfq -----------------------------------------------------------------------------


def test_ensure_bfq_records_only_a_real_switch(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    sched = tmp_path / "sys/block/vda/queue/scheduler"
    _write(sched, "none [mq-deadline] kyber bfq\n")
    ensure_bfq(journal, "vda", tmp_path)
    (entry,) = journal.entries()
    assert (entry.kind, entry.args["previous"], entry.args["device"]) == (
        "blk-scheduler",
        "mq-deadline",
        "vda",
    )
    sched.write_text("none mq-deadline kyber [bfq]\n")
    assert ensure_bfq(journal, "vda", tmp_path) == []
    assert len(journal.entries()) == 1
    assert journal.undo_all() == []
    assert sched.read_text() == "mq-deadline"


def test_ensure_bfq_loads_the_module_only_when_not_offered(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    _write(tmp_path / "sys/block/vda/queue/scheduler", "[none] mq-deadline")
    notes = ensure_bfq(journal, "vda", tmp_path)
    assert kernel.argv == [["modprobe", "bfq"]]
    assert "modprobe bfq" in notes[0] and notes[1] == "vda: I/O scheduler none -> bfq"


def test_undo_of_bfq_leaves_a_scheduler_someone_else_chose(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    sched = tmp_path / "sys/block/vda/queue/scheduler"
    _write(sched, "[none] mq-deadline kyber bfq\n")
    ensure_bfq(journal, "vda", tmp_path)
    sched.write_text("none mq-deadline [kyber] bfq\n")
    assert journal.undo_all() == []
    assert sched.read_text() == "none mq-deadline [kyber] bfq\n"


def test_ensure_bfq_on_a_missing_device(tmp_path: Path, journal: Journal) -> None:
    with pytest.raises(HpvcError, match="block device sdz"):
        ensure_bfq(journal, "sdz", tmp_path)


def test_device_name_of_a_partition_is_its_disk(tmp_path: Path) -> None:
    (tmp_path / "sys/block/vda/vda1").mkdir(parents=True)
    _write(tmp_path / "sys/block/vda/vda1/partition", "1\n")
    (tmp_path / "sys/dev/block").mkdir(parents=True)
    (tmp_path / "sys/dev/block/254:1").symlink_to("../../block/vda/vda1")
    (tmp_path / "sys/dev/block/254:0").symlink_to("../../block/vda")
    assert device_name((254, 1), tmp_path) == "vda"
    assert device_name((254, 0), tmp_path) == "vda"
    with pytest.raises(HpvcError):
        device_name((8, 0), tmp_path)


def test_parsers() -> None:
    assert parse_device_map("8:0 100\n7:1 5\nbad\n") == {"8:0": 100, "7:1": 5}
    assert parse_io_max("8:0 rbps=1 wbps=max riops=max wiops=max\n") == {
        "8:0": {"rbps": 1, "wbps": None, "riops": None, "wiops": None}
    }
    assert parse_io_max("") == {}


# --- the cluster's caps on normal and hugepage memory (issue 25 item 4) -----------------


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_limit_cluster_caps_memory_and_every_hugepage_size(
    tmp_path: Path, journal: Journal, kernel: FakeKernel, version: str
) -> None:
    """The parent of a cluster's nodes holds them to their normal memory and their
    hugepages together, and to no page of a size the plan does not give them."""
    if version == "v1":
        root = _v1_tree(tmp_path)
        mem_dir, huge_dir = root / CG / "memory/hpvc/c1", root / CG / "hugetlb/hpvc/c1"
        mem_file, end = "memory.limit_in_bytes", "limit_in_bytes"
    else:
        root = _v2_tree(tmp_path)
        mem_dir = huge_dir = root / CG / "hpvc/c1"
        mem_file, end = "memory.max", "max"
    ensure_cluster_cgroup(journal, "c1", cpus="0-1", mems="0", exclusive=False, root=root)
    unlimited = "9223372036854771712" if version == "v1" else "max"
    files = [
        mem_dir / mem_file,
        *(huge_dir / f"hugetlb.{s}.{k}{end}" for s in ("2MB", "1GB") for k in ("", "rsvd.")),
    ]
    for f in files:  # what the kernel makes with the cgroup
        _write(f, unlimited)
    done = cgroups.limit_cluster("c1", 384, {2048: 128}, root=root)
    assert (mem_dir / mem_file).read_text() == str(384 << 20)
    assert (huge_dir / f"hugetlb.2MB.{end}").read_text() == str(128 << 20)
    assert (huge_dir / f"hugetlb.2MB.rsvd.{end}").read_text() == str(128 << 20)
    assert (huge_dir / f"hugetlb.1GB.{end}").read_text() == "0"
    assert (huge_dir / f"hugetlb.1GB.rsvd.{end}").read_text() == "0"
    assert len(done) == 5
    # No hugepage memory at all: every size capped at 0.
    cgroups.limit_cluster("c1", 512, {}, root=root)
    assert {f.read_text() for f in files[1:]} == {"0"}
    assert journal.undo_all() == []


def test_limit_cluster_without_the_controllers_is_an_error(
    tmp_path: Path, journal: Journal, kernel: FakeKernel
) -> None:
    root = _v1_tree(tmp_path)
    ensure_cluster_cgroup(journal, "c1", cpus="0-1", mems="0", exclusive=False, root=root)
    with pytest.raises(HpvcError, match="no memory controller"):
        cgroups.limit_cluster("c1", 384, {}, root=root)
    _write(root / CG / "memory/hpvc/c1/memory.limit_in_bytes", "0")
    with pytest.raises(HpvcError, match="no hugetlb controller"):
        cgroups.limit_cluster("c1", 384, {}, root=root)
    assert journal.undo_all() == []


def test_v1_mount_lock_makes_a_second_holder_wait(tmp_path: Path) -> None:
    """Binding hugetlb plus a cluster's mkdirs, and the binding's undo, run
    one at a time: a second holder (another job's teardown) waits for the
    first to let go."""
    (tmp_path / "run").mkdir()
    order: list[str] = []

    def second() -> None:
        with cgroups.v1_mount_lock(tmp_path):
            order.append("second")

    with cgroups.v1_mount_lock(tmp_path):
        t = threading.Thread(target=second)
        t.start()
        t.join(0.3)
        order.append("first done")
    t.join(5)
    assert order == ["first done", "second"]
    assert (tmp_path / cgroups.V1_MOUNT_LOCK.lstrip("/")).stat().st_mode & 0o777 == 0o600

"""Real cgroup v1, block-I/O, hugepage and hugetlbfs changes on this host, each undone.

Only ``/hpvc/t<pid>`` cgroups, a loop device, pages and mounts these tests add are
touched; every fixture undoes its part even when a test fails.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from hpvc.errors import HpvcError
from hpvc.host.blkio import ensure_bfq
from hpvc.host.cgroupfs.v1 import CONTROLLERS as CRUN_V1
from hpvc.host.cgroups import (
    apply_node_extras,
    cluster_cgroup_exists,
    ensure_cluster_cgroup,
    ensure_hugetlb_v1,
    node_tasks,
    read_node_limits,
)
from hpvc.host.hugepages import ensure_hugetlbfs, grow_pool, pool_dir, pool_state
from hpvc.host.journal import Journal
from hpvc.host.probe import cgroup_layout, read_mounts
from hpvc.plan.model import IOPlan
from tests.helpers import requires

pytestmark = pytest.mark.integration

CLUSTER = f"t{os.getpid()}"
SIZE = 2048
MakeJournal = Callable[[str], Journal]


def _v1() -> dict[str, str]:
    requires("root")
    layout = cgroup_layout()
    if not layout.v1:
        pytest.skip("this host has no cgroup v1 controllers (these tests drive v1, HOST-NOTES)")
    return dict(layout.v1)


def _targets() -> list[str]:
    return [m.target for m in read_mounts() if m.fstype in ("cgroup", "cgroup2")]


def _sweep() -> None:
    """Safety net after the undo: nothing of this test's cluster may stay."""
    for target in _targets():
        top = Path(target) / "hpvc" / CLUSTER
        if top.is_dir():
            for dirpath, _, _ in os.walk(top, topdown=False):
                with suppress(OSError):
                    os.rmdir(dirpath)


@pytest.fixture
def journals(tmp_path: Path) -> Iterator[MakeJournal]:
    made: list[Journal] = []

    def make(name: str) -> Journal:
        made.append(Journal(tmp_path / name))
        return made[-1]

    yield make
    errors = [e for j in reversed(made) for e in j.undo_all()]
    _sweep()
    assert errors == []


@pytest.fixture
def spawn(journals: MakeJournal) -> Iterator[Callable[[], int]]:
    """Start ``sleep`` processes; kill exactly those, by PID, before the journals undo."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        procs.append(subprocess.Popen(["sleep", "300"]))
        return procs[-1].pid

    yield start
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait()


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[tuple[str, tuple[int, int]]]:
    """A loop device of our own over a sparse file: (name, (major, minor))."""
    requires("root")
    backing = tmp_path / "disk.img"
    with backing.open("wb") as f:
        f.truncate(64 << 20)
    dev = subprocess.run(
        ["losetup", "-f", "--show", str(backing)], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        rdev = os.stat(dev).st_rdev
        yield Path(dev).name, (os.major(rdev), os.minor(rdev))
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def _crun_like_node(v1: dict[str, str], node: str) -> dict[str, Path]:
    """Make the node cgroup as crun does (cpuset first filled, so tasks may join)."""
    dirs: dict[str, Path] = {}
    for c in CRUN_V1:
        if c in v1:
            d = Path(v1[c]) / "hpvc" / CLUSTER / node
            d.mkdir(exist_ok=True)
            dirs[c] = d
    (dirs["cpuset"] / "cpuset.cpus").write_text("0")
    (dirs["cpuset"] / "cpuset.mems").write_text("0")
    return dirs


# --- cgroups -------------------------------------------------------------------------


def test_exclusive_cluster_cgroup_round_trip(journals: MakeJournal) -> None:
    v1 = _v1()
    j = journals("cluster")
    cg = ensure_cluster_cgroup(j, CLUSTER, cpus="0", mems="0", exclusive=True)
    cs = Path(v1["cpuset"]) / "hpvc" / CLUSTER
    assert (cs / "cpuset.cpus").read_text().strip() == "0"
    assert (cs / "cpuset.mems").read_text().strip() == "0"
    parent_exclusive = (cs.parent / "cpuset.cpu_exclusive").read_text().strip() == "1"
    assert cg.exclusive is parent_exclusive
    assert (cs / "cpuset.cpu_exclusive").read_text().strip() == ("1" if cg.exclusive else "0")
    if not cg.exclusive:
        assert any("only under an exclusive parent" in n for n in cg.notes)
    for c in CRUN_V1:
        if c in v1:
            assert (Path(v1[c]) / "hpvc" / CLUSTER).is_dir(), c
    assert cluster_cgroup_exists(CLUSTER)
    assert j.undo_all() == []
    assert not cluster_cgroup_exists(CLUSTER)


def test_tasks_block_the_undo_and_limits_read_back(
    journals: MakeJournal, spawn: Callable[[], int]
) -> None:
    v1 = _v1()
    j = journals("cluster")
    ensure_cluster_cgroup(j, CLUSTER, cpus="0", mems="0", exclusive=False)
    dirs = _crun_like_node(v1, "n0")
    (dirs["memory"] / "memory.limit_in_bytes").write_text(str(256 << 20))
    (dirs["cpu"] / "cpu.shares").write_text("512")
    (dirs["pids"] / "pids.max").write_text("64")
    pid = spawn()
    for d in dirs.values():
        (d / "cgroup.procs").write_text(str(pid))
    assert node_tasks(CLUSTER, "n0") == [pid]
    got = read_node_limits(CLUSTER, "n0")
    assert (got["cpus"], got["mems"], got["cluster_cpus"]) == ("0", "0", "0")
    assert (got["memory_limit"], got["cpu_shares"], got["cpu_quota_us"]) == (256 << 20, 512, None)
    assert (got["pids_max"], got["pids_current"]) == (64, 1)
    assert isinstance(got["memory_usage"], int)  # v1 charges stay where they were made
    errors = j.undo_all()
    assert len(errors) == 1 and str(pid) in errors[0]
    assert cluster_cgroup_exists(CLUSTER)  # nothing killed, nothing forced
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert j.undo_all() == []
    assert not cluster_cgroup_exists(CLUSTER)


def test_bfq_weight_and_throttles_on_a_loop_device(
    loop: tuple[str, tuple[int, int]], journals: MakeJournal
) -> None:
    v1 = _v1()
    name, dev = loop
    sched = Path(f"/sys/block/{name}/queue/scheduler")
    if "[bfq]" in sched.read_text():  # a loop device keeps its scheduler across reuse
        sched.write_text("none")
    before = sched.read_text()
    host, cluster = journals("host"), journals("cluster")
    assert ensure_bfq(host, name)[-1].endswith("-> bfq")
    assert "[bfq]" in sched.read_text()
    ensure_cluster_cgroup(cluster, CLUSTER, cpus="0", mems="0", exclusive=False)
    dirs = _crun_like_node(v1, "n0")
    key = f"{dev[0]}:{dev[1]}"
    (dirs["blkio"] / "blkio.throttle.read_bps_device").write_text(f"{key} {10 << 20}")  # crun's
    io = IOPlan(read_bps=10 << 20, write_bps=5 << 20, weight=300)
    done = apply_node_extras(CLUSTER, "n0", io=io, device=dev)
    assert done == [
        "blkio.bfq.weight = 300",
        f"blkio.throttle.write_bps_device = {key} {5 << 20} (crun had not set it)",
    ]
    got = read_node_limits(CLUSTER, "n0")
    assert got["io_weight"] == 300
    assert got["io"]["read_bps"] == {key: 10 << 20}
    assert got["io"]["write_bps"] == {key: 5 << 20}
    assert cluster.undo_all() == [] and host.undo_all() == []
    assert sched.read_text() == before


def test_hugetlb_bound_to_v1_for_crun(journals: MakeJournal) -> None:
    _v1()
    host = journals("host")
    mounted_here = ensure_hugetlb_v1(host)
    assert "hugetlb" in cgroup_layout().v1
    assert [e.kind for e in host.entries()] == (["cgroup-v1-mount"] if mounted_here else [])
    assert host.undo_all() == []


# --- hugepages -----------------------------------------------------------------------


def _nr() -> int:
    return int(Path("/proc/sys/vm/nr_hugepages").read_text())


def test_grow_the_2m_pool_and_give_it_back(journals: MakeJournal) -> None:
    requires("root")
    before, j = _nr(), journals("pool")
    total0, _ = pool_state(0, SIZE)
    grow_pool(j, 0, SIZE, 8)
    assert pool_state(0, SIZE)[0] == total0 + 8
    assert _nr() == before + 8
    assert j.undo_all() == []
    assert _nr() == before


def _persistent(size_kib: int) -> int:
    d = pool_dir(0, size_kib)
    return int((d / "nr_hugepages").read_text()) - int((d / "surplus_hugepages").read_text())


@pytest.mark.parametrize(("size", "count"), [(SIZE, 8), (1048576, 1)], ids=["2M", "1G"])
def test_hugetlbfs_pages_in_use_outlive_the_pool_undo(
    tmp_path: Path, journals: MakeJournal, size: int, count: int
) -> None:
    requires("root")
    before, total0 = _persistent(size), pool_state(0, size)[0]
    mount_j, pool_j = journals("mount"), journals("pool")  # undone: pool, then mount
    try:
        grow_pool(pool_j, 0, size, count)
    except HpvcError as e:
        if size == SIZE:
            raise
        pytest.skip(f"no free 1 GiB page now (memory fragmented): {e}")
    where = tmp_path / "hp" / f"{size}kB"
    ensure_hugetlbfs(mount_j, where, size)
    assert any(m.target == str(where) and m.fstype == "hugetlbfs" for m in read_mounts())
    surplus = pool_dir(0, size) / "surplus_hugepages"
    page = size << 10
    fd = os.open(where / "guest-ram", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, count * page)
        with mmap.mmap(fd, count * page) as mem:
            for i in range(count):  # a guest's RAM: the kernel takes the pages from the pool
                mem[i * page] = 1
            free = pool_state(0, size)[1]  # others' free pages count too: pages are alike
            assert pool_j.undo_all() == []
            assert _persistent(size) == before  # the pool is given back at once ...
            assert int(surplus.read_text()) == max(0, count - free)  # ... pages in use wait
    finally:
        os.close(fd)
        (where / "guest-ram").unlink()
    assert int(surplus.read_text()) == 0 and pool_state(0, size)[0] == total0
    assert mount_j.undo_all() == []
    assert not any(m.target == str(where) for m in read_mounts())
    assert not (tmp_path / "hp").exists()

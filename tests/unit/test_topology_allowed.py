"""What this process may use: its cpuset (``/proc/self/status``, the cpuset cgroup)
cuts the topology that ``hpvc topology``, ``hpvc plan`` and ``hpvc up`` see."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpvc.errors import DoesNotFit
from hpvc.plan import plan_cluster
from hpvc.spec import parse_spec
from hpvc.sysroot import SysRoot
from hpvc.topology import Topology, allowed_view, read_topology
from hpvc.topology.allowed import read_allowed
from hpvc.topology.files import Reader
from tests.conftest import snapshot_names
from tests.helpers import requires
from tests.unit.test_topology import (
    NODE,
    FakeHost,
    check_invariants,
    has_note,
    run_cli,
    two_sockets,
)

BIG = {"MemTotal": 64 << 20, "MemFree": 60 << 20}  # kB: a memory-only node (CXL, HBM)


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """2 packages x 2 cores x 2 threads; node 0 = CPUs 0-3 (package 0), node 1 = 4-7."""
    h = FakeHost(tmp_path)
    two_sockets(h)
    return h


def status(host: FakeHost, cpus: str, mems: str = "0-1") -> None:
    """A /proc/self/status as the kernel writes it (masks and lists)."""
    host.put(
        "proc/self/status",
        f"Name:\tpython3\nCpus_allowed:\tff\nCpus_allowed_list:\t{cpus}\n"
        f"Mems_allowed:\t00000000,00000003\nMems_allowed_list:\t{mems}\n",
    )


def spec(memory: str, vcpus: int = 2, count: int = 1) -> Any:
    tuning = {"pinning": "dedicated", "hugepages": "none", "numa": "none", "partition": "commodity"}
    node = {"role": "compute", "count": count, "vcpus": vcpus, "memory": memory}
    return parse_spec({"name": "t", "kind": "container", "tuning": tuning, "nodes": [node]})


def cores(topo: Topology) -> list[list[tuple[int, ...]]]:
    return [[c.cpus for c in p.cores] for p in topo.packages]


# --- reading what is allowed --------------------------------------------------------------


def test_a_tree_without_a_cpuset_allows_everything(host: FakeHost) -> None:
    topo = read_topology(host.root)
    assert topo == read_topology(host.root, whole_system=True)
    assert topo.allowed_cpus == tuple(range(8)) and topo.allowed_mems == (0, 1)
    assert topo.whole_system and not topo.restricted
    assert not has_note(topo, "this process may use")


def test_restricted_cpus_keep_cores_and_packages_that_keep_one(host: FakeHost) -> None:
    status(host, "1,4-5")
    topo = read_topology(host.root)
    assert topo.online_cpus == topo.allowed_cpus == (1, 4, 5)
    assert cores(topo) == [[(1,)], [(4, 5)]]  # core 2-3 is gone, core 0-1 keeps CPU 1
    assert [(n.id, n.cpus) for n in topo.numa_nodes] == [(0, (1,)), (1, (4, 5))]
    assert not topo.whole_system and topo.restricted
    assert has_note(topo, "this process may use only CPUs 1,4-5 and the memory of NUMA nodes 0-1")
    assert has_note(topo, "(/proc/self/status)")
    check_invariants(topo)


def test_a_package_without_allowed_cpus_goes(host: FakeHost) -> None:
    status(host, "0-3", mems="0")
    topo = read_topology(host.root)
    assert [p.id for p in topo.packages] == [0]
    assert [n.id for n in topo.numa_nodes] == [0]  # node 1: no allowed CPU nor memory
    assert topo.allowed_mems == (0,)
    check_invariants(topo)


def test_a_node_whose_memory_is_not_allowed_keeps_its_cpus_but_no_memory(host: FakeHost) -> None:
    host.node(0, "0-3", hugepages={2048: (512, 100)})
    status(host, "0-7", mems="1")
    topo = read_topology(host.root)
    n0 = topo.node(0)
    assert n0.cpus == (0, 1, 2, 3) and n0.memory_mib == 4096
    assert n0.free_mib == 0 and [(p.total, p.free) for p in n0.hugepages] == [(512, 0)]
    assert topo.node(1) == read_topology(host.root, whole_system=True).node(1)
    assert topo.allowed_mems == (1,) and topo.online_cpus == tuple(range(8))
    check_invariants(topo)
    # the planner puts the node where its memory may be, not first-fit on node 0
    plan = plan_cluster(spec("1GiB"), [("h", topo)])
    assert {c.host_node for n in plan.nodes for c in n.numa} == {1}
    whole = plan_cluster(spec("1GiB"), [("h", read_topology(host.root, whole_system=True))])
    assert {c.host_node for n in whole.nodes for c in n.numa} == {0}


def test_whole_system_shows_everything_and_says_what_is_allowed(host: FakeHost) -> None:
    status(host, "1,4-5", mems="1")
    whole = read_topology(host.root, whole_system=True)
    assert whole.online_cpus == tuple(range(8)) and len(whole.numa_nodes) == 2
    assert whole.allowed_cpus == (1, 4, 5) and whole.allowed_mems == (1,)
    assert whole.whole_system and whole.restricted
    assert allowed_view(whole) == read_topology(host.root)
    check_invariants(whole)


def test_plan_uses_only_allowed_cpus(host: FakeHost) -> None:
    status(host, "2-5")
    topo = read_topology(host.root)
    plan = plan_cluster(spec("512MiB", vcpus=1, count=4), [("h", topo)])
    assert sorted(c for n in plan.nodes for c in n.cpuset) == [2, 3, 4, 5]
    with pytest.raises(DoesNotFit):
        plan_cluster(spec("512MiB", vcpus=1, count=5), [("h", topo)])


# --- the cpuset cgroup, found as hwloc finds it --------------------------------------------

CGROUPS = {
    "v2": {
        "proc/mounts": "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev 0 0",
        "sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory pids",
        "proc/self/cgroup": "0::/system.slice/job_7",
        "sys/fs/cgroup/system.slice/job_7/cpuset.cpus.effective": "2-5",
        "sys/fs/cgroup/system.slice/job_7/cpuset.mems.effective": "1",
        "sys/fs/cgroup/system.slice/job_7/cpuset.cpus": "0-7",  # asked, not effective
    },
    "v1": {
        "proc/mounts": "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
        "cgroup /sys/fs/cgroup/cpuset cgroup rw,nosuid,cpuset 0 0",
        "proc/self/cgroup": "5:cpuset:/slurm/uid_0/job_7\n4:cpu:/\n0::/",
        "sys/fs/cgroup/cpuset/slurm/uid_0/job_7/cpuset.cpus": "2-5",
        "sys/fs/cgroup/cpuset/slurm/uid_0/job_7/cpuset.mems": "1",
    },
    "cpuset-fs": {
        "proc/mounts": "none /dev/cpuset cpuset rw,relatime 0 0",
        "proc/self/cpuset": "/torque/513099",
        "dev/cpuset/torque/513099/cpus": "2-5",
        "dev/cpuset/torque/513099/mems": "1",
    },
    "v1-noprefix": {
        "proc/mounts": "none /dev/cpuset cgroup rw,relatime,cpuset,noprefix 0 0",
        "proc/self/cpuset": "/torque/513099",
        "dev/cpuset/torque/513099/cpus": "2-5",
        "dev/cpuset/torque/513099/mems": "1",
    },
    "v1-comounted-spaced": {
        "proc/mounts": "cgroup /sys/fs/cgroup/cpu\\040set cgroup rw,cpu,cpuset 0 0",
        "proc/self/cgroup": "3:cpu,cpuset:/job",
        "sys/fs/cgroup/cpu set/job/cpuset.cpus": "2-5",
        "sys/fs/cgroup/cpu set/job/cpuset.mems": "1",
    },
}


@pytest.mark.parametrize("kind", list(CGROUPS))
def test_cpuset_cgroup(kind: str, host: FakeHost) -> None:
    for rel, text in CGROUPS[kind].items():
        host.put(rel, text)
    topo = read_topology(host.root)
    assert topo.online_cpus == (2, 3, 4, 5) and topo.allowed_mems == (1,)
    assert [(n.id, n.cpus, n.free_mib) for n in topo.numa_nodes] == [
        (0, (2, 3), 0),  # CPUs allowed, memory not
        (1, (4, 5), 1792),
    ]
    assert has_note(topo, "cgroup cpuset /")
    check_invariants(topo)


def test_cgroup2_without_the_cpuset_controller_restricts_nothing(host: FakeHost) -> None:
    for rel, text in CGROUPS["v2"].items():
        host.put(rel, text)
    host.put("sys/fs/cgroup/cgroup.controllers", "cpu io memory pids")
    assert read_topology(host.root).online_cpus == tuple(range(8))


def test_every_source_must_allow(host: FakeHost) -> None:
    for rel, text in CGROUPS["v2"].items():
        host.put(rel, text)
    status(host, "0-3", mems="0-1")  # taskset -c 0-3 inside the cgroup's 2-5
    topo = read_topology(host.root)
    assert topo.online_cpus == (2, 3)
    assert has_note(topo, "(/proc/self/status, cgroup cpuset /system.slice/job_7)")


def test_what_allows_nothing_online_is_ignored(host: FakeHost) -> None:
    status(host, "9-10", mems="4")
    topo = read_topology(host.root)
    assert topo == read_topology(host.root, whole_system=True)
    assert has_note(topo, "allow none of the online CPUs; ignored")
    assert has_note(topo, "allow none of the online NUMA nodes; ignored")


@pytest.mark.parametrize("name", snapshot_names())
def test_snapshots_allow_their_whole_machine(name: str, snapshots: dict[str, Path]) -> None:
    topo = read_topology(snapshots[name])
    assert topo == read_topology(snapshots[name], whole_system=True)
    assert not topo.restricted


def test_cpuset_of_snapshots(snapshots: dict[str, Path]) -> None:
    """Two snapshots carry their maker's cpuset: a torque job's cpuset filesystem,
    and a cgroup v1 cpuset; both allow the whole machine."""
    torque = read_allowed(Reader(SysRoot(snapshots["40intel64-4n10c+pci-conflicts"])))
    assert [s.name for s in torque.sources] == ["cgroup cpuset /torque/513099.master.cm.cluster"]
    assert torque.cpus == frozenset(range(40)) and torque.mems == frozenset(range(4))
    v1 = read_allowed(Reader(SysRoot(snapshots["offline-cpu0-node0"])))
    assert v1.cpus == frozenset(range(4, 21)) and v1.mems == frozenset({1})


def _hwloc_pus(root: Path) -> list[int]:
    run = subprocess.run(
        ["hwloc-calc", "--input", str(root), "--physical-output", "--intersect", "pu", "all"],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(int(x) for x in run.stdout.strip().split(","))


@pytest.mark.parametrize("kind", ["v2", "v1", "cpuset-fs"])
def test_hwloc_reads_the_same_cpuset(kind: str, snapshots: dict[str, Path], tmp_path: Path) -> None:
    requires("hwloc")
    root = tmp_path / "root"
    # 4 sockets interleaving CPUs 0,1,2,3,... with two threads per core
    shutil.copytree(snapshots["16em64t-4s2c2t"], root, symlinks=True)
    for rel, text in CGROUPS[kind].items():
        mems = rel.endswith(("mems", "mems.effective"))
        FakeHost(root).put(rel, "0" if mems else text.replace("2-5", "1-2,9,12"))
    topo = read_topology(root)
    assert list(topo.online_cpus) == _hwloc_pus(root) == [1, 2, 9, 12]
    assert cores(topo) == [[(12,)], [(1, 9)], [(2,)]]


# --- memory-only (CPU-less) NUMA nodes -----------------------------------------------------


def test_no_memory_from_a_cpu_less_node(host: FakeHost) -> None:
    host.put(f"{NODE}/online", "0-2")
    host.node(2, "", meminfo=BIG)
    topo = read_topology(host.root)
    assert topo.node(2).cpus == () and topo.node(2).free_mib == 60 << 10
    # 1.75GiB free on each node with CPUs: 3GiB fits only in node 2's memory
    with pytest.raises(DoesNotFit):
        plan_cluster(spec("3GiB"), [("h", topo)])
    plan = plan_cluster(spec("512MiB", vcpus=1, count=6), [("h", topo)])
    assert {c.host_node for n in plan.nodes for c in n.numa} == {0, 1}


def test_a_node_whose_cpus_are_not_allowed_gives_no_memory(host: FakeHost) -> None:
    host.node(1, "4-7", meminfo=BIG)
    status(host, "0-3", mems="0-1")
    topo = read_topology(host.root)
    assert topo.node(1).cpus == () and topo.node(1).free_mib == 60 << 10
    with pytest.raises(DoesNotFit):
        plan_cluster(spec("3GiB"), [("h", topo)])


# --- hpvc topology ------------------------------------------------------------------------


def test_cli_json_has_allowed_sets(host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    status(host, "1,4-5", mems="1")
    assert run_cli(["topology", "--root", str(host.root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["online_cpus"] == out["allowed_cpus"] == [1, 4, 5]
    assert out["allowed_mems"] == [1] and out["whole_system"] is False
    assert run_cli(["topology", "--root", str(host.root), "--json", "--whole-system"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["online_cpus"] == list(range(8))
    assert whole["allowed_cpus"] == [1, 4, 5] and whole["allowed_mems"] == [1]
    assert Topology.from_json(whole) == read_topology(host.root, whole_system=True)


def test_cli_table_marks_what_is_not_allowed(
    host: FakeHost, capsys: pytest.CaptureFixture[str]
) -> None:
    host.put(f"{NODE}/online", "0-2")
    host.node(2, "", meminfo=BIG)
    status(host, "1,4-5", mems="1-2")
    assert run_cli(["topology", "--root", str(host.root), "--whole-system"]) == 0
    out = capsys.readouterr().out
    assert "0-3 (allowed: 1)" in out and "4-7 (allowed: 4-5)" in out
    assert "4GiB (not allowed)" in out and "- (memory only)" in out
    assert "2 packages, 3 NUMA nodes, 4 cores, 8 PUs online" in out
    assert run_cli(["topology", "--root", str(host.root)]) == 0
    out = capsys.readouterr().out
    assert "(allowed:" not in out and "2 packages, 3 NUMA nodes, 2 cores, 3 PUs online" in out
    assert "'hpvc topology --whole-system' shows the whole machine" in out


def test_cli_help_names_whole_system(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["topology", "--help"]) == 0
    assert "--whole-system" in capsys.readouterr().out


# --- this host ---------------------------------------------------------------------------


def test_live_host_allows_the_process_affinity() -> None:
    topo = read_topology("/")
    whole = read_topology("/", whole_system=True)
    assert set(topo.allowed_cpus) == os.sched_getaffinity(0) & set(whole.online_cpus)
    cut = allowed_view(whole)  # free memory moves between two reads: compare the rest
    assert (topo.packages, topo.online_cpus, topo.allowed_mems, topo.whole_system) == (
        cut.packages,
        cut.online_cpus,
        cut.allowed_mems,
        cut.whole_system,
    )
    assert [(n.id, n.cpus) for n in topo.numa_nodes] == [(n.id, n.cpus) for n in cut.numa_nodes]


def test_live_host_under_taskset_sees_one_cpu() -> None:
    cpu = min(os.sched_getaffinity(0))
    code = (
        f"import os; os.sched_setaffinity(0, {{{cpu}}});"
        " from hpvc.cli import main; main(['topology', '--json'])"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["allowed_cpus"] == out["online_cpus"] == [cpu]
    if shutil.which("taskset"):
        argv = ["taskset", "-c", str(cpu), sys.executable, "-m", "hpvc", "topology", "--json"]
        run = subprocess.run(argv, capture_output=True, text=True, check=True)
        assert json.loads(run.stdout)["allowed_cpus"] == [cpu]


def test_a_cut_view_is_not_cut_again(host: FakeHost) -> None:
    status(host, "1")
    cut = read_topology(host.root)
    assert allowed_view(cut) is cut


def test_the_cgroup_line_of_the_mounted_hierarchy(host: FakeHost) -> None:
    """With cgroup v1 cpusets and the v2 hierarchy both there, the v1 cpuset
    line counts, wherever the ``0::`` line is (hwloc takes the first)."""
    for rel, text in CGROUPS["v1"].items():
        host.put(rel, text)
    host.put("proc/self/cgroup", "0::/user.slice\n5:cpuset:/slurm/uid_0/job_7")
    assert read_topology(host.root).online_cpus == (2, 3, 4, 5)

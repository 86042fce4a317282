"""Slurm's abstract core numbers (S_JOB_ALLOC_CORES) to OS CPU ids, as slurmd maps them."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hpvc.errors import InputError, TopologyError
from hpvc.slurm.cpus import os_cpus, slurm_cores
from hpvc.topology import Topology, allowed_view, read_topology
from hpvc.topology.files import parse_cpumask
from hpvc.units import parse_cpulist
from tests.conftest import snapshot_names
from tests.helpers import TOPOLOGIES, requires
from tests.unit.topogen import make_topology, topologies

_TOKEN = re.compile(r"\b(Core|PU) L#(\d+)(?: \(P#(\d+))?")
# slurmd's hwloc type filters (xcpuinfo_hwloc_topo_load): no L1/L2/L4/L5 caches, no Misc.
SLURMD_FILTERS = ("l1cache", "l2cache", "l4cache", "l5cache", "l1icache", "l2icache", "misc")
# Consoles made with every cache: cores sharing an L2 are grouped there, not in
# slurmd, which filters L2 out: its order is the lowest-CPU order below.
L2_GROUPED = {"8em64t-2s2ca2c": [0, 2, 4, 6, 1, 3, 5, 7]}
CONSOLES = [n for n in snapshot_names() if Path(TOPOLOGIES, f"{n}.console").is_file()]


def hwloc_order(console: str) -> tuple[dict[int, set[int]], dict[int, int]]:
    """From an lstopo console: Core L# -> its PUs' OS ids, and PU L# -> OS id."""
    cores: dict[int, set[int]] = {}
    pus: dict[int, int] = {}
    core = -1
    for m in _TOKEN.finditer(console):
        if m[1] == "Core":
            core = int(m[2])
            cores[core] = set()
        elif m[3] is not None:
            cores[core].add(int(m[3]))
            pus[int(m[2])] = int(m[3])
    return cores, pus


def whole(snapshots: dict[str, Path], name: str) -> Topology:
    return read_topology(snapshots[name], whole_system=True)


def sysfs(root: Path, cpu: int, name: str) -> str:
    return (root / f"sys/devices/system/cpu/cpu{cpu}/topology/{name}").read_text().strip()


# --- the rule on hosts where it matters ----------------------------------------------------


def test_interleaved_sockets_with_hyperthreads(snapshots: dict[str, Path]) -> None:
    root = snapshots["16em64t-4s2c2t"]
    # the snapshot is what the test needs: sockets interleave, siblings are n and n+8
    assert [sysfs(root, c, "physical_package_id") for c in range(4)] == ["0", "1", "2", "3"]
    assert parse_cpumask(sysfs(root, 0, "thread_siblings")) == [0, 8]
    topo = whole(snapshots, "16em64t-4s2c2t")
    assert os_cpus(topo, [0]) == {0, 8}
    assert os_cpus(topo, [1]) == {4, 12}  # socket 0's second core, not CPU 1
    assert os_cpus(topo, [2]) == {1, 9}  # socket 1's first core
    assert os_cpus(topo, parse_cpulist("0-1,7")) == {0, 8, 4, 12, 7, 15}
    # ThreadsPerCore=1 / CPUs=16: every hardware thread is a "core", same order
    assert os_cpus(topo, [0, 1], threads_per_core=1) == {0, 8}
    assert os_cpus(topo, [2, 3], threads_per_core=1) == {4, 12}
    assert os_cpus(topo, [1], threads_per_core=2) == os_cpus(topo, [1])


def test_even_odd_sockets(snapshots: dict[str, Path]) -> None:
    """Socket 0 = CPUs 4,6,...,20 and socket 1 = 5,7,...,19 (CPUs 0-3 offline)."""
    topo = whole(snapshots, "offline-cpu0-node0")
    assert topo.packages[0].cpus == tuple(range(4, 21, 2))
    assert [os_cpus(topo, [i]) for i in (0, 1, 8, 9, 16)] == [{4}, {6}, {20}, {5}, {19}]
    assert os_cpus(topo, parse_cpulist("0-16")) == set(topo.online_cpus)


@pytest.mark.parametrize("name", CONSOLES)
def test_core_i_is_hwlocs_core_i(name: str, snapshots: dict[str, Path]) -> None:
    """Abstract core i is hwloc's Core L#i, PU i its PU L#i (hwloc's own report)."""
    cores, pus = hwloc_order(Path(TOPOLOGIES, f"{name}.console").read_text())
    topo = whole(snapshots, name)
    if name in L2_GROUPED:
        assert [min(os_cpus(topo, [i])) for i in cores] == L2_GROUPED[name]
        assert sorted(map(sorted, cores.values())) == sorted(map(sorted, slurm_cores(topo)))
        return
    assert cores and {i: os_cpus(topo, [i]) for i in cores} == cores
    assert {j: os_cpus(topo, [j], threads_per_core=1) for j in pus} == {
        j: {p} for j, p in pus.items()
    }


@pytest.mark.parametrize("name", snapshot_names())
def test_order_matches_lstopo_with_slurmds_filters(name: str, snapshots: dict[str, Path]) -> None:
    requires("hwloc")
    if shutil.which("lstopo") is None:
        pytest.skip("lstopo not installed (hwloc)")
    argv = ["lstopo", "--input", str(snapshots[name]), "--of", "console", "--whole-system"]
    argv += [x for f in SLURMD_FILTERS for x in ("--filter", f"{f}:none")]
    cores, pus = hwloc_order(subprocess.run(argv, capture_output=True, text=True).stdout)
    topo = whole(snapshots, name)
    assert cores and {i: os_cpus(topo, [i]) for i in cores} == cores
    assert [p for _, p in sorted(pus.items())] == [c for core in slurm_cores(topo) for c in core]


# --- errors ---------------------------------------------------------------------------------


def test_out_of_range_is_one_clear_line(snapshots: dict[str, Path]) -> None:
    topo = whole(snapshots, "16em64t-4s2c2t")
    with pytest.raises(InputError) as e:
        os_cpus(topo, parse_cpulist("6-9"))
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert str(e.value).startswith("Slurm cores 8-9: this host has 8 cores, numbered 0-7")
    with pytest.raises(InputError, match="16 PUs, numbered 0-15"):
        os_cpus(topo, [16], threads_per_core=1)
    with pytest.raises(InputError, match="Slurm cores -1"):
        os_cpus(topo, [-1])


def test_threads_per_core_must_be_the_hosts_or_one(snapshots: dict[str, Path]) -> None:
    with pytest.raises(InputError, match="cores have 2 hardware threads"):
        os_cpus(whole(snapshots, "16em64t-4s2c2t"), [0], threads_per_core=4)
    hybrid = whole(snapshots, "20em64t-hybrid-1p6c2t+2ca4co1t")
    with pytest.raises(InputError, match="cores have 1/2 hardware threads"):
        os_cpus(hybrid, [0], threads_per_core=2)
    assert os_cpus(hybrid, [5, 6]) == {10, 11, 12}  # the last P-core, the first E-core


def test_needs_the_whole_system() -> None:
    topo = make_topology(packages=2, cores_per_node=2, threads=2)
    cut = allowed_view(replace(topo, allowed_cpus=(5,)))
    with pytest.raises(TopologyError, match="whole_system=True"):
        os_cpus(cut, [0])


# --- properties -----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(topo=topologies(), data=st.data())
def test_each_index_is_one_whole_core(topo: Topology, data: st.DataObject) -> None:
    assume(topo.online_cpus)  # the generator may take every CPU offline
    n = sum(len(p.cores) for p in topo.packages)
    core_sets = [set(c.cpus) for p in topo.packages for c in p.cores]
    singles = [os_cpus(topo, [i]) for i in range(n)]
    assert all(s in core_sets for s in singles)  # every index: all CPUs of one core
    assert sum(len(s) for s in singles) == len(set().union(*singles))  # pairwise disjoint
    assert set().union(*singles) == set(topo.online_cpus)
    picked = data.draw(st.sets(st.integers(0, n - 1)))
    assert os_cpus(topo, sorted(picked)) == set().union(*(singles[i] for i in picked))
    pus = [os_cpus(topo, [j], threads_per_core=1) for j in range(len(topo.online_cpus))]
    assert all(len(p) == 1 for p in pus) and set().union(*pus) == set(topo.online_cpus)
    # PU mode walks the same cores in the same order, one thread at a time
    assert [min(p) for p in pus] == [c for s in slurm_cores(topo) for c in s]

"""cluster.inspect: planning without booking, a node's CPU time and cpuset (host-wide
facts are host/'s readers', tested in test_host_usage.py and test_accel.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.cluster import inspect
from hpvc.cluster.inspect import HostView
from hpvc.errors import DoesNotFit
from hpvc.spec import parse_spec
from tests.unit.topogen import make_topology


def spec(name: str, subnet: str, vcpus: int, pinning: str, partition: str = "commodity") -> str:
    return (
        f'name = "{name}"\nkind = "container"\nimage = "hpc"\n[network]\nsubnet = "{subnet}"\n'
        f'[tuning]\nhugepages = "none"\npinning = "{pinning}"\npartition = "{partition}"\n'
        f'[[nodes]]\nrole = "compute"\ncount = 1\nvcpus = {vcpus}\nmemory = "256MiB"\n'
    )


def two_cpus() -> HostView:
    return HostView(make_topology(packages=1, cores_per_node=2, threads=1, with_1g=False))


# --- the host view ---------------------------------------------------------------------


def test_host_view_of_snapshots(snapshots: dict[str, Path]) -> None:
    ht = inspect.read_host(snapshots["16em64t-4s2c2t"])
    assert (ht.cpus, ht.threads_per_core, ht.name) == (16, 2, "local")
    flat = inspect.read_host(snapshots["8em64t-2s2ca2c"], "n1")
    assert (flat.cpus, flat.threads_per_core, flat.name) == (8, 1, "n1")
    assert flat.named("n2").name == "n2" and flat.named("n2").topology is flat.topology


def test_host_view_of_offline_cpus(snapshots: dict[str, Path]) -> None:
    host = inspect.read_host(snapshots["offline-cpu0-node0"])
    assert 0 not in host.topology.online_cpus and host.cpus == len(host.topology.online_cpus)


# --- planning without booking ------------------------------------------------------------


def test_plan_together_places_each_beside_the_ones_before() -> None:
    host = two_cpus()
    a = spec("a", "10.0.0.0/24", 1, "dedicated")
    b = spec("b", "10.0.1.0/24", 1, "dedicated")
    pa, pb = inspect.plan_together([a, b], host)
    assert set(pa.nodes[0].cpuset).isdisjoint(pb.nodes[0].cpuset)
    assert inspect.plan_together([a], host)[0].nodes[0].cpuset == pa.nodes[0].cpuset
    assert inspect.why_not_fit([a, b], host) is None


def test_why_not_fit_says_why() -> None:
    host = two_cpus()
    a = spec("a", "10.0.0.0/24", 2, "dedicated")
    b = spec("b", "10.0.1.0/24", 1, "dedicated")
    with pytest.raises(DoesNotFit):
        inspect.plan_together([a, b], host)
    why = inspect.why_not_fit([a, b], host)
    assert why and "cpu" in why.lower()
    assert inspect.why_not_fit([a], host) is None  # alone it fits


def test_spec_of_reads_toml() -> None:
    got = inspect.spec_of(spec("a", "10.0.0.0/24", 1, "shared"))
    assert got.name == "a" and got.tuning.pinning == "shared"


def test_why_spec_file_not_fit(snapshots: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text(spec("a", "10.0.0.0/24", 4, "dedicated"))
    assert inspect.why_spec_file_not_fit(path, snapshots["8em64t-2s2ca2c"]) is None
    why = inspect.why_spec_file_not_fit(path, snapshots["2i386-2t-hugepagesizecount"])
    assert why is not None


def test_hosts_used_counts_the_hosts_of_the_plan(snapshots: dict[str, Path]) -> None:
    one = inspect.read_host(snapshots["8em64t-2s2ca2c"])
    hosts = [one.named(f"h{i}") for i in range(4)]
    s = parse_spec(
        {
            "name": "many",
            "kind": "container",
            "network": {"subnet": "10.0.0.0/16"},
            "tuning": {"pinning": "dedicated", "hugepages": "none"},
            "nodes": [{"role": "compute", "count": 12, "vcpus": 2, "memory": "256MiB"}],
        }
    )
    assert 2 <= inspect.hosts_used(s, hosts) <= 4  # 24 dedicated vCPUs, 8 CPUs a host


# --- what nodes use ----------------------------------------------------------------------


def fake_root(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp


def test_node_cpu_seconds_v1_and_v2(tmp_path: Path) -> None:
    v1 = fake_root(
        tmp_path / "v1",
        {
            "/proc/mounts": "cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\n",
            "/sys/fs/cgroup/cpuacct/hpvc/c1/compute0/cpuacct.usage": "2500000000\n",
        },
    )
    assert inspect.node_cpu_seconds("c1", "compute0", v1) == 2.5
    assert inspect.node_cpu_seconds("c1", "compute1", v1) is None
    v2 = fake_root(
        tmp_path / "v2",
        {
            "/proc/mounts": "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n",
            "/sys/fs/cgroup/cgroup.controllers": "cpu cpuset",
            "/sys/fs/cgroup/hpvc/c1/compute0/cpu.stat": "usage_usec 1500000\nuser_usec 1\n",
        },
    )
    assert inspect.node_cpu_seconds("c1", "compute0", v2) == 1.5


def test_node_cpuset_reads_the_cgroup(tmp_path: Path) -> None:
    root = fake_root(
        tmp_path,
        {
            "/proc/mounts": "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n",
            "/sys/fs/cgroup/cgroup.controllers": "cpu cpuset",
            "/sys/fs/cgroup/hpvc/c1/compute0/cpuset.cpus.effective": "2-3\n",
        },
    )
    assert inspect.node_cpuset("c1", "compute0", root) == "2-3"
    assert inspect.node_cpuset("c1", "compute9", root) is None  # not running: unknown

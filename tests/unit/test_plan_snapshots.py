"""The planner on real machines' topologies: random specs, inventories, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpvc.cli import main
from hpvc.errors import DoesNotFit
from hpvc.plan import plan_cluster
from hpvc.plan.reservations import reservations_from_plans
from hpvc.spec import load_spec, parse_spec
from hpvc.topology import Topology, read_topology
from hpvc.topology.inventory import load_inventory
from tests.conftest import snapshot_names
from tests.unit.invariants import check_plan
from tests.unit.topogen import specs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def real(snapshots: dict[str, Path]) -> dict[str, Topology]:
    return {name: read_topology(root) for name, root in snapshots.items()}


def test_every_snapshot_is_used(real: dict[str, Topology]) -> None:
    assert sorted(real) == snapshot_names()
    assert len(real) >= 8


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), spec=specs(), second=specs())
def test_random_specs_on_real_topologies(
    real: dict[str, Topology],
    data: st.DataObject,
    spec: dict[str, object],
    second: dict[str, object],
) -> None:
    names = data.draw(st.lists(st.sampled_from(sorted(real)), min_size=1, max_size=3))
    hosts = {f"h{i}": real[n] for i, n in enumerate(names)}
    try:
        a = plan_cluster(parse_spec(spec), list(hosts.items()))
    except DoesNotFit:
        return
    check_plan(a, hosts)
    res = reservations_from_plans([a], hosts)
    try:
        b = plan_cluster(parse_spec({**second, "name": "other"}), list(hosts.items()), res)
    except DoesNotFit:
        return
    check_plan(b, hosts, res)


def test_example_on_four_socket_amd(real: dict[str, Topology]) -> None:
    topo = real["64amd64-4s2n4ca2co"]
    plan = plan_cluster(load_spec(EXAMPLES / "cluster.toml"), [("amd", topo)])
    check_plan(plan, {"amd": topo})
    computes = [n for n in plan.nodes if n.role == "compute"]
    # 2-vCPU compute nodes each sit in one NUMA node; the cluster holds one socket.
    assert all(len(n.numa) == 1 for n in computes)
    assert len(plan.hosts[0].hpc_packages) == 1


def test_inventory_spans_hosts(snapshots: dict[str, Path], tmp_path: Path) -> None:
    inv = tmp_path / "hosts.toml"
    inv.write_text(
        f'[[hosts]]\nname = "amd"\ncount = 3\ntopology = "{snapshots["64amd64-4s2n4ca2co"]}"\n'
        f'[[hosts]]\nname = "x"\ntopology = "{snapshots["8em64t-2s2ca2c"]}"\n'
    )
    hosts = load_inventory(inv)
    assert [n for n, _ in hosts] == ["amd0", "amd1", "amd2", "x"]
    spec = parse_spec(
        {
            "name": "wide",
            "tuning": {"partition": "hpc", "hugepages": "none"},
            "nodes": [{"role": "compute", "count": 10, "vcpus": 8, "memory": "1GiB"}],
        }
    )
    plan = plan_cluster(spec, hosts)
    check_plan(plan, dict(hosts))
    # 4 sockets of 16 CPUs hold two 8-vCPU nodes each: 8 on amd0, the rest on amd1.
    assert [(h.name, len(h.nodes)) for h in plan.hosts] == [("amd0", 8), ("amd1", 2)]


def test_cli_plan_json_on_snapshot(
    snapshots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = snapshots["40intel64-4n10c+pci-conflicts"]
    with pytest.raises(SystemExit) as e:
        main(["plan", str(EXAMPLES / "cluster.toml"), "--topology-root", str(root), "--json"])
    assert e.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"] == "demo" and len(doc["nodes"]) == 3
    assert doc["hosts"][0]["name"] == "40intel64-4n10c+pci-conflicts"
    assert doc["hosts"][0]["hugepages"][0]["size_kib"] == 2048


def test_cli_does_not_fit_exit_2(
    snapshots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "big.toml"
    spec.write_text(
        'name = "big"\n[tuning]\nhugepages = "none"\n'
        '[[nodes]]\nrole = "compute"\nvcpus = 12\nmemory = "1GiB"\n'
    )
    with pytest.raises(SystemExit) as e:
        main(["plan", str(spec), "--topology-root", str(snapshots["8em64t-2s2ca2c"])])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hpvc: cluster does not fit: compute0 needs 12 dedicated CPUs on one host, host"
        " '8em64t-2s2ca2c' has 8 free in sockets it may hold whole (partition hpc)"
        " (the cluster needs 12 dedicated CPUs in all) (shrink the spec or add hosts)"
    )


def test_a_cluster_short_of_cpus_as_a_whole_says_so_first(
    snapshots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each node fits alone (head 4, computes 3 each) but not all of them: the
    error gives the cluster's total and how to shrink it (issue 32, item 14c)."""
    spec = tmp_path / "wide.toml"
    spec.write_text(
        'name = "wide"\n[tuning]\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "head"\nvcpus = 4\nmemory = "256MiB"\n'
        '[[nodes]]\nrole = "compute"\ncount = 2\nvcpus = 3\nmemory = "256MiB"\n'
    )
    with pytest.raises(SystemExit) as e:
        main(["plan", str(spec), "--topology-root", str(snapshots["8em64t-2s2ca2c"])])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hpvc: cluster does not fit: the cluster needs 10 dedicated CPUs (one per vCPU), host"
        " '8em64t-2s2ca2c' has 8 free to pin"
        ' (give it at most 8 vCPUs in all, or pinning = "shared" under [tuning])'
    )

"""Spec [shared] and [spark], and what the plan makes of them (hpvc.plan.services)."""

from __future__ import annotations

from typing import Any

import pytest

from hpvc.errors import SpecError
from hpvc.plan import Reservations, plan_cluster
from hpvc.plan.model import plan_from_json
from hpvc.plan.services import DEFAULT_SHARED, VM_SHARED_MIB, server_node
from hpvc.spec import Spec, parse_spec
from hpvc.spec.spark import worker_memory_mib
from tests.unit.topogen import make_topology


def spec(**extra: Any) -> Spec:
    doc: dict[str, Any] = {
        "name": "sp",
        "tuning": {"pinning": "shared", "hugepages": "none"},
        "nodes": [
            {"role": "head", "memory": "1GiB"},
            {"role": "compute", "count": 2, "vcpus": 2, "memory": "3GiB"},
        ],
    }
    doc.update(extra)
    return parse_spec(doc, "t.toml")


def plan(s: Spec):  # type: ignore[no-untyped-def]
    return plan_cluster(s, [("h", make_topology())], Reservations())


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"shared": {"size": "1GiB"}}, 'server = "nfs" only'),
        ({"shared": {"path": "shared"}}, "absolute folder path"),
        ({"shared": {"path": "/a/../etc"}}, "absolute folder path"),
        ({"shared": {"path": "/usr/share/x"}}, "inside the node's system"),
        ({"shared": {"server": "nfs", "size": "12"}}, "write the unit"),
        ({"shared": {"servr": "nfs"}}, "servr"),
        ({"spark": {"master_port": 8080}}, "must differ"),
        (
            {"spark": {}, "nodes": [{"role": "head"}, {"role": "compute", "memory": "1GiB"}]},
            "give the nodes at least 2 GiB",
        ),
    ],
)
def test_bad_sections_are_refused(extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as e:
        spec(**extra)
    assert needle in str(e.value)


def test_spark_needs_head_and_computes() -> None:
    with pytest.raises(SpecError, match="needs a head node"):
        parse_spec({"name": "x", "nodes": [{"role": "compute"}], "spark": {}}, "t.toml")
    with pytest.raises(SpecError, match="needs a head node"):
        parse_spec({"name": "x", "nodes": [{"role": "head"}], "spark": {}}, "t.toml")


def test_server_is_storage_then_head_then_first() -> None:
    s = spec(nodes=[{"role": "compute", "count": 2}, {"role": "storage"}, {"role": "head"}])
    assert server_node(s) == "storage0"
    s = spec(nodes=[{"role": "compute", "count": 2}, {"role": "head"}])
    assert server_node(s) == "head0"
    s = spec(nodes=[{"role": "compute", "count": 2}])
    assert server_node(s) == "compute0"


def test_nfs_plan_names_server_address_and_roundtrips() -> None:
    s = spec(
        nodes=[{"role": "compute", "count": 2}, {"role": "storage"}],
        shared={"server": "nfs", "size": "2GiB", "path": "/data", "keep": True},
    )
    p = plan(s)
    assert p.shared.server == "nfs"
    assert p.shared.node == "storage0"
    assert p.shared.address == p.node("storage0").ip == "10.88.0.4"
    assert (p.shared.size_mib, p.shared.path, p.shared.keep) == (2048, "/data", True)
    assert plan_from_json(p.to_json()) == p


def test_vm_nfs_is_planned_with_a_default_size() -> None:
    """A guest cannot export a host folder: a VM cluster's NFS backing is a disk,
    4 GiB unless the spec sizes it; containers keep a folder without a size."""
    vm = plan(spec(kind="vm", shared={"server": "nfs"}))
    assert (vm.shared.server, vm.shared.node, vm.shared.size_mib) == ("nfs", "head0", VM_SHARED_MIB)
    assert VM_SHARED_MIB == 4096
    sized = plan(spec(kind="vm", shared={"server": "nfs", "size": "256MiB"}))
    assert sized.shared.size_mib == 256
    assert plan(spec(shared={"server": "nfs"})).shared.size_mib is None
    assert plan_from_json(vm.to_json()) == vm


def test_default_shared_leaves_plan_json_as_it_was() -> None:
    p = plan(spec())
    assert p.shared == DEFAULT_SHARED
    assert "shared" not in p.to_json() and "spark" not in p.to_json()
    assert plan_from_json(p.to_json()) == p


def test_spark_workers_sized_from_their_nodes() -> None:
    p = plan(spec(spark={}))
    sp = p.spark
    assert sp is not None
    assert (sp.master, sp.address, sp.url) == (
        "head0",
        p.node("head0").ip,
        "spark://10.88.0.2:7077",
    )
    assert sp.ui == "http://10.88.0.2:8080"
    assert [(w.node, w.cores, w.memory_mib) for w in sp.workers] == [
        ("compute0", 2, worker_memory_mib(3072)),
        ("compute1", 2, worker_memory_mib(3072)),
    ]
    assert [w.address for w in sp.workers] == [p.node("compute0").ip, p.node("compute1").ip]
    assert plan_from_json(p.to_json()) == p


def test_spark_worker_memory_is_the_specs_when_it_fits_the_nodes() -> None:
    p = plan(spec(spark={"worker_memory": "1GiB"}))
    assert p.spark is not None and [w.memory_mib for w in p.spark.workers] == [1024, 1024]
    most = worker_memory_mib(3072)
    too_big = rf"{most + 64}MiB does not fit a 3072MiB node .* to {most}"
    with pytest.raises(SpecError, match=too_big):
        spec(spark={"worker_memory": f"{most + 64}MiB"})
    with pytest.raises(SpecError, match="want 512MiB to"):
        spec(spark={"worker_memory": "256MiB"})

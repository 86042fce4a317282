"""The Spark bench's nodes and workers sized to the host (bench.spark.sizing): pure,
hosts given as the memory they can give, or read from the topology snapshots' files."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hpvc.bench.spark import runner as spark
from hpvc.bench.spark import sizing
from hpvc.errors import InputError
from hpvc.plan import plan_cluster
from hpvc.plan.model import Reservations
from hpvc.spec import parse_spec
from hpvc.spec.spark import worker_memory_mib
from hpvc.topology import read_topology
from tests.unit.topogen import make_topology

GIB = 1 << 30
KINDS = {"container"}


def shape(mem: int, kinds: set[str] = KINDS, sizes: list[int] | None = None) -> sizing.Shape:
    return sizing.fit(
        mem, kinds, spark.NODE_MIB, spark.HEAD_MIB, spark.WORKERS,
        sizes or spark.DEFAULT_SIZES, sizes_given=sizes is not None,
    )  # fmt: skip


def fits(s: sizing.Shape, mem: int, kind: str) -> bool:
    """Whether the planner places the bench's cluster of this shape on a host of ``mem``."""
    text = spark.spec("bs", "10.77.0.0/24", "host", 4, kind, s.node_mib[kind], s.worker_mib)
    host = make_topology(memory_mib=mem)
    try:
        plan_cluster(parse_spec(tomllib.loads(text), "b.toml"), [("h", host)], Reservations())
    except Exception:
        return False
    return True


def test_a_roomy_host_keeps_the_defaults() -> None:
    got = shape(64 * 1024, {"container", "vm"})
    assert got.node_mib == {"container": 8192, "vm": 4096}
    assert got.worker_mib == spark.WORKER_MIB and got.sizes == spark.DEFAULT_SIZES
    assert got.notes == ()


def test_the_issues_host_of_7875_mib_gets_nodes_that_fit() -> None:
    got = shape(7875)
    assert got.node_mib["container"] < 8192
    assert spark.HEAD_MIB + spark.WORKERS * got.node_mib["container"] <= 7875
    assert fits(got, 7875, "container")
    assert not fits(shape(64 * 1024), 7875, "container")  # the defaults did not
    assert any("scaled down from 8192" in n for n in got.notes)


@pytest.mark.parametrize("mem", [7300, 7875, 9000, 12000, 20000, 24000])
def test_nodes_and_workers_fit_and_keep_the_same_shape(mem: int) -> None:
    got = shape(mem, {"container", "vm"})
    for kind in ("container", "vm"):
        assert sizing.MIN_NODE_MIB <= got.node_mib[kind] <= spark.NODE_MIB[kind]
        assert fits(got, mem, kind), (mem, kind, got)
        assert got.worker_mib <= worker_memory_mib(got.node_mib[kind])
    if min(got.node_mib.values()) < 4096:
        assert got.worker_mib < spark.WORKER_MIB and any("workers" in n for n in got.notes)


def test_default_sizes_the_workers_cannot_hold_are_left_out_but_given_ones_kept() -> None:
    small = shape(7300)  # nodes of 2 GiB: workers of 896 MiB, 1792 MiB together
    assert small.worker_mib == worker_memory_mib(2048)
    assert small.sizes == [GIB] and any("4 GiB left out" in n for n in small.notes)
    asked = shape(7300, sizes=[4 * GIB])
    assert asked.sizes == [4 * GIB]


def test_a_host_too_small_for_any_cluster_is_one_line() -> None:
    with pytest.raises(InputError) as e:
        shape(4000)
    assert "this host can give 4000 MiB" in e.value.why and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["2i386-2t-hugepagesizecount", "8em64t-2s2ca2c"])
def test_on_the_snapshots_the_cluster_fits_or_is_refused(
    snapshots: dict[str, Path], name: str
) -> None:
    topo = read_topology(snapshots[name])
    mem = sum(n.free_mib for n in topo.numa_nodes)
    need = spark.HEAD_MIB + spark.WORKERS * sizing.MIN_NODE_MIB + sizing.HOST_MARGIN_MIB
    if mem < need:
        with pytest.raises(InputError):
            shape(mem)
        return
    got = shape(mem)
    assert spark.HEAD_MIB + spark.WORKERS * got.node_mib["container"] <= mem

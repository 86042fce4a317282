"""What the planner's speed work (issue 33) must not change: the cycle collector
is back as it was after a plan, one host's overlay lists every other host's
nodes, reservations still apply to their own host. Plans themselves:
tests/unit/test_plan_golden.py. Timings: docs/benchmarks.md "Scale: planner"."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

import hpvc.plan.planner as planner
from hpvc.errors import DoesNotFit
from hpvc.plan import HostReservation, Reservations, host_overlay, plan_cluster
from hpvc.spec import parse_spec
from hpvc.topology.inventory import Fabric
from tests.unit.topogen import make_topology


def _spec(count: int, vcpus: int = 1) -> Any:
    return parse_spec(
        {
            "name": "s",
            "kind": "container",
            "tuning": {"pinning": "dedicated", "hugepages": "none", "partition": "commodity"},
            "nodes": [{"role": "compute", "count": count, "vcpus": vcpus, "memory": "1GiB"}],
        }
    )


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_collector_paused_while_planning_and_back_after(
    collector_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    place_all = planner._place_all

    def watching(*args: Any) -> Any:
        seen.append(gc.isenabled())
        return place_all(*args)

    monkeypatch.setattr(planner, "_place_all", watching)
    topo = make_topology(packages=1, cores_per_node=4, threads=1)
    plan_cluster(_spec(2), [("h0", topo)])
    assert seen == [False] and gc.isenabled()
    with pytest.raises(DoesNotFit):
        plan_cluster(_spec(1, vcpus=64), [("h0", topo)])
    assert seen == [False, False] and gc.isenabled()


def test_collector_left_off_when_it_was_off(collector_on: None) -> None:
    gc.disable()
    plan_cluster(_spec(1), [("h0", make_topology(packages=1, cores_per_node=2, threads=1))])
    assert not gc.isenabled()


def test_each_hosts_overlay_lists_every_other_hosts_nodes() -> None:
    topo = make_topology(packages=1, cores_per_node=2, threads=1)  # 2 nodes a host
    hosts = [(f"h{i}", topo) for i in range(4)]
    fabric = {h: Fabric(f"192.0.2.{i + 1}") for i, (h, _) in enumerate(hosts)}
    plan = plan_cluster(_spec(7), hosts, fabric=fabric)
    for h, _ in hosts:
        overlay = host_overlay(plan, h)
        assert overlay is not None
        remote = {n for v in overlay.remotes for n in v.nodes}
        assert remote == {(n.name, n.ip, n.mac) for n in plan.nodes if n.host != h}
        assert [v.host for v in overlay.remotes] == [x for x, _ in hosts if x != h]
    assert host_overlay(plan, "h3") is not None
    assert len(host_overlay(plan, "h0").remotes[-1].nodes) == 1  # type: ignore[union-attr]


def test_a_reservation_holds_its_own_host_only() -> None:
    topo = make_topology(packages=1, cores_per_node=2, threads=1)
    taken = HostReservation(host="h1", dedicated_cpus=frozenset({0, 1}))
    later = HostReservation(host="h1")  # a second entry for h1: the first counts
    res = Reservations(hosts=(taken, later))
    plan = plan_cluster(_spec(2), [("h0", topo), ("h1", topo)], res)
    assert {n.host for n in plan.nodes} == {"h0"}
    plan = plan_cluster(_spec(4), [("h1", topo), ("h0", topo), ("h2", topo)], res)
    assert [n.host for n in plan.nodes] == ["h0", "h0", "h2", "h2"]

"""Property tests: random specs on random and real topologies keep every invariant."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpvc.errors import DoesNotFit
from hpvc.plan import plan_cluster
from hpvc.plan.reservations import reservations_from_plans
from hpvc.spec import parse_spec
from hpvc.topology.model import Topology
from tests.unit.invariants import check_plan
from tests.unit.topogen import specs, topologies

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(spec=specs(), hosts=st.lists(topologies(), min_size=1, max_size=3))
def test_random_specs_on_random_hosts(spec: dict[str, object], hosts: list[Topology]) -> None:
    s = parse_spec(spec)
    named = {f"h{i}": t for i, t in enumerate(hosts)}
    try:
        plan = plan_cluster(s, list(named.items()))
    except DoesNotFit as e:
        assert "needs" in e.why or "no host" in e.why or "no CPU" in e.why
        return
    check_plan(plan, named)


@SETTINGS
@given(first=specs(), second=specs(), topo=topologies())
def test_two_clusters_never_collide(
    first: dict[str, object], second: dict[str, object], topo: Topology
) -> None:
    hosts = {"h0": topo}
    try:
        a = plan_cluster(parse_spec(first), list(hosts.items()))
    except DoesNotFit:
        return
    res = reservations_from_plans([a], hosts)
    second = {**second, "name": "other"}
    try:
        b = plan_cluster(parse_spec(second), list(hosts.items()), res)
    except DoesNotFit:
        return
    check_plan(b, hosts, res)


@SETTINGS
@given(spec=specs(), topo=topologies(), extra=st.integers(0, 3), group=st.integers(0, 2))
def test_scaling_keeps_running_nodes(
    spec: dict[str, Any], topo: Topology, extra: int, group: int
) -> None:
    hosts = [("h0", topo)]
    try:
        first = plan_cluster(parse_spec(spec), hosts)
    except DoesNotFit:
        return
    groups = [dict(g) for g in spec["nodes"]]
    g = groups[group % len(groups)]
    g["count"] = int(g["count"]) + extra
    try:
        second = plan_cluster(parse_spec({**spec, "nodes": groups}), hosts, existing=first)
    except DoesNotFit:
        return
    check_plan(second, dict(hosts), scaled=True)
    for n in first.nodes:
        kept = second.node(n.name)
        assert (kept.ip, kept.mac, kept.numa, kept.host) == (n.ip, n.mac, n.numa, n.host)
        if n.pinning == "dedicated":  # same pins; emulator threads may have moved
            assert replace(kept, emulator_cpus=n.emulator_cpus) == n
        else:
            assert set(kept.cpuset) <= set(n.cpuset)

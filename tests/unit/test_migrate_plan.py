"""Re-planning one node for a live migration (hpvc.plan.migrate): the node is
placed like a new one, keeps its guest topology, MAC and address, and is
refused in one line (exit 2) when it does not fit."""

from __future__ import annotations

from typing import Any

import pytest

from hpvc.errors import DoesNotFit, InputError
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.migrate import guest_view, moved, replan_node
from hpvc.plan.model import HostReservation, Reservations
from hpvc.spec import parse_spec
from tests.unit.invariants import check_plan
from tests.unit.topogen import make_topology


def vm_spec(pinning: str = "dedicated", count: int = 2, vcpus: int = 2, **tuning: Any) -> Any:
    t = {"pinning": pinning, "hugepages": "2M", "numa": "mirror", "partition": "hpc"} | tuning
    nodes = [{"role": "compute", "count": count, "vcpus": vcpus, "memory": "1GiB"}]
    return parse_spec({"name": "m", "kind": "vm", "tuning": t, "nodes": nodes})


TOPO = make_topology(packages=2, cores_per_node=4, threads=1, pages_2m_free=4096)


def first(spec: Any) -> Plan:
    return plan_cluster(spec, [("h", TOPO)])


def test_a_socket_is_evacuated_with_cpus() -> None:
    s = vm_spec(partition="commodity")
    p = first(s)
    old = p.node("compute0")
    socket1 = [c for pkg in TOPO.packages[1:] for c in pkg.cpus]
    assert not set(old.cpuset) & set(socket1)  # first fit: socket 0
    new = replan_node(s, p, "compute0", "h", TOPO, Reservations(), cpus=socket1)
    n = new.node("compute0")
    assert set(n.cpuset) <= set(socket1) and set(n.emulator_cpus) <= set(socket1)
    assert [c.host_node for c in n.numa] == [1]  # its memory follows to socket 1's node
    assert guest_view(n) == guest_view(old)  # the guest sees no change
    assert (n.mac, n.ip, n.name) == (old.mac, old.ip, old.name)
    # The other node keeps its vCPUs; its emulator threads leave the CPUs the
    # moved node now pins (applied live, as after a scale).
    a, b = p.node("compute1"), new.node("compute1")
    assert (b.vcpus, b.cpuset, b.numa) == (a.vcpus, a.cpuset, a.numa)
    assert set(b.emulator_cpus) == set(a.emulator_cpus) - set(n.cpuset)
    assert moved(p, new, "compute0") and moved(p, new, "compute1")
    check_plan(new, {"h": TOPO}, None)
    # Hugepages for the moved node are counted on its new NUMA node.
    assert {(g.host_node, g.count) for g in new.hosts[0].hugepages} == {(0, 512), (1, 512)}


def test_no_cpus_given_replans_on_the_same_host_and_may_land_where_it_was() -> None:
    topo = make_topology(packages=1, cores_per_node=2, threads=1, pages_2m_free=4096)
    s = vm_spec(pinning="shared", count=1, vcpus=1)
    p = plan_cluster(s, [("h", topo)])
    new = replan_node(s, p, "compute0", "h", topo, Reservations())
    assert new.node("compute0").cpuset == p.node("compute0").cpuset
    assert guest_view(new.node("compute0")) == guest_view(p.node("compute0"))


def test_other_clusters_cpus_are_never_taken() -> None:
    s = vm_spec(partition="commodity")
    p = first(s)
    socket1 = [c for pkg in TOPO.packages[1:] for c in pkg.cpus]
    held = Reservations((HostReservation("h", dedicated_cpus=frozenset(socket1[:3])),))
    with pytest.raises(DoesNotFit) as e:
        replan_node(s, p, "compute0", "h", TOPO, held, cpus=socket1)
    assert e.value.exit_code == 2
    assert "compute0 does not fit on h on CPUs" in e.value.line()


def test_too_few_cpus_is_refused_in_one_line() -> None:
    s = vm_spec()
    p = first(s)
    with pytest.raises(DoesNotFit) as e:
        replan_node(s, p, "compute0", "h", TOPO, Reservations(), cpus=[7])
    assert e.value.exit_code == 2 and "\n" not in e.value.line()


def test_cpus_the_host_does_not_have_are_bad_input() -> None:
    s = vm_spec()
    with pytest.raises(InputError, match="not CPUs hpvc may use"):
        replan_node(s, first(s), "compute0", "h", TOPO, Reservations(), cpus=[99])
    with pytest.raises(InputError, match="empty"):
        replan_node(s, first(s), "compute0", "h", TOPO, Reservations(), cpus=[])


def test_a_guest_topology_that_would_change_is_refused() -> None:
    # Two NUMA nodes of 4 CPUs each: a 6-vCPU guest spans both (two cells); on a
    # host of one 8-CPU node the same node would get one cell.
    two = make_topology(packages=1, nodes_per_package=2, cores_per_node=4, threads=1,
                        pages_2m_free=4096)  # fmt: skip
    one = make_topology(packages=1, nodes_per_package=1, cores_per_node=8, threads=1,
                        pages_2m_free=4096)  # fmt: skip
    s = vm_spec(count=1, vcpus=6)
    p = plan_cluster(s, [("h", two)])
    assert len(p.node("compute0").numa) == 2
    with pytest.raises(DoesNotFit, match="would not keep its guest topology"):
        replan_node(s, p, "compute0", "h", one, Reservations())

"""The cluster network across hosts, pure: VNIs, MTUs, and each host's view of the others."""

from __future__ import annotations

from typing import Any

import pytest

from hpvc.errors import InputError
from hpvc.plan import plan_cluster
from hpvc.plan.overlay import VXLAN_OVERHEAD, Overlay, node_mtu, vni_for
from hpvc.slurm.policy import job_hosts, share_name, share_overlay, split
from hpvc.spec import parse_spec
from hpvc.topology import read_topology

SPEC: dict[str, Any] = {
    "name": "s",
    "network": {"subnet": "10.88.40.0/24"},
    "tuning": {"pinning": "shared", "hugepages": "none", "partition": "commodity"},
    "nodes": [
        {"role": "head", "memory": "256MiB"},
        {"role": "compute", "count": 3, "vcpus": 1, "memory": "256MiB"},
    ],
}
HOSTS = ["n1", "n2", "n3"]
ADDRS = ["10.250.0.1", "10.250.0.2", "10.250.0.3"]


def test_vni_is_stable_in_range_and_spreads() -> None:
    vnis = {vni_for(f"slurm-job-{j}") for j in range(2000)}
    assert all(1 <= v < 2**24 for v in vnis) and len(vnis) == 2000
    assert vni_for("slurm-job-7") == vni_for("slurm-job-7")


def test_node_mtu_leaves_room_for_vxlan_and_refuses_with_the_numbers() -> None:
    assert node_mtu(9000, None) == 8950 and node_mtu(1500, None) == 1450
    assert node_mtu(65535, None) == 9000  # capped at the one-host default
    assert node_mtu(9000, 8950) == 8950
    with pytest.raises(InputError, match=r"fabric MTU is 9000.*at most 8950") as e:
        node_mtu(9000, 9000)
    assert e.value.fix.startswith("set network.mtu to 8950")
    assert VXLAN_OVERHEAD == 50


def test_job_hosts_expand_slurm_node_lists() -> None:
    assert job_hosts("n[1-3]") == HOSTS
    assert job_hosts("gpu[07-08],login1") == ["gpu07", "gpu08", "login1"]
    assert job_hosts("") == []


def test_each_host_sees_the_other_hosts_nodes_as_their_own_plans_make_them() -> None:
    spec = parse_spec(SPEC, "s.toml")
    shares = split(spec, 3)
    views = [share_overlay(spec, 42, i, HOSTS, ADDRS, 9000) for i in range(3)]
    assert {v.vni for v in views} == {vni_for("slurm-job-42")}
    assert [v.bridge_address for v in views] == ["10.88.40.1", "10.88.40.254", "10.88.40.253"]
    assert [v.local for v in views] == ADDRS
    assert all(v.mtu == 8950 for v in views)
    for i, view in enumerate(views):
        assert [r.address for r in view.remotes] == [a for j, a in enumerate(ADDRS) if j != i]
        assert view.peers() == ADDRS
        for r in view.remotes:
            j = HOSTS.index(r.host)
            assert [n for n, _, _ in r.nodes] == shares[j]
    assert len(views[0].arp_entries()) == sum(len(s) for s in shares[1:])


def test_remote_macs_match_the_remote_share_plan(snapshots: dict[str, Any]) -> None:
    """What host 0 believes of host 1's nodes is what host 1's own plan gives them."""
    spec = parse_spec(SPEC, "s.toml")
    topo = read_topology(snapshots["16amd64-8n2c"])
    shares = split(spec, 2)
    view = share_overlay(spec, 5, 0, HOSTS[:2], ADDRS[:2], 9000)
    part = spec.model_copy(update={"name": share_name(5, 1)})
    plan = plan_cluster(part, [("n2", topo)], only=set(shares[1]))
    assert {(n.name, n.ip, n.mac) for n in plan.nodes} == set(view.remotes[0].nodes)


def test_overlay_round_trips_through_json() -> None:
    spec = parse_spec(SPEC, "s.toml")
    o = share_overlay(spec, 9, 1, HOSTS, ADDRS, 1500)
    assert Overlay.from_json(o.to_json()) == o and o.mtu == 1450


def test_a_subnet_too_small_for_nodes_and_host_addresses_is_refused() -> None:
    small = {**SPEC, "network": {"subnet": "10.88.40.0/29"}}  # .1-.6: gateway, 4 nodes, .6
    spec = parse_spec(small, "s.toml")
    share_overlay(spec, 1, 0, HOSTS[:2], ADDRS[:2], 9000)  # .2-.5 nodes, host 1 at .6
    with pytest.raises(InputError, match="too small for 4 nodes and the addresses of 3 hosts"):
        share_overlay(spec, 1, 0, HOSTS, ADDRS, 9000)  # host 2 would be .5

"""The cluster network across an inventory's hosts, in the plan: inventory fabric keys,
VNI, VTEPs and node MTU, each host's Overlay, and ``hpvc plan --hosts``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpvc.cli import main
from hpvc.errors import InputError, SpecError
from hpvc.host.net import short_ifname
from hpvc.host.vxlan import filter_table as host_filter_table
from hpvc.host.vxlan import link_name
from hpvc.plan import Plan, host_overlay, plan_cluster
from hpvc.plan.model import plan_from_json
from hpvc.plan.network import cluster_vni, describe, filter_table, vxlan_link_name
from hpvc.plan.overlay import vni_for
from hpvc.spec import parse_spec
from hpvc.topology.inventory import Fabric, load_inventory, read_inventory
from tests.unit.invariants import check_plan
from tests.unit.topogen import make_topology

SMALL = "8em64t-2s2ca2c"
TOPO = make_topology(packages=1, cores_per_node=4, threads=1)
FABRIC = {"h0": Fabric("10.0.0.1", 9216), "h1": Fabric("10.0.0.2"), "h2": Fabric("10.0.0.3")}


def spec(count: int = 6, **network: Any) -> Any:
    return parse_spec(
        {
            "name": "t",
            "kind": "container",
            "network": {"subnet": "10.88.0.0/24", **network},
            "tuning": {"partition": "commodity", "hugepages": "none"},
            "nodes": [{"role": "compute", "count": count, "vcpus": 2, "memory": "1GiB"}],
        }
    )


def plan3(s: Any = None, fabric: dict[str, Fabric] | None = FABRIC) -> Plan:
    """Six 2-vCPU nodes over three 4-CPU hosts: two per host."""
    hosts = [(f"h{i}", TOPO) for i in range(3)]
    p = plan_cluster(s or spec(), hosts, fabric=fabric)
    check_plan(p, dict(hosts))
    return p


# --- the inventory ---------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def test_inventory_fabric_addresses_follow_each_other_in_a_group(
    snapshots: dict[str, Path], tmp_path: Path
) -> None:
    root = snapshots[SMALL]
    inv = read_inventory(
        write(
            tmp_path,
            f'[[hosts]]\nname = "a"\ncount = 3\ntopology = "{root}"\nfabric = "10.0.0.254"\n'
            f'fabric_mtu = 9216\n[[hosts]]\nname = "b"\ntopology = "{root}"\n'
            f'[[hosts]]\nname = "c"\ntopology = "{root}"\nfabric = "192.168.1.7"\n',
        )
    )
    assert [n for n, _ in inv.hosts] == ["a0", "a1", "a2", "b", "c"]
    assert dict(inv.fabric) == {
        "a0": Fabric("10.0.0.254", 9216),
        "a1": Fabric("10.0.0.255", 9216),
        "a2": Fabric("10.0.1.0", 9216),
        "c": Fabric("192.168.1.7", 9000),
    }
    assert load_inventory(tmp_path / "hosts.toml") == list(inv.hosts)


@pytest.mark.parametrize(
    ("entries", "key", "why"),
    [
        ('fabric = "10.0.0"', "hosts[0].fabric", "not a unicast IPv4 address"),
        ('fabric = "fe80::1"', "hosts[0].fabric", "not a unicast IPv4 address"),
        ("fabric = 167772161", "hosts[0].fabric", "not a unicast IPv4 address"),
        ('fabric = "224.0.0.1"', "hosts[0].fabric", "not a unicast IPv4 address"),
        ('fabric = "127.0.0.1"', "hosts[0].fabric", "not a unicast IPv4 address"),
        ('fabric = "255.255.255.254"\ncount = 2', "hosts[0].fabric", "no room for 2"),
        ("fabric_mtu = 9000", "hosts[0].fabric_mtu", "given without fabric"),
        ('fabric = "10.0.0.1"\nfabric_mtu = 1000', "hosts[0].fabric_mtu", "from 1330 to 65535"),
        ('fabric = "10.0.0.1"\nfabric_mtu = "9000"', "hosts[0].fabric_mtu", "want an integer"),
        ('fabric = "10.0.0.1"\nfabric_mtu = true', "hosts[0].fabric_mtu", "want an integer"),
        ('fabric = "10.0.0.1"\nfabrik = "x"', "hosts[0].fabrik", "unknown key"),
    ],
)
def test_inventory_fabric_errors_name_file_and_key(
    tmp_path: Path, entries: str, key: str, why: str
) -> None:
    path = write(tmp_path, f'[[hosts]]\nname = "a"\ntopology = "/nonexistent"\n{entries}\n')
    with pytest.raises(SpecError) as e:
        read_inventory(path)
    assert e.value.key == key and e.value.path == str(path)
    assert why in e.value.why


def test_the_example_inventory_gives_every_host_a_fabric_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hpvc.topology import inventory

    monkeypatch.setattr(inventory, "_read", lambda root: TOPO)  # the snapshots need not exist
    inv = read_inventory(Path(__file__).parents[2] / "examples" / "hosts.toml")
    assert [inv.fabric[n].address for n, _ in inv.hosts] == [
        "10.0.0.1",
        "10.0.0.2",
        "10.0.0.3",
        "10.0.0.4",
        "10.0.1.1",
        "10.0.1.2",
    ]
    assert {f.mtu for f in inv.fabric.values()} == {9000}


def test_inventory_fabric_addresses_must_not_repeat_across_groups(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[[hosts]]\nname = "a"\ncount = 4\nfabric = "10.0.0.1"\n'
        '[[hosts]]\nname = "b"\nfabric = "10.0.0.3"\n',
    )
    with pytest.raises(SpecError) as e:
        read_inventory(path)
    assert e.value.key == "hosts[1].fabric"
    assert "10.0.0.3 (host b) is also the fabric address of host a2" in e.value.why


# --- the plan --------------------------------------------------------------------------


def test_a_cluster_across_hosts_gets_vni_vteps_and_the_fabric_mtu() -> None:
    p = plan3()
    net = p.network
    assert [h.name for h in p.hosts] == ["h0", "h1", "h2"]
    assert net.vni == cluster_vni("t") == vni_for("cluster-t")
    assert net.vteps == (("h0", "10.0.0.1"), ("h1", "10.0.0.2"), ("h2", "10.0.0.3"))
    assert net.fabric_mtu == 9000 and net.mtu == 8950  # the smallest fabric MTU - 50
    assert net.gateway == "10.88.0.1" and net.bridge == "hpvc-t"
    assert not p.notes
    assert plan3() == p  # deterministic


def test_only_the_hosts_the_plan_uses_count() -> None:
    fabric = {**FABRIC, "h1": Fabric("10.0.0.2", 9216)}  # h2 keeps 9000
    p = plan3(spec(count=4), fabric)  # two hosts used: h2 has no node
    assert [h for h, _ in p.network.vteps] == ["h0", "h1"]
    assert p.network.fabric_mtu == 9216 and p.network.mtu == 9000  # capped at the default
    assert plan3(spec(count=4)).network.fabric_mtu == 9000  # h1's


def test_a_spec_mtu_that_fits_is_kept_one_that_does_not_is_refused_with_the_numbers() -> None:
    assert plan3(spec(mtu=1500)).network.mtu == 1500
    with pytest.raises(InputError) as e:
        plan3(spec(mtu=9000))
    assert e.value.line() == (
        "network.mtu = 9000: the hosts' fabric MTU is 9000, and VXLAN takes 50 bytes of it:"
        " nodes can have at most 8950 (set network.mtu to 8950 or less, or leave it out)"
    )


def test_one_host_plans_are_unchanged() -> None:
    s = spec(count=2)
    plain = plan_cluster(s, [("h0", TOPO)])
    assert plan_cluster(s, [("h0", TOPO), ("h1", TOPO)], fabric=FABRIC) == plain
    assert plain.network.vni is None and plain.network.vteps == ()
    assert plain.network.mtu == 9000
    assert set(plain.to_json()["network"]) == {"subnet", "gateway", "prefixlen", "mtu", "bridge"}
    assert host_overlay(plain, "h0") is None and describe(plain.network) is None


def test_hosts_without_fabric_addresses_get_a_note_and_no_network() -> None:
    p = plan3(fabric=None)
    assert p.network.vni is None and p.network.mtu == 9000
    assert p.notes == (
        "the cluster spans 3 hosts (h0, h1, h2) but none of them has a fabric address: it has"
        " no cluster network across them, and nodes on different hosts cannot reach each other"
        ' (give each [[hosts]] entry fabric = "ADDRESS")',
    )
    partly = plan3(fabric={"h0": FABRIC["h0"]})
    assert partly.network.vni is None
    assert "but h1, h2 have no fabric address" in partly.notes[0]


def test_the_subnet_must_leave_room_for_the_hosts_bridge_addresses() -> None:
    # A /29 holds .2-.6 for nodes; host 1's bridge takes .6, host 2's .5.
    s = spec(count=4, subnet="10.88.0.0/29")
    hosts = [(f"h{i}", TOPO) for i in range(2)]
    assert plan_cluster(s, hosts, fabric=FABRIC).network.vni is not None  # nodes .2-.5
    s5 = parse_spec(
        {
            "name": "t",
            "network": {"subnet": "10.88.0.0/29"},
            "tuning": {"partition": "commodity", "hugepages": "none"},
            "nodes": [
                {"role": "compute", "count": 4, "vcpus": 2, "memory": "1GiB"},
                {"role": "storage", "vcpus": 4, "memory": "1GiB"},
            ],
        }
    )
    with pytest.raises(InputError, match=r"network.subnet = 10.88.0.0/29: too small"):
        plan_cluster(s5, [(f"h{i}", TOPO) for i in range(3)], fabric=FABRIC)


def test_plan_json_round_trips_with_and_without_the_network_across_hosts() -> None:
    p = plan3()
    j = p.to_json()
    assert j["network"]["vni"] == p.network.vni and j["network"]["fabric_mtu"] == 9000
    assert j["network"]["vteps"][0] == {"host": "h0", "address": "10.0.0.1"}
    assert plan_from_json(json.loads(json.dumps(j))) == p
    old = plan3(fabric=None).to_json()  # a plan.json written before these keys existed
    assert "vni" not in old["network"]
    assert plan_from_json(old).network.vteps == ()


def test_each_host_overlay_sees_the_other_hosts_nodes() -> None:
    p = plan3()
    views = {h: host_overlay(p, h) for h, _ in p.network.vteps}
    addrs = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    for i, (host, view) in enumerate(views.items()):
        assert view is not None
        assert view.vni == p.network.vni and view.mtu == 8950
        assert view.local == addrs[i] and view.peers() == addrs
        assert [r.host for r in view.remotes] == [h for h in views if h != host]
        remote = {(n.name, n.ip, n.mac) for n in p.nodes if n.host != host}
        assert {node for r in view.remotes for node in r.nodes} == remote
        assert sorted(view.arp_entries()) == sorted((ip, mac) for _, ip, mac in remote)
    assert [v.bridge_address for v in views.values() if v] == [
        "10.88.0.1",  # the gateway, on the first host only
        "10.88.0.254",
        "10.88.0.253",
    ]
    with pytest.raises(KeyError):
        host_overlay(p, "elsewhere")


def test_names_match_what_the_host_side_uses() -> None:
    for cluster in ("t", "demo", "a-very-long-cluster-name"):
        assert vxlan_link_name(cluster) == link_name(cluster) == short_ifname("vx", cluster)
        assert len(vxlan_link_name(cluster)) == 15
    assert filter_table(123) == host_filter_table(123) == "hpvc-vni123"


def test_describe_says_vni_vteps_and_mtu() -> None:
    p = plan3()
    assert describe(p.network) == (
        f"network across hosts: VXLAN VNI {p.network.vni}, VTEPs h0 10.0.0.1, h1 10.0.0.2,"
        " h2 10.0.0.3, node MTU 8950 (fabric 9000 - 50)"
    )
    line = describe(plan3(spec(mtu=1500)).network)
    assert line is not None and line.endswith("node MTU 1500 (fabric 9000 - 50 leaves 8950)")


# --- hpvc plan --hosts -----------------------------------------------------------------

WIDE = """name = "wide"
kind = "container"
{network}
[tuning]
hugepages = "none"
partition = "commodity"
[[nodes]]
role = "compute"
count = 3
vcpus = 8
memory = "1GiB"
"""


def cli_files(snapshots: dict[str, Path], tmp_path: Path, network: str = "") -> list[str]:
    spec_path = tmp_path / "wide.toml"
    spec_path.write_text(WIDE.format(network=network))
    inv = write(
        tmp_path,
        f'[[hosts]]\nname = "x"\ncount = 3\ntopology = "{snapshots[SMALL]}"\nfabric = "10.0.0.1"\n',
    )
    return ["plan", str(spec_path), "--hosts", str(inv)]


def test_cli_plan_shows_the_network_across_hosts(
    snapshots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = cli_files(snapshots, tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    vni = vni_for("cluster-wide")
    assert (
        f"network across hosts: VXLAN VNI {vni}, VTEPs x0 10.0.0.1, x1 10.0.0.2, x2 10.0.0.3,"
        " node MTU 8950 (fabric 9000 - 50)"
    ) in " ".join(out.split())
    with pytest.raises(SystemExit) as e:
        main([*argv, "--json"])
    assert e.value.code == 0
    net = json.loads(capsys.readouterr().out)["network"]
    assert net["vni"] == vni and net["mtu"] == 8950 and net["fabric_mtu"] == 9000
    assert [v["host"] for v in net["vteps"]] == ["x0", "x1", "x2"]


def test_cli_plan_refuses_a_spec_mtu_the_fabric_cannot_carry(
    snapshots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(cli_files(snapshots, tmp_path, "[network]\nmtu = 9000"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hpvc: network.mtu = 9000: the hosts' fabric MTU is 9000")
    assert err.count("\n") == 1 and "Traceback" not in err

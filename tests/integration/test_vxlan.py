"""The cluster network across hosts (hpvc.host.vxlan) between two hosts that are apart.

Two "hosts" are network namespaces on a private fabric bridge (itself in a
namespace of its own, MTU 9000); each gets a cluster bridge joined by VXLAN,
and one node (a namespace with a veth on the bridge, static ARP). The node on
host A must reach the node on host B over the cluster subnet; the forwarding
entries are the static ones hpvc wrote; a VXLAN packet into the VNI from an
address outside the cluster's hosts is dropped (the filter's counter moves,
the node never sees it) while one from the peer host is not; the journals
undo everything. All traffic stays inside namespaces this test made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.plan.overlay import VXLAN_OVERHEAD, Overlay, Vtep, vni_for
from tests.helpers import ROOT, requires

FABRIC_MTU = 9000
SUBNET = "10.252.7"  # fabric
CLUSTER = "10.97.3"  # the virtual cluster's subnet


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def in_ns(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh("nsenter", f"--net=/run/netns/{ns}", *argv, check=check)


def py_in(ns: str, code: str, *args: str) -> str:
    r = subprocess.run(
        ["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def fabric() -> Iterator[dict[str, str]]:
    requires("root", "ip", "nft", "ping")
    tag = f"{os.getpid() % 100000}"
    names = {"fab": f"hvt-fab{tag}", "a": f"hvt-a{tag}", "b": f"hvt-b{tag}", "x": f"hvt-x{tag}"}
    made: list[str] = []
    try:
        for ns in names.values():
            sh("ip", "netns", "add", ns)
            made.append(ns)
            in_ns(ns, "ip", "link", "set", "lo", "up")
        fab = names["fab"]
        in_ns(fab, "ip", "link", "add", "br0", "mtu", str(FABRIC_MTU), "type", "bridge")
        in_ns(fab, "ip", "link", "set", "br0", "up")
        for i, key in ((1, "a"), (2, "b"), (99, "x")):
            in_ns(fab, "ip", "link", "add", f"p{key}", "mtu", str(FABRIC_MTU), "type", "veth",
                  "peer", "name", "eth0", "netns", names[key])  # fmt: skip
            in_ns(fab, "ip", "link", "set", f"p{key}", "master", "br0", "up")
            in_ns(names[key], "ip", "link", "set", "eth0", "mtu", str(FABRIC_MTU), "up")
            in_ns(names[key], "ip", "addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0")
        yield names
    finally:
        for ns in reversed(made):
            sh("ip", "netns", "del", ns, check=False)


JOIN = """
import json, sys
from hpvc.host import net, vxlan
from hpvc.host.journal import Journal
from hpvc.plan.overlay import Overlay
o = Overlay.from_json(json.loads(sys.argv[1]))
j = Journal(sys.argv[2])
net.ensure_bridge(j, "hvtbr", sys.argv[3], 24, o.mtu)
vxlan.join(j, "vxtest", "hvtbr", o)
net.create_netns(j, sys.argv[4])
net.add_node_link(j, bridge="hvtbr", netns=sys.argv[4], host_ifname=sys.argv[5], mtu=o.mtu,
                  address=sys.argv[6], prefixlen=24, mac=sys.argv[7], gateway=sys.argv[3])
net.set_static_neighbors(sys.argv[4], [(sys.argv[8], sys.argv[9])])
print(vxlan.link_name("vxtest"))
"""


def overlay(local: str, remote: str, node: tuple[str, str, str], vni: int) -> Overlay:
    return Overlay(
        vni=vni,
        local=local,
        remotes=(Vtep("peer", remote, (node,)),),
        mtu=FABRIC_MTU - VXLAN_OVERHEAD,
    )


def vxlan_packet(vni: int) -> str:
    """Python that sends one VXLAN frame for ``vni`` (to a broadcast MAC) to argv[1]."""
    return (
        "import socket, sys\n"
        f"hdr = bytes([8, 0, 0, 0]) + ({vni} << 8).to_bytes(4, 'big')\n"
        "frame = b'\\xff' * 6 + b'\\x02' + b'\\x00' * 5 + b'\\x08\\x06' + b'\\x00' * 28\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.sendto(hdr + frame, (sys.argv[1], 4789))\n"
    )


def test_nodes_on_two_hosts_share_one_network(fabric: dict[str, str], tmp_path: Path) -> None:
    tag = fabric["a"].removeprefix("hvt-a")
    vni = vni_for(f"test-{tag}")
    node_a = (f"hvtn-a{tag}", f"{CLUSTER}.2", "02:aa:00:00:00:02")
    node_b = (f"hvtn-b{tag}", f"{CLUSTER}.3", "02:aa:00:00:00:03")
    journals = {k: tmp_path / f"{k}.jsonl" for k in ("a", "b")}
    try:
        for key, me, other, gw in (("a", node_a, node_b, 1), ("b", node_b, node_a, 254)):
            local = f"{SUBNET}.{1 if key == 'a' else 2}"
            remote = f"{SUBNET}.{2 if key == 'a' else 1}"
            o = overlay(local, remote, ("peer", other[1], other[2]), vni)
            vx = py_in(
                fabric[key],
                JOIN,
                json.dumps(o.to_json()),
                str(journals[key]),
                f"{CLUSTER}.{gw}",
                me[0],
                f"hc{tag}{key}",
                me[1],
                me[2],
                other[1],
                other[2],
            )
        # Static forwarding, no learning, on each host.
        link = in_ns(fabric["a"], "ip", "-d", "-j", "link", "show", vx).stdout
        data = json.loads(link)[0]["linkinfo"]["info_data"]
        assert data["id"] == vni and data["learning"] is False
        fdb = in_ns(fabric["a"], "bridge", "-j", "fdb", "show", "dev", vx).stdout
        entries = {(e["mac"], e.get("dst")) for e in json.loads(fdb) if e.get("dst")}
        assert (node_b[2], f"{SUBNET}.2") in entries
        assert ("00:00:00:00:00:00", f"{SUBNET}.2") in entries
        # Node to node across hosts, by the cluster subnet.
        ping = sh("nsenter", f"--net=/run/netns/{node_a[0]}", "ping", "-c", "2", "-W", "2",
                  node_b[1], check=False)  # fmt: skip
        assert ping.returncode == 0, ping.stdout + ping.stderr
        size = str(FABRIC_MTU - VXLAN_OVERHEAD - 28)  # ICMP payload of a full node frame
        mtu = sh("nsenter", f"--net=/run/netns/{node_a[0]}", "ping", "-c", "1", "-W", "2",
                 "-M", "do", "-s", size, node_b[1], check=False)  # fmt: skip
        assert mtu.returncode == 0, "a full-size node frame must cross the fabric unfragmented"
        # Only the cluster's hosts may inject into its VNI.
        count = f"from hpvc.host import vxlan; print(vxlan.dropped({vni}))"
        before = int(py_in(fabric["a"], count))
        in_ns(fabric["x"], sys.executable, "-c", vxlan_packet(vni), f"{SUBNET}.1")
        in_ns(fabric["x"], sys.executable, "-c", vxlan_packet(vni), f"{SUBNET}.1")
        assert int(py_in(fabric["a"], count)) == before + 2
        in_ns(fabric["b"], sys.executable, "-c", vxlan_packet(vni), f"{SUBNET}.1")
        assert int(py_in(fabric["a"], count)) == before + 2  # the peer host is let through
    finally:
        undo = (
            "import sys; from hpvc.host.journal import Journal;"
            " print(Journal(sys.argv[1]).undo_all())"
        )
        for key in ("a", "b"):
            if journals[key].exists():
                r = in_ns(fabric[key], sys.executable, "-c", undo, str(journals[key]), check=False)
                assert r.stdout.strip() == "[]", r.stderr
    for key in ("a", "b"):
        links = in_ns(fabric[key], "ip", "-o", "link").stdout
        assert "vx" not in links and "hvtbr" not in links
        tables = in_ns(fabric[key], "nft", "list", "tables").stdout
        assert f"hpvc-vni{vni}" not in tables
    assert not Path(f"/run/netns/{node_a[0]}").exists()

"""The cluster network across hosts (hpvc.host.vxlan) between two hosts that are apart.

Two "hosts" are network namespaces on a private fabric bridge (itself in a
namespace of its own, MTU 9000), made by ``hpvc.testbed.pair``: each gets a
cluster bridge joined by VXLAN, and one node (a namespace with a veth on the
bridge, static ARP). The node on host A must reach the node on host B over
the cluster subnet; the forwarding entries are the static ones hpvc wrote, and
the bridge sends frames to a remote node to the VXLAN port only (not flooded
to its other ports); a
VXLAN packet into the VNI from an address outside the cluster's hosts is
dropped (the filter's counter moves, the node never sees it) while one from
the peer host is not; the journals undo everything. All traffic stays inside
namespaces the test bed made.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hpvc.plan.overlay import VXLAN_OVERHEAD
from hpvc.testbed import pair as testbed
from hpvc.testbed.pair import Testbed
from tests.helpers import requires


def py_in(bed: Testbed, ns: str, code: str, *args: str) -> str:
    r = bed.run(ns, sys.executable, "-c", code, *args, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def vxlan_packet(vni: int) -> str:
    """Python that sends one VXLAN frame for ``vni`` (to a broadcast MAC) to argv[1]."""
    return (
        "import socket, sys\n"
        f"hdr = bytes([8, 0, 0, 0]) + ({vni} << 8).to_bytes(4, 'big')\n"
        "frame = b'\\xff' * 6 + b'\\x02' + b'\\x00' * 5 + b'\\x08\\x06' + b'\\x00' * 28\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.sendto(hdr + frame, (sys.argv[1], 4789))\n"
    )


def check_forwarding(bed: Testbed) -> None:
    """Static forwarding, no learning, on each host."""
    a, b = bed.hosts
    link = bed.run(a.netns, "ip", "-d", "-j", "link", "show", bed.vxlan_link).stdout
    data = json.loads(link)[0]["linkinfo"]["info_data"]
    assert data["id"] == bed.vni and data["learning"] is False
    fdb = bed.run(a.netns, "bridge", "-j", "fdb", "show", "dev", bed.vxlan_link).stdout
    entries = {(e["mac"], e.get("dst")) for e in json.loads(fdb) if e.get("dst")}
    assert (b.node_mac, b.address) in entries
    assert ("00:00:00:00:00:00", b.address) in entries


def tx_packets(bed: Testbed, ns: str, ifname: str) -> int:
    link = json.loads(bed.run(ns, "ip", "-s", "-j", "link", "show", "dev", ifname).stdout)[0]
    return int(link["stats64"]["tx"]["packets"])


def check_no_flooding(bed: Testbed) -> None:
    """Frames to a remote node go to the VXLAN port only, not to every port of the bridge."""
    a, b = bed.hosts
    static = f"from hpvc.host import vxlan; print(vxlan.bridge_entries({bed.vxlan_link!r}))"
    assert py_in(bed, a.netns, static) == str([b.node_mac])
    # Another port on host A's bridge (as a second local node's veth would be).
    port, peer = f"hvp{bed.tag}", f"hvq{bed.tag}"
    bed.run(a.netns, "ip", "link", "add", port, "type", "veth", "peer", "name", peer)
    try:
        for cmd in (["master", bed.bridge, "up"], ["up"]):
            bed.run(a.netns, "ip", "link", "set", port if "master" in cmd else peer, *cmd)
        before = tx_packets(bed, a.netns, port)
        ping = bed.run(a.node_netns, "ping", "-q", "-c", "50", "-i", "0.002", "-W", "2",
                       b.node_address, check=False)  # fmt: skip
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert tx_packets(bed, a.netns, port) - before < 10, "frames to a remote node flooded"
    finally:
        bed.run(a.netns, "ip", "link", "del", port, check=False)


def check_node_to_node(bed: Testbed) -> None:
    """Node to node across hosts, by the cluster subnet, full-size frames unfragmented."""
    a, b = bed.hosts
    ping = bed.run(a.node_netns, "ping", "-c", "2", "-W", "2", b.node_address, check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert bed.node_mtu == bed.fabric_mtu - VXLAN_OVERHEAD
    size = str(bed.node_mtu - 28)  # ICMP payload of a full node frame
    mtu = bed.run(a.node_netns, "ping", "-c", "1", "-W", "2", "-M", "do", "-s", size,
                  b.node_address, check=False)  # fmt: skip
    assert mtu.returncode == 0, "a full-size node frame must cross the fabric unfragmented"


def check_filter(bed: Testbed) -> None:
    """Only the cluster's hosts may inject into its VNI."""
    a, b = bed.hosts
    count = f"from hpvc.host import vxlan; print(vxlan.dropped({bed.vni}))"
    before = int(py_in(bed, a.netns, count))
    for _ in range(2):
        bed.run(bed.outsider_netns, sys.executable, "-c", vxlan_packet(bed.vni), a.address)
    assert int(py_in(bed, a.netns, count)) == before + 2
    bed.run(b.netns, sys.executable, "-c", vxlan_packet(bed.vni), a.address)
    assert int(py_in(bed, a.netns, count)) == before + 2  # the peer host is let through


def check_model_of_two_machines(bed: Testbed, cpus: tuple[int, int]) -> None:
    """Each host receives on its own CPU; bridged frames skip the IP firewall hooks."""
    for h, cpu in zip(bed.hosts, cpus, strict=True):
        assert testbed.rx_masks(bed, h.netns, testbed.FABRIC_IFNAME) == [1 << cpu]
    knobs = bed.bridge_netfilter_state()
    assert set(knobs) == {bed.fabric_netns, *(h.netns for h in bed.hosts)}
    assert all(v == 0 for k in knobs.values() for v in k.values()), knobs


def test_nodes_on_two_hosts_share_one_network() -> None:
    requires("root", "ip", "nft", "ping")
    mine = sorted(os.sched_getaffinity(0))
    cpus = (mine[0], mine[-1])
    with testbed.two_hosts(outsider=True, rx_cpus=cpus) as bed:
        check_model_of_two_machines(bed, cpus)
        check_forwarding(bed)
        check_node_to_node(bed)
        check_no_flooding(bed)
        check_filter(bed)
        # hpvc's journals undo what it made inside each host.
        assert bed.undo_hosts() == []
        for h in bed.hosts:
            links = bed.run(h.netns, "ip", "-o", "link").stdout
            assert "vx" not in links and bed.bridge not in links
            tables = bed.run(h.netns, "nft", "list", "tables").stdout
            assert f"hpvc-vni{bed.vni}" not in tables
    for ns in bed.all_netns:
        assert not Path(f"/run/netns/{ns}").exists()
    assert not Path(bed.workdir).exists()

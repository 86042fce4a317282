"""The cluster network on the real kernel: bridge, namespaces, veths, static ARP, undo.

Every test builds its own bridge and namespaces with names unique to this
process and test, sends traffic only between its own namespaces (on a 10.213.x
subnet), and its fixture undoes the journal and checks that nothing is left,
removing leftovers of its own names even when undo is broken.

The echo requests are sent from a raw ICMP socket opened inside the namespace
(pyroute2 joins it by path), with "don't fragment" set like ``ping -M do``, so
the tests need no ``ping`` binary.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyroute2 import IPRoute
from pyroute2 import netns as pr_netns

from hpvc.errors import HpvcError
from hpvc.host import net
from hpvc.host.journal import Journal
from tests.helpers import requires

pytestmark = pytest.mark.integration

PID = os.getpid()
IP_MTU_DISCOVER = 10  # <linux/in.h>
IP_PMTUDISC_DO = 2
PREFIXLEN = 24


class Net:
    """Unique names for one test, the journal, and the check that all is gone."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.journal = Journal(path)
        self.tag = net.short_ifname("t", str(PID), label)[1:9]
        self.links: list[str] = []
        self.namespaces: list[str] = []

    def ip(self, host: int) -> str:
        return f"10.213.{PID % 250}.{host}"

    def mac(self, host: int) -> str:
        return f"52:54:00:d5:{PID % 250:02x}:{host:02x}"

    def bridge_name(self) -> str:
        name = net.short_ifname("hctb", self.tag, str(len(self.links)))
        self.links.append(name)
        return name

    def veth_name(self) -> str:
        name = net.short_ifname("hc", self.tag, str(len(self.links)))
        self.links.append(name)
        return name

    def netns_name(self) -> str:
        name = f"hpvc-test-{self.tag}-{len(self.namespaces)}"
        self.namespaces.append(name)
        return name

    def leftovers(self) -> list[str]:
        left = [n for n in self.links if _link_exists(n)]
        return left + [n for n in self.namespaces if os.path.lexists(net.netns_path(n))]

    def force_remove(self) -> None:
        """Last resort after a failed undo: remove what is left of *our* names only."""
        for name in self.links:
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
        for name in self.namespaces:
            if os.path.lexists(net.netns_path(name)):
                pr_netns.remove(net.netns_path(name))


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


@pytest.fixture
def cn(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Net]:
    requires("root", "ip")
    n = Net(tmp_path / "journal.jsonl", request.node.name)
    try:
        yield n
    finally:
        errors = Journal(n.path).undo_all()
        left = n.leftovers()
        if left:
            n.force_remove()
        assert errors == []
        assert left == []
        assert not n.path.exists()


def build(cn: Net, nodes: int, mtu: int = 9000) -> tuple[str, list[str]]:
    """A bridge (gateway .1) and ``nodes`` namespaces (.2, .3, ...) with static ARP."""
    bridge = cn.bridge_name()
    net.ensure_bridge(cn.journal, bridge, cn.ip(1), PREFIXLEN, mtu)
    namespaces = []
    for i in range(nodes):
        ns = cn.netns_name()
        net.create_netns(cn.journal, ns)
        net.add_node_link(
            cn.journal,
            bridge=bridge,
            netns=ns,
            host_ifname=cn.veth_name(),
            mtu=mtu,
            address=cn.ip(2 + i),
            prefixlen=PREFIXLEN,
            mac=cn.mac(2 + i),
            gateway=cn.ip(1),
        )
        namespaces.append(ns)
    arp = [(cn.ip(2 + i), cn.mac(2 + i)) for i in range(nodes)]
    for ns in namespaces:
        net.set_static_neighbors(ns, arp)
    return bridge, namespaces


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def _request(ident: int, seq: int, payload: int) -> bytes:
    body = bytes(i & 0xFF for i in range(payload))
    header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    return struct.pack("!BBHHH", 8, 0, _checksum(header + body), ident, seq) + body


def _is_reply(packet: bytes, ident: int, seq: int) -> bool:
    icmp = packet[(packet[0] & 0x0F) * 4 :]
    kind, _, _, rid, rseq = struct.unpack("!BBHHH", icmp[:8])
    return kind == 0 and (rid, rseq) == (ident, seq)


def _wait_reply(sock: socket.socket, dst: str, ident: int, seq: int) -> bool:
    deadline = time.monotonic() + 1.0
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            packet, (src, _) = sock.recvfrom(65535)
        except TimeoutError:
            return False
        if src == dst and _is_reply(packet, ident, seq):
            return True
    return False


def echo(ns: str, dst: str, payload: int = 56, count: int = 2) -> int:
    """Like ``ping -M do -c COUNT -W 1 -s PAYLOAD`` from inside ``ns``: replies received."""
    sock = pr_netns.create_socket(
        net.netns_path(ns), socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, flags=0
    )
    with sock:
        sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        ident = PID & 0xFFFF
        got = 0
        for seq in range(count):
            sock.sendto(_request(ident, seq, payload), (dst, 0))
            got += _wait_reply(sock, dst, ident, seq)
        return got


def _host_link(ipr: IPRoute, name: str) -> Any:
    return ipr.link("get", index=ipr.link_lookup(ifname=name)[0])[0]


def test_ping_between_namespaces_over_the_bridge(cn: Net) -> None:
    _, (ns0, ns1) = build(cn, 2)
    assert echo(ns0, cn.ip(3)) == 2
    assert echo(ns1, cn.ip(2)) == 2


def test_jumbo_frames_pass_unfragmented_and_larger_ones_are_refused(cn: Net) -> None:
    _, (ns0, ns1) = build(cn, 2, mtu=9000)
    assert echo(ns0, cn.ip(3), payload=9000 - 28) == 2  # 20 IP + 8 ICMP: a 9000-byte frame
    assert echo(ns1, cn.ip(2), payload=9000 - 28) == 2
    with pytest.raises(OSError) as e:
        echo(ns0, cn.ip(3), payload=9000 - 27)
    assert e.value.errno == errno.EMSGSIZE


def test_read_link_reports_what_the_kernel_has(cn: Net) -> None:
    _, (ns0, *_) = build(cn, 3)
    info = net.read_link(ns0)
    assert info["ifname"] == "eth0"
    assert (info["address"], info["prefixlen"]) == (cn.ip(2), PREFIXLEN)
    assert info["mac"] == cn.mac(2)
    assert info["mtu"] == 9000
    assert info["operstate"] in ("UP", "UNKNOWN")
    assert info["neighbors"] == [
        {"ip": cn.ip(3), "mac": cn.mac(3)},
        {"ip": cn.ip(4), "mac": cn.mac(4)},
    ]
    with IPRoute(netns=net.netns_path(ns0), flags=0) as ipr:
        eth0 = ipr.link_lookup(ifname="eth0")[0]
        assert list(ipr.addr("dump", index=eth0, family=socket.AF_INET6)) == []  # IPv6 off


def test_host_side_bridge_and_veth_ends(cn: Net) -> None:
    bridge, _ = build(cn, 1)
    host_end = cn.links[1]
    with IPRoute() as ipr:
        br = _host_link(ipr, bridge)
        end = _host_link(ipr, host_end)
        addrs = [a.get("IFA_LOCAL") for a in ipr.addr("dump", index=br["index"])]
    assert br.get("IFLA_MTU") == 9000 and end.get("IFLA_MTU") == 9000
    assert end.get("IFLA_MASTER") == br["index"]
    assert addrs == [cn.ip(1)]  # IPv6 is off: no link-local address either
    assert Path(f"/proc/sys/net/ipv6/conf/{host_end}/disable_ipv6").read_text().strip() == "1"


def test_undo_all_removes_everything_and_is_idempotent(cn: Net) -> None:
    build(cn, 2)
    kinds = [c.kind for c in cn.journal.entries()]
    assert kinds == ["bridge", "netns", "veth", "netns", "veth"]
    assert cn.leftovers() == cn.links + cn.namespaces
    assert cn.journal.undo_all() == []
    assert cn.leftovers() == []
    assert cn.journal.undo_all() == []
    assert Journal(cn.path).undo_all() == []


def test_crash_half_way_is_undone_by_a_fresh_journal(cn: Net) -> None:
    bridge = cn.bridge_name()
    net.ensure_bridge(cn.journal, bridge, cn.ip(1), PREFIXLEN, 9000)
    ns0, ns1 = cn.netns_name(), cn.netns_name()
    net.create_netns(cn.journal, ns0)
    args = dict(bridge=bridge, mtu=9000, prefixlen=PREFIXLEN, gateway=cn.ip(1))
    net.add_node_link(
        cn.journal, netns=ns0, host_ifname=cn.veth_name(), address=cn.ip(2), mac=cn.mac(2), **args
    )
    # The CLI dies between writing down the next changes and making them.
    cn.journal.record("netns", name=ns1)
    cn.journal.record("veth", ifname=cn.veth_name(), netns=ns1)
    cn.journal.record("bridge", name=cn.bridge_name())
    assert cn.leftovers() == [bridge, cn.links[1], ns0]
    assert Journal(cn.path).undo_all() == []
    assert cn.leftovers() == []


def test_second_ensure_bridge_adopts_without_a_new_record(cn: Net) -> None:
    bridge = cn.bridge_name()
    net.ensure_bridge(cn.journal, bridge, cn.ip(1), PREFIXLEN, 9000)
    net.ensure_bridge(cn.journal, bridge, cn.ip(1), PREFIXLEN, 9000)
    assert [c.kind for c in cn.journal.entries()] == ["bridge"]
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=bridge)[0]
        assert [a.get("IFA_LOCAL") for a in ipr.addr("dump", index=index)] == [cn.ip(1)]


def test_mtu_65520_on_the_bridge_and_through_to_a_node(cn: Net) -> None:
    _, (ns0, _) = build(cn, 2, mtu=65520)
    with IPRoute() as ipr:
        assert _host_link(ipr, cn.links[0]).get("IFLA_MTU") == 65520
    assert net.read_link(ns0)["mtu"] == 65520
    assert echo(ns0, cn.ip(3), payload=65520 - 28, count=1) == 1


def test_errors_name_the_interface_and_record_nothing(cn: Net) -> None:
    ns = cn.netns_name()
    net.create_netns(cn.journal, ns)
    with pytest.raises(HpvcError, match=f"network namespace {ns}: .*already exists"):
        net.create_netns(cn.journal, ns)
    missing = cn.bridge_name()
    veth = cn.veth_name()
    with pytest.raises(HpvcError, match=f"veth {veth}: no interface {missing}"):
        net.add_node_link(
            cn.journal,
            bridge=missing,
            netns=ns,
            host_ifname=veth,
            mtu=1500,
            address=cn.ip(2),
            prefixlen=PREFIXLEN,
            mac=cn.mac(2),
            gateway=cn.ip(1),
        )
    with pytest.raises(HpvcError, match="does not exist"):
        net.read_link(f"hpvc-test-{cn.tag}-absent")
    with pytest.raises(HpvcError, match="eth0 in"):
        net.read_link(ns)  # a namespace without a node link
    assert [c.kind for c in cn.journal.entries()] == ["netns"]

"""hpvc.host.linkinfo.parse: iproute2's JSON (as ``ip -json`` 6.1 prints it) to LinkInfo.

The read itself (nsenter + ip in a real namespace) is checked against the
kernel by tests/integration/test_net.py::test_read_link_reports_what_the_kernel_has.
"""

from __future__ import annotations

from typing import Any

from hpvc.host import linkinfo, net

LINK = [{"ifindex": 2, "link_index": 6486, "ifname": "eth0",
         "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "mtu": 9000,
         "qdisc": "noqueue", "operstate": "UP", "group": "default", "txqlen": 1000,
         "link_type": "ether", "address": "02:4b:0a:e7:4d:02",
         "broadcast": "ff:ff:ff:ff:ff:ff", "link_netnsid": 0,
         "addr_info": [{"family": "inet", "local": "10.231.77.2", "prefixlen": 24,
                        "scope": "global", "label": "eth0"}]}]  # fmt: skip
NEIGH = [
    {"dst": "10.231.77.4", "dev": "eth0", "lladdr": "02:4b:0a:e7:4d:04", "state": ["PERMANENT"]},
    {"dst": "10.231.77.3", "dev": "eth0", "lladdr": "02:4b:0a:e7:4d:03", "state": ["PERMANENT"]},
    {"dst": "10.231.77.1", "dev": "eth0", "lladdr": "02:00:00:00:00:01", "state": ["REACHABLE"]},
    {"dst": "fe80::1", "dev": "eth0", "lladdr": "02:00:00:00:00:01", "state": ["PERMANENT"]},
]


def test_the_link_its_ipv4_address_and_its_permanent_arp_entries_in_address_order() -> None:
    assert linkinfo.parse("eth0", LINK, NEIGH) == {
        "ifname": "eth0",
        "address": "10.231.77.2",
        "prefixlen": 24,
        "mac": "02:4b:0a:e7:4d:02",
        "mtu": 9000,
        "operstate": "UP",
        "neighbors": [
            {"ip": "10.231.77.3", "mac": "02:4b:0a:e7:4d:03"},
            {"ip": "10.231.77.4", "mac": "02:4b:0a:e7:4d:04"},
        ],
    }


def test_a_link_without_an_ipv4_address_says_none() -> None:
    six: dict[str, Any] = {**LINK[0], "addr_info": [{"family": "inet6", "local": "fe80::2",
                                                      "prefixlen": 64}]}  # fmt: skip
    got = linkinfo.parse("eth0", [six], [])
    assert (got["address"], got["prefixlen"], got["neighbors"]) == (None, None, [])


def test_net_keeps_its_names_for_the_read() -> None:
    assert net.read_link is linkinfo.read_link and net.netns_path("x") == "/run/netns/x"
    assert net.netns_path("/proc/1/ns/net") == "/proc/1/ns/net"

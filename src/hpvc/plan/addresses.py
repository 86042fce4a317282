"""Addresses of a cluster: bridge name, gateway, and per-node IP and MAC."""

from __future__ import annotations

import hashlib
import ipaddress
from functools import lru_cache

IFNAMSIZ = 15  # longest Linux interface name


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def bridge_name(cluster: str) -> str:
    """``hpvc-<cluster>``, shortened with a hash suffix to fit IFNAMSIZ."""
    name = f"hpvc-{cluster}"
    if len(name) <= IFNAMSIZ:
        return name
    return f"hpvc-{cluster[:5]}{_digest(cluster).hex()[:5]}"


def gateway(net: ipaddress.IPv4Network) -> str:
    """The bridge's own address: the first host address of the subnet."""
    return str(net.network_address + 1)


# The planner numbers every node of a cluster (100,000 at scale, issue 33): the
# two functions below work on the address as an integer and print it
# themselves, the same dotted quad ``str(IPv4Address)`` gives, without
# building an address object per node.


def _node_int(net: ipaddress.IPv4Network, index: int) -> int:
    addr = int(net.network_address) + 2 + index
    if addr >= int(net.broadcast_address) or addr < 0:
        raise ValueError(f"node {index} does not fit in {net}")
    return addr


def node_ip(net: ipaddress.IPv4Network, index: int) -> str:
    """Node ``index`` (spec order) gets the address after the gateway's."""
    a = _node_int(net, index)
    return f"{a >> 24}.{a >> 16 & 255}.{a >> 8 & 255}.{a & 255}"


@lru_cache(maxsize=256)
def _cluster_byte(cluster: str) -> int:
    return _digest(cluster)[0]


def node_mac(cluster: str, net: ipaddress.IPv4Network, index: int) -> str:
    """A locally administered unicast MAC: 02, a cluster hash byte, the node's IPv4."""
    a = _node_int(net, index)
    b = _cluster_byte(cluster)
    return f"02:{b:02x}:{a >> 24:02x}:{a >> 16 & 255:02x}:{a >> 8 & 255:02x}:{a & 255:02x}"

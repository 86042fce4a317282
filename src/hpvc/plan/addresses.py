"""Addresses of a cluster: bridge name, gateway, and per-node IP and MAC."""

from __future__ import annotations

import hashlib
import ipaddress

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


def node_ip(net: ipaddress.IPv4Network, index: int) -> str:
    """Node ``index`` (spec order) gets the address after the gateway's."""
    addr = net.network_address + 2 + index
    if addr >= net.broadcast_address:
        raise ValueError(f"node {index} does not fit in {net}")
    return str(addr)


def node_mac(cluster: str, net: ipaddress.IPv4Network, index: int) -> str:
    """A locally administered unicast MAC: 02, a cluster hash byte, the node's IPv4."""
    ip = ipaddress.IPv4Address(node_ip(net, index)).packed
    octets = [0x02, _digest(cluster)[0], *ip]
    return ":".join(f"{o:02x}" for o in octets)

"""One layer-2 network per virtual cluster across hosts: VXLAN numbers, pure.

A cluster whose nodes sit on several hosts gets, on each host, its bridge
plus a kernel VXLAN link (``hpvc.host.vxlan``): one VNI per cluster, learning
off, one permanent forwarding entry per remote node MAC pointing at the
fabric address of the host that runs it, and one flood entry per other host
for broadcast. ARP stays static: every node gets the remote nodes' entries.

The node MTU is the fabric's minus the VXLAN encapsulation (outer IPv4 20 +
UDP 8 + VXLAN 8 + the inner Ethernet header 14 = 50 bytes): a frame the node
sends must fit in one fabric packet, since VXLAN does not fragment.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass

from hpvc.errors import InputError

VXLAN_PORT = 4789  # IANA
# The UDP source ports hpvc's VXLAN links send from ([low, high): the kernel's
# ``srcport`` range). All below 1024, where no ordinary user can bind a socket
# (net.ipv4.ip_unprivileged_port_start, 1024 by default): a VXLAN packet from
# any other source port was sent by a user's socket, not by the kernel, and
# the VNI filter (``hpvc.render.network.vni_filter``) drops it.
SOURCE_PORTS = (512, 1024)
# The VNI of the link that holds the VXLAN port for hpvc on each host
# (``hpvc.host.vxlan.hold_port``); ``vni_for`` never gives it to a cluster.
HOLDER_VNI = 0
HOLDER_LINK = "hpvc-vxport"  # its name
VXLAN_OVERHEAD = 50  # bytes added to each inner frame on an IPv4 fabric
MAX_VNI = (1 << 24) - 1
DEFAULT_NODE_MTU = 9000  # a cluster on one host (no fabric in the way)


@dataclass(frozen=True)
class Vtep:
    """One other host of the cluster: its fabric address and its nodes."""

    host: str
    address: str
    nodes: tuple[tuple[str, str, str], ...]  # (name, ip, mac) of the cluster's nodes there


@dataclass(frozen=True)
class Overlay:
    """What one host needs to join its part of the cluster network to the others'."""

    vni: int
    local: str  # this host's fabric address (the VXLAN source)
    remotes: tuple[Vtep, ...]
    mtu: int  # the node MTU (and the VXLAN link's)
    port: int = VXLAN_PORT
    # This host's own address on the cluster subnet (its bridge's): the gateway
    # on the first host, a per-host address on the others; "" for none.
    bridge_address: str = ""
    # What every host of the cluster derives its VM agents' key from, with the
    # site's key (one per job: ``slurm-job-<id>``); "" for none.
    key_id: str = ""

    def arp_entries(self) -> list[tuple[str, str]]:
        """(ip, mac) of every remote node, for the nodes' static ARP tables."""
        return [(ip, mac) for v in self.remotes for _, ip, mac in v.nodes]

    def peers(self) -> list[str]:
        """Fabric addresses allowed to send into this VNI (the other hosts and this one)."""
        return sorted({self.local, *(v.address for v in self.remotes)})

    def to_json(self) -> dict[str, object]:
        return {
            "vni": self.vni,
            "local": self.local,
            "port": self.port,
            "mtu": self.mtu,
            "bridge_address": self.bridge_address,
            "key_id": self.key_id,
            "remotes": [
                {"host": v.host, "address": v.address, "nodes": [list(n) for n in v.nodes]}
                for v in self.remotes
            ],
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Overlay:
        remotes = d.get("remotes", [])
        assert isinstance(remotes, list)
        return cls(
            vni=int(str(d["vni"])),
            local=str(d["local"]),
            port=int(str(d.get("port", VXLAN_PORT))),
            mtu=int(str(d["mtu"])),
            bridge_address=str(d.get("bridge_address", "")),
            key_id=str(d.get("key_id", "")),
            remotes=tuple(
                Vtep(
                    host=str(v["host"]),
                    address=str(v["address"]),
                    nodes=tuple((str(a), str(b), str(c)) for a, b, c in v["nodes"]),
                )
                for v in remotes
            ),
        )


def host_address(net: ipaddress.IPv4Network, index: int) -> str:
    """Host ``index`` of a cluster's own address on its subnet: the gateway
    (``.1``) on the first host, then the top of the subnet downwards (``.254``,
    ``.253`` ... in a /24), where no node address reaches."""
    if index == 0:
        return str(net.network_address + 1)
    return str(net.broadcast_address - index)


def vni_for(key: str) -> int:
    """A VNI from a stable key (``slurm-job-1234``, a cluster name): 1 .. 2^24-1."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
    return 1 + digest % MAX_VNI


def node_mtu(fabric_mtu: int, asked: int | None, where: str = "network.mtu") -> int:
    """The nodes' MTU on a fabric of ``fabric_mtu``: what the spec asked, if it fits,
    else (nothing asked) the most that fits, at most ``DEFAULT_NODE_MTU``."""
    room = fabric_mtu - VXLAN_OVERHEAD
    if asked is None:
        return min(DEFAULT_NODE_MTU, room)
    if asked > room:
        raise InputError(
            f"{where} = {asked}",
            f"the hosts' fabric MTU is {fabric_mtu}, and VXLAN takes {VXLAN_OVERHEAD} bytes"
            f" of it: nodes can have at most {room}",
            f"set network.mtu to {room} or less, or leave it out",
        )
    return asked

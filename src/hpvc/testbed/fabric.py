"""A private fabric: one bridge and, per simulated host, a network namespace wired to it.

The one way hpvc's test beds build "hosts apart" on one machine::

    bridge (MTU 9000, optional address) ─┬─ veth <port ifname> ── eth0 <address>/24  (netns A)
                                         ├─ veth ...           ── eth0 ...          (netns B)
                                         └─ ...

Each host's namespace holds ``lo`` and ``eth0`` (IPv6 off, no default route:
nothing leaves the fabric), as a real host's first NIC. Two callers:

- ``hpvc.testbed.pair.two_hosts`` (VXLAN tests, ``hpvc bench network``) runs it
  inside a fabric namespace of its own, so even the bridge is private;
- ``scripts/slurm/up.sh`` (the local Slurm test cluster) runs it in the root
  namespace through ``python -m hpvc.testbed fabric``: srun, run there, must reach
  slurmctld and the slurmds, so the bridge carries the root's own fabric address.

Every change is made by ``hpvc.host.net`` and journaled before it is made
(architecture rule 5), so undoing the journal removes the fabric.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from hpvc.errors import HpvcError
from hpvc.host import net
from hpvc.host.journal import Journal

FABRIC_MTU = 9000  # jumbo frames, as a cluster fabric has (room for VXLAN's 50 bytes)
PREFIXLEN = 24
IFNAME = net.NODE_IFNAME  # each host's interface on the fabric, inside its namespace


def mac_for(address: str) -> str:
    """A host's fabric MAC: locally administered, ``02:fb`` and the four octets of its
    IPv4 address (unique on the fabric, stable across restarts)."""
    octets = ipaddress.IPv4Address(address).packed
    return "02:fb:" + ":".join(f"{b:02x}" for b in octets)


@dataclass(frozen=True)
class Port:
    """One host on the fabric: its namespace, the veth's end on the bridge, its address."""

    netns: str
    ifname: str  # on the bridge's side (at most 15 characters)
    address: str

    @property
    def mac(self) -> str:
        return mac_for(self.address)


@dataclass(frozen=True)
class Fabric:
    """The bridge and the hosts on it."""

    bridge: str
    ports: tuple[Port, ...]
    address: str = ""  # the bridge's own address on the fabric; "" for none
    mtu: int = FABRIC_MTU
    prefixlen: int = PREFIXLEN


def check(fab: Fabric) -> None:
    """Refuse a fabric whose names or addresses cannot work (before any change)."""
    what = f"fabric {fab.bridge}"
    names = [fab.bridge, *(p.ifname for p in fab.ports)]
    for name in names:
        if not 0 < len(name) <= net.IFNAME_MAX:
            raise HpvcError(what, f"interface name {name!r}: 1-{net.IFNAME_MAX} characters")
    if len(set(names)) != len(names) or len({p.netns for p in fab.ports}) != len(fab.ports):
        raise HpvcError(what, "two ports share an interface or namespace name")
    addresses = [p.address for p in fab.ports] + ([fab.address] if fab.address else [])
    if len(set(addresses)) != len(addresses):
        raise HpvcError(what, "two hosts share an address")
    if not addresses:
        return
    subnet = ipaddress.ip_interface(f"{addresses[0]}/{fab.prefixlen}").network
    outside = [a for a in addresses if ipaddress.ip_address(a) not in subnet]
    if outside:
        raise HpvcError(what, f"{', '.join(outside)} outside {subnet}")


def make_namespaces(journal: Journal, names: Iterable[str]) -> None:
    """The hosts' network namespaces (``/run/netns/<name>``), each journaled."""
    for name in names:
        net.create_netns(journal, name)


def build(journal: Journal, fab: Fabric) -> None:
    """The bridge and every port's veth, in this process's network namespace; the
    ports' namespaces must exist."""
    check(fab)
    net.ensure_bridge(journal, fab.bridge, fab.address or None, fab.prefixlen, fab.mtu)
    for p in fab.ports:
        net.add_node_link(
            journal, bridge=fab.bridge, netns=p.netns, host_ifname=p.ifname, mtu=fab.mtu,
            address=p.address, prefixlen=fab.prefixlen, mac=p.mac,
            gateway=fab.address or p.address,
        )  # fmt: skip

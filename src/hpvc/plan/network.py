"""The cluster network across hosts, in the plan: VNI, VTEPs, node MTU, each host's view.

Pure. A cluster placed on more than one host, every one of them with a fabric
address in the inventory (``[[hosts]] fabric``), gets one VXLAN network that
joins its hosts' bridges (``hpvc.plan.overlay``, applied by ``hpvc.host.vxlan``):

- VNI ``vni_for("cluster-<name>")`` (a Slurm job's is ``slurm-job-<id>``);
- one VTEP per host the plan uses, in the plan's host order, at its fabric
  address;
- node MTU: ``node_mtu(smallest fabric MTU of those hosts, network.mtu)``, a
  spec MTU that cannot fit being refused with the numbers;
- on each host, its bridge's address on the cluster subnet: the gateway on the
  first host, the top of the subnet downwards on the others (``host_address``).

A plan on one host is what it always was. A cluster spanning hosts without
fabric addresses has no network across them, and its plan says so in a note.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from hpvc.errors import InputError
from hpvc.plan.addresses import IFNAMSIZ, bridge_name, gateway
from hpvc.plan.model import NetworkPlan, Plan
from hpvc.plan.overlay import (
    DEFAULT_NODE_MTU,
    VXLAN_OVERHEAD,
    Overlay,
    Vtep,
    host_address,
    node_mtu,
    vni_for,
)
from hpvc.topology.inventory import Fabric

if TYPE_CHECKING:  # the schema (pydantic) is not loaded to read a stored plan
    from hpvc.spec.model import Spec

VXLAN_LINK_PREFIX = "vx"


def vxlan_link_name(cluster: str) -> str:
    """The VXLAN port of ``cluster``'s bridge on each host: ``vx`` + 13 hex digits of
    sha256(cluster), like every interface hpvc names (``hpvc.host.net.short_ifname``)."""
    digest = hashlib.sha256(cluster.encode()).hexdigest()
    return VXLAN_LINK_PREFIX + digest[: IFNAMSIZ - len(VXLAN_LINK_PREFIX)]


def filter_table(vni: int) -> str:
    """The nftables table (family ``inet``) that guards VNI ``vni`` on a host."""
    return f"hpvc-vni{vni}"


def cluster_vni(cluster: str) -> int:
    """The VNI of a cluster planned across an inventory's hosts."""
    return vni_for(f"cluster-{cluster}")


def plan_network(
    spec: Spec, used: Sequence[str], fabric: Mapping[str, Fabric], node_ips: Sequence[str]
) -> tuple[NetworkPlan, tuple[str, ...]]:
    """The plan's network over the hosts ``used`` (plan order), and notes about it.

    Raises InputError when the spec's MTU cannot fit in the fabric's, or the
    subnet has no room for the nodes and the hosts' bridge addresses.
    """
    net = spec.network.network
    plain = NetworkPlan(
        subnet=spec.network.subnet,
        gateway=gateway(net),
        prefixlen=net.prefixlen,
        mtu=spec.network.mtu or DEFAULT_NODE_MTU,
        bridge=bridge_name(spec.name),
    )
    if len(used) < 2:
        return plain, ()
    missing = [h for h in used if h not in fabric]
    if missing:
        if len(missing) == len(used):
            which = "none of them has a fabric address"
        else:
            which = (
                f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no fabric address"
            )
        return plain, (
            f"the cluster spans {len(used)} hosts ({', '.join(used)}) but {which}:"
            " it has no cluster network across them, and nodes on different hosts"
            ' cannot reach each other (give each [[hosts]] entry fabric = "ADDRESS")',
        )
    fabric_mtu = min(fabric[h].mtu for h in used)
    _check_room(net, node_ips, len(used))
    return (
        replace(
            plain,
            mtu=node_mtu(fabric_mtu, spec.network.mtu),
            vni=cluster_vni(spec.name),
            fabric_mtu=fabric_mtu,
            vteps=tuple((h, fabric[h].address) for h in used),
        ),
        (),
    )


def _check_room(net: ipaddress.IPv4Network, node_ips: Sequence[str], hosts: int) -> None:
    """Every host but the first gives its bridge an address from the top of the
    subnet downwards: no node address may reach the lowest of them."""
    lowest = ipaddress.IPv4Address(host_address(net, hosts - 1))
    last = max(ipaddress.IPv4Address(ip) for ip in node_ips)
    if last >= lowest:
        raise InputError(
            f"network.subnet = {net}",
            f"too small for {len(node_ips)} nodes and the bridge addresses of {hosts} hosts"
            f" (node addresses reach {last}, the hosts' start at {lowest})",
            "give the spec a larger subnet",
        )


def host_overlay(plan: Plan, host: str) -> Overlay | None:
    """How ``host`` joins its part of the cluster to the other hosts': None for a
    plan with no network across hosts. KeyError for a host the plan does not use."""
    net = plan.network
    if net.vni is None:
        return None
    names = [h for h, _ in net.vteps]
    if host not in names:
        raise KeyError(host)
    index = names.index(host)
    # The nodes of every host in one pass over the plan (a pass per remote host
    # made this hosts x nodes: 37 s for 100,000 nodes on 8,000 hosts, issue 33).
    on_host: dict[str, list[tuple[str, str, str]]] = {}
    for n in plan.nodes:
        on_host.setdefault(n.host, []).append((n.name, n.ip, n.mac))
    remotes = tuple(
        Vtep(host=h, address=address, nodes=tuple(on_host.get(h, ())))
        for h, address in net.vteps
        if h != host
    )
    return Overlay(
        vni=net.vni,
        local=net.vteps[index][1],
        remotes=remotes,
        mtu=net.mtu,
        bridge_address=host_address(ipaddress.IPv4Network(net.subnet), index),
    )


def describe(net: NetworkPlan) -> str | None:
    """One line on the network across hosts, None on one host."""
    if net.vni is None or net.fabric_mtu is None:
        return None
    vteps = ", ".join(f"{h} {a}" for h, a in net.vteps)
    room = net.fabric_mtu - VXLAN_OVERHEAD
    why = f"fabric {net.fabric_mtu} - {VXLAN_OVERHEAD}"
    if net.mtu != room:
        why += f" leaves {room}"
    return f"network across hosts: VXLAN VNI {net.vni}, VTEPs {vteps}, node MTU {net.mtu} ({why})"

"""Plan -> ``network-<host>.sh``: one host's part of the cluster network across hosts.

The same facts ``hpvc.host.vxlan`` applies through netlink and nftables
(``hpvc.plan.network.host_overlay`` gives them), written as ``ip``, ``bridge``
and ``nft`` commands a reader can check or run by hand: the nftables table
that lets only the cluster's hosts send into its VNI, the bridge's VXLAN port
with learning off, one flood entry per other host and one forwarding entry per
remote node, in the VXLAN link's table and as a static entry in the bridge's
(so the bridge does not flood frames to remote nodes to every port). Rendered
only for a plan across hosts.

``vni_filter`` is the one spelling of that nftables table: the script embeds
it, and ``hpvc.host.vxlan`` feeds the same text to ``nft -f -``.
"""

from __future__ import annotations

from hpvc.plan.model import Plan
from hpvc.plan.network import filter_table, host_overlay, vxlan_link_name
from hpvc.plan.overlay import HOLDER_VNI, SOURCE_PORTS, Overlay

HOLDER_TABLE = "hpvc-vxport"  # nftables (family inet): the port holder's

_ZERO_MAC = "00:00:00:00:00:00"


def vni_filter(ov: Overlay) -> str:
    """The nftables commands (``nft -f`` input) of the table that guards ``ov``'s VNI
    on one host. The VNI is bits 32-55 of the VXLAN header, which follows the
    8-byte UDP header: ``@th,96,24`` in nft's raw payload syntax.

    * input: a packet into the VNI is let through only from another of the
      cluster's hosts (this host's own address is not one: what a local process
      sends to a local address arrives on ``lo``), arriving on the interface this
      host reaches that host through (``fib saddr . iif``: not ``lo``, not a
      cluster bridge), from the kernel's source ports (``SOURCE_PORTS``, below
      1024, where no ordinary user can bind); everything else is counted and
      dropped before the VXLAN socket sees it.
    * output: a packet into the VNI from any other source port is a local user's
      socket, not the kernel's VXLAN link: dropped before it leaves for the
      other hosts (whose input would let this host's address through).
    * forward: nothing into the VNI is routed through a host (a node's own
      packets, masqueraded, would leave with this host's address).

    Re-applying it replaces the rules (the chains are flushed), so a host's peers
    can change."""
    table = filter_table(ov.vni)
    low, high = SOURCE_PORTS
    ports = f"{low}-{high - 1}"
    into = f"udp dport {ov.port} @th,96,24 {ov.vni}"
    others = ", ".join(sorted({v.address for v in ov.remotes} - {ov.local}))
    accept = f"{into} ip saddr {{ {others} }} fib saddr . iif oif exists udp sport {ports} accept"
    rules = [
        ("input", accept) if others else None,
        ("input", f"{into} counter drop" + _says("only the cluster's other hosts' kernels")),
        ("output", f"{into} udp sport != {ports} counter drop" + _says("no local user's socket")),
        ("forward", f"{into} counter drop" + _says("nothing routed through this host")),
    ]
    lines = [f"add table inet {table}"]
    for hook in _HOOKS:
        chain = f"{{ type filter hook {hook} priority -200; policy accept; }}"
        lines += [f"add chain inet {table} {hook} {chain}", f"flush chain inet {table} {hook}"]
    lines += [f"add rule inet {table} {hook} {rule}" for hook, rule in filter(None, rules)]
    return "\n".join(lines) + "\n"


_HOOKS = ("input", "output", "forward")


def _says(who: str) -> str:
    return f' comment "hpvc: {who} may send into this VNI"'


def holder_filter(port: int) -> str:
    """The nftables commands of the table that drops every packet into the port
    holder's VNI (``HOLDER_VNI``): its link is up but joined to nothing, and no
    frame may reach this host's own stack through it."""
    table = HOLDER_TABLE
    chain = "{ type filter hook input priority -200; policy accept; }"
    rule = f"udp dport {port} @th,96,24 {HOLDER_VNI} counter drop"
    lines = [
        f"add table inet {table}",
        f"add chain inet {table} input {chain}",
        f"flush chain inet {table} input",
        f'add rule inet {table} input {rule} comment "hpvc: the VXLAN port holder carries nothing"',
    ]
    return "\n".join(lines) + "\n"


def network_scripts(plan: Plan) -> dict[str, str]:
    """``network-<host>.sh`` -> text for every host of a plan across hosts; {} otherwise."""
    return {f"network-{h}.sh": network_script(plan, h) for h, _ in plan.network.vteps}


def network_script(plan: Plan, host: str) -> str:
    """The commands that join ``host``'s bridge to the cluster's other hosts."""
    ov = host_overlay(plan, host)
    if ov is None:
        raise ValueError(f"plan of {plan.cluster} has no network across hosts")
    net = plan.network
    link = vxlan_link_name(plan.cluster)
    others = ", ".join(f"{v.host} {v.address}" for v in ov.remotes)
    lines = [
        "#!/bin/sh",
        f"# hpvc cluster {plan.cluster}, host {host}: its bridge joined to the other hosts'.",
        f"# VXLAN VNI {ov.vni} on UDP port {ov.port}, from this host's fabric address {ov.local}",
        f"# to {others}; node MTU {ov.mtu} (fabric MTU {net.fabric_mtu}).",
        "# `hpvc up` makes these changes itself. By hand: run as root, once, when the bridge",
        f"# {net.bridge} is up with this host's address on it,"
        f" {ov.bridge_address}/{net.prefixlen}.",
        "set -e",
        "",
        "# Only the other hosts' kernels may send into its VNI (bits 32-55 of the VXLAN header):",
        "# no local user's socket, no other host, nothing routed through this one.",
        "nft -f - <<'EOF'",
        *vni_filter(ov).splitlines(),
        "EOF",
        "",
        "# The bridge's VXLAN port; the forwarding database is written, never learned.",
        f"ip link add {link} type vxlan id {ov.vni} local {ov.local} dstport {ov.port} nolearning"
        f" srcport {SOURCE_PORTS[0]} {SOURCE_PORTS[1]}",
        f"ip link set {link} master {net.bridge} mtu {ov.mtu} up",
        f"bridge link set dev {link} learning off",
    ]
    for v in ov.remotes:
        lines += [
            "",
            f"# host {v.host}: broadcast once, then its {len(v.nodes)} node(s)",
            f"bridge fdb append {_ZERO_MAC} dev {link} dst {v.address} self permanent",
        ]
        for name, ip, mac in v.nodes:
            own = f"bridge fdb replace {mac} dev {link} dst {v.address} self permanent"
            lines += [f"{own}  # {name} {ip}", f"bridge fdb replace {mac} dev {link} master static"]
    return "\n".join(lines) + "\n"

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
from hpvc.plan.overlay import Overlay

_ZERO_MAC = "00:00:00:00:00:00"


def vni_filter(ov: Overlay) -> str:
    """The nftables commands (``nft -f`` input) of the table that drops UDP to the VXLAN
    port carrying ``ov``'s VNI from any source but the cluster's hosts, before the
    VXLAN socket sees it. The VNI is bits 32-55 of the VXLAN header, which follows the
    8-byte UDP header: ``@th,96,24`` in nft's raw payload syntax. Re-applying it
    replaces the rule (the chain is flushed), so a host's peers can change."""
    table = filter_table(ov.vni)
    peers = ", ".join(ov.peers())
    chain = "{ type filter hook input priority -200; policy accept; }"
    rule = (
        f"udp dport {ov.port} @th,96,24 {ov.vni} ip saddr != {{ {peers} }} counter drop"
        f' comment "hpvc: only the cluster\'s hosts may send into VNI {ov.vni}"'
    )
    lines = [
        f"add table inet {table}",
        f"add chain inet {table} input {chain}",
        f"flush chain inet {table} input",
        f"add rule inet {table} input {rule}",
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
        "# Only the cluster's hosts may send into its VNI (bits 32-55 of the VXLAN header).",
        "nft -f - <<'EOF'",
        *vni_filter(ov).splitlines(),
        "EOF",
        "",
        "# The bridge's VXLAN port; the forwarding database is written, never learned.",
        f"ip link add {link} type vxlan id {ov.vni} local {ov.local} dstport {ov.port} nolearning",
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

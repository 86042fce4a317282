"""Plan -> the small text files a cluster needs: hostfile, hosts, ARP, locality, guest net."""

from __future__ import annotations

import json

from hpvc.plan.model import Plan, PlannedNode


def mpi_nodes(plan: Plan) -> list[PlannedNode]:
    """Nodes that run MPI ranks: the compute nodes, or every node if there are none.

    The head node (and storage) is left out when compute nodes exist, so
    ``mpirun`` spreads ranks only where the cluster has reserved CPUs for them;
    a cluster of a lone head (or head and storage only) still gets a hostfile.
    """
    compute = [n for n in plan.nodes if n.role == "compute"]
    return compute or list(plan.nodes)


def hostfile(plan: Plan) -> str:
    """MPI hostfile, one ``NAME slots=VCPUS`` line per MPI node in plan order."""
    return "".join(f"{n.name} slots={len(n.vcpus)}\n" for n in mpi_nodes(plan))


def hosts(plan: Plan) -> str:
    """/etc/hosts content for every node (and the container's own loopback names)."""
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"# hpvc cluster {plan.cluster}",
    ]
    lines += [f"{n.ip}\t{n.name}" for n in plan.nodes]
    return "\n".join(lines) + "\n"


def arp_entries(plan: Plan) -> list[tuple[str, str]]:
    """Static ARP entries (ip, mac) of every node, in plan order."""
    return [(n.ip, n.mac) for n in plan.nodes]


def ethers(plan: Plan) -> str:
    """The static ARP list in /etc/ethers form (``MAC IP``; ``arp -f`` reads it)."""
    return "".join(f"{mac} {ip}\n" for ip, mac in arp_entries(plan))


def locality_json(plan: Plan) -> str:
    """Host -> node names placed on it; co-resident nodes may share memory."""
    return json.dumps(plan.locality(), indent=2) + "\n"


def guest_network(plan: Plan, node: PlannedNode) -> str:
    """A systemd-networkd ``.network`` unit for a VM guest, matched by MAC.

    Static address, gateway and MTU, no DHCP; ``/etc/hosts`` gives the names.
    """
    net = plan.network
    return (
        "[Match]\n"
        f"MACAddress={node.mac}\n"
        "\n"
        "[Link]\n"
        f"MTUBytes={net.mtu}\n"
        "\n"
        "[Network]\n"
        f"Address={node.ip}/{net.prefixlen}\n"
        f"Gateway={net.gateway}\n"
        "DHCP=no\n"
        "LinkLocalAddressing=no\n"
        "IPv6AcceptRA=no\n"
    )


def guest_network_script(plan: Plan, node: PlannedNode) -> str:
    """The same set-up as :func:`guest_network` as ``ip`` commands, for a simple init.

    The interface is found by MAC, so it works whatever the guest names it.
    """
    net = plan.network
    return (
        "#!/bin/sh\n"
        "set -e\n"
        f"dev=$(grep -l '^{node.mac}$' /sys/class/net/*/address | head -n1 | cut -d/ -f5)\n"
        "ip link set lo up\n"
        f'ip link set "$dev" mtu {net.mtu} up\n'
        f'ip addr add {node.ip}/{net.prefixlen} dev "$dev"\n'
        f'ip route add default via {net.gateway} dev "$dev"\n'
    )


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2) + "\n"

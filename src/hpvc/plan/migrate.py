"""Re-plan one node of a running cluster for a live migration (pure).

A node that moves is planned like a new node (``plan_cluster`` with the rest
of the cluster kept: pinning, emulator CPUs, NUMA cells on the target's host
nodes, hugepages grown there, the cluster's partition), then given back its
name, MAC and address; the guest's own topology (vCPUs, guest NUMA cells and
which vCPUs are in each, memory, page size) must come out identical, or the
move is refused (``DoesNotFit``, exit 2) before anything changes: a guest
must see no change (issue 27). The node's current CPUs are not held while it
is planned, so it may land on them again (a 2-CPU host has no room for a
separate target); ``cpus`` confines the new placement (vCPUs and emulator
threads) to those CPUs, by holding every other CPU of the host for the
planning pass as if another cluster had pinned it.

Unit tests: tests/unit/test_migrate_plan.py. Architecture: docs/architecture.md
(``plan/``: placement, never touches the host).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from hpvc.errors import DoesNotFit, InputError
from hpvc.plan.model import Plan, PlannedNode, Reservations
from hpvc.plan.planner import plan_cluster
from hpvc.spec.model import Spec
from hpvc.topology.model import Topology
from hpvc.units import format_cpulist


def guest_view(node: PlannedNode) -> tuple[object, ...]:
    """What the guest sees of its placement: vCPU count and cells, memory, pages, MAC, IP."""
    cells = tuple((c.guest_node, c.memory_mib, c.vcpus) for c in node.numa)
    vcpu_cells = tuple((v.vcpu, v.guest_node) for v in node.vcpus)
    pages = (node.hugepages.size_kib, node.hugepages.count) if node.hugepages else None
    return (len(node.vcpus), vcpu_cells, cells, node.memory_mib, pages, node.mac, node.ip)


def _confined(res: Reservations, host: str, topo: Topology, cpus: Collection[int]) -> Reservations:
    """``res`` with every allowed CPU of ``host`` outside ``cpus`` held (pinned)."""
    unknown = set(cpus) - set(topo.allowed_cpus)
    if unknown:
        raise InputError(
            f"--cpus {format_cpulist(set(cpus))}",
            f"CPUs {format_cpulist(unknown)} are not CPUs hpvc may use on {host}",
            f"give CPUs of {format_cpulist(set(topo.allowed_cpus))}",
        )
    mine = res.for_host(host)
    others = frozenset(c for c in topo.allowed_cpus if c not in set(cpus))
    held = replace(mine, dedicated_cpus=mine.dedicated_cpus | others)
    rest = tuple(h for h in res.hosts if h.host != host)
    return Reservations(hosts=(*rest, held))


def replan_node(
    spec: Spec,
    plan: Plan,
    node: str,
    host: str,
    topo: Topology,
    reservations: Reservations,
    cpus: Collection[int] | None = None,
) -> Plan:
    """``plan`` with ``node`` placed anew on ``host`` (``topo``: its topology, free
    pages as a plan may count them); ``reservations`` hold the other clusters.
    The cluster's other nodes keep their places (floating sets may shrink where
    the moved node pins CPUs, as in a scale)."""
    old = plan.node(node)
    if cpus is not None and not cpus:
        raise InputError("--cpus", "the list is empty", "give CPUs such as 0-3 or 1,5")
    res = _confined(reservations, host, topo, cpus) if cpus is not None else reservations
    rest = replace(plan, nodes=tuple(n for n in plan.nodes if n.name != node))
    try:
        fresh = plan_cluster(spec, [(host, topo)], res, existing=rest)
    except DoesNotFit as e:
        where = f" on CPUs {format_cpulist(set(cpus))}" if cpus is not None else ""
        raise DoesNotFit(f"node {node} does not fit on {host}{where}: {e.why}", e.fix) from e
    moved = replace(fresh.node(node), mac=old.mac, ip=old.ip)
    if guest_view(moved) != guest_view(old):
        raise DoesNotFit(
            f"node {node} would not keep its guest topology on {host} "
            f"(vCPUs, NUMA cells or memory would change)",
            "migrate it to a host with the same NUMA layout",
        )
    if cpus is not None:
        outside = set(moved.cpuset) | set(moved.emulator_cpus)
        outside -= set(cpus)
        if outside:
            raise DoesNotFit(
                f"node {node} would need CPUs {format_cpulist(outside)} outside --cpus",
                "give more CPUs",
            )
    nodes = tuple(moved if n.name == node else n for n in fresh.nodes)
    return replace(fresh, nodes=nodes, notes=plan.notes)


def moved(old: Plan, new: Plan, node: str) -> bool:
    """Whether the re-planned node lives anywhere else than it did."""
    a, b = old.node(node), new.node(node)
    return (a.host, a.cpuset, a.emulator_cpus, a.numa) != (
        b.host,
        b.cpuset,
        b.emulator_cpus,
        b.numa,
    )

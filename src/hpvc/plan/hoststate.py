"""Mutable bookkeeping of one host while a plan is being made.

Only the planner uses this; it never leaves ``plan_cluster``. It tracks which
host CPUs are still free for 1:1 pinning (per NUMA node, grouped by core so
hyper-thread siblings can be kept together), memory and hugepages still free
per NUMA node, and which sockets the cluster holds whole (``hpc``) or may not
touch (held by another cluster).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpvc.plan.model import HostReservation
from hpvc.topology.model import Topology

CoreKey = tuple[int, int]  # (package id, core id): core ids repeat across packages


@dataclass
class NodeState:
    """Free resources of one host NUMA node that has CPUs."""

    id: int
    package: int
    cores: dict[CoreKey, list[int]]  # free CPUs per core, for dedicated pinning
    free_cpus: int
    all_cpus: tuple[int, ...]
    mem_free_mib: int
    pages_free: dict[int, int]  # size_kib -> free pages in the pool now


@dataclass
class HostState:
    name: str
    topo: Topology
    nodes: dict[int, NodeState]
    package_nodes: dict[int, list[int]]
    usable_packages: set[int]  # packages this cluster may use
    others_hpc: set[int] = field(default_factory=set)  # sockets other clusters hold whole
    reserved: set[int] = field(default_factory=set)  # hpc: packages held whole
    dedicated: set[int] = field(default_factory=set)  # CPUs pinned by anyone
    pages_needed: dict[tuple[int, int], int] = field(default_factory=dict)
    shared_load: dict[int, int] = field(default_factory=dict)  # node -> shared vCPUs
    placed: list[str] = field(default_factory=list)
    emulator_spare: int = 0  # CPUs usable by emulator threads that no vCPU holds
    free_dedicated: int = 0  # CPUs free for pinning in usable packages (kept current)
    core_size: dict[CoreKey, int] = field(default_factory=dict)  # threads per core


def host_state(name: str, topo: Topology, hpc: bool, reservation: HostReservation) -> HostState:
    """Build the starting state of a host for a cluster of the given partition."""
    cpu_core: dict[int, CoreKey] = {}
    cpu_pkg: dict[int, int] = {}
    for p in topo.packages:
        for c in p.cores:
            for cpu in c.cpus:
                cpu_core[cpu] = (p.id, c.id)
                cpu_pkg[cpu] = p.id
    online = set(topo.online_cpus)
    taken = set(reservation.dedicated_cpus)
    # Another cluster's shared nodes float over their CPUs: never pin over them.
    unpinnable = taken | set(reservation.shared_cpus)
    core_size: dict[CoreKey, int] = {}
    for cpu in online:
        if cpu in cpu_core:
            core_size[cpu_core[cpu]] = core_size.get(cpu_core[cpu], 0) + 1
    nodes: dict[int, NodeState] = {}
    package_nodes: dict[int, list[int]] = {}
    for n in topo.numa_nodes:
        cpus = tuple(c for c in n.cpus if c in online and c in cpu_pkg)
        if not cpus:
            continue  # memory-only node: vCPUs cannot sit there, so neither do cells
        pkg = cpu_pkg[cpus[0]]
        cores: dict[CoreKey, list[int]] = {}
        for cpu in cpus:
            if cpu not in unpinnable:
                cores.setdefault(cpu_core[cpu], []).append(cpu)
        nodes[n.id] = NodeState(
            id=n.id,
            package=pkg,
            cores=cores,
            free_cpus=sum(len(v) for v in cores.values()),
            all_cpus=cpus,
            mem_free_mib=n.free_mib,
            pages_free={h.size_kib: h.free for h in n.hugepages},
        )
        package_nodes.setdefault(pkg, []).append(n.id)
    usable = _usable_packages(set(package_nodes), hpc, reservation, cpu_pkg)
    state = HostState(
        name=name,
        topo=topo,
        nodes=nodes,
        package_nodes=package_nodes,
        usable_packages=usable,
        dedicated=taken,
        others_hpc=set(reservation.hpc_packages),
        core_size=core_size,
    )
    state.free_dedicated = sum(n.free_cpus for n in nodes.values() if n.package in usable)
    # Emulator threads may run on any CPU no vCPU holds, outside other clusters'
    # hpc sockets (inside this cluster's own sockets first, see planner).
    held = set(reservation.hpc_packages)
    state.emulator_spare = sum(
        1 for c in online if c in cpu_pkg and c not in taken and cpu_pkg[c] not in held
    )
    return state


def _usable_packages(
    packages: set[int], hpc: bool, res: HostReservation, cpu_pkg: dict[int, int]
) -> set[int]:
    """hpc clusters take only untouched sockets; commodity ones avoid hpc sockets."""
    held_hpc = set(res.hpc_packages)
    if not hpc:
        return packages - held_hpc
    in_use = {cpu_pkg[c] for c in res.dedicated_cpus | res.shared_cpus if c in cpu_pkg}
    return packages - held_hpc - set(res.commodity_packages) - in_use

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

CoreKey = tuple[int, int]  # (package id, index of the core in the package)


@dataclass
class MemState:
    """Memory and hugepages still free on one host NUMA node."""

    id: int
    free_mib: int
    pages_free: dict[int, int]  # size_kib -> free pages in the pool now


@dataclass
class NodeState:
    """A CPU slot: the online CPUs of one NUMA node on one socket.

    Usually a NUMA node sits on one socket; on machines where one node spans
    several sockets (old front-side-bus boxes, NUMA off in firmware) it is
    split into one slot per socket, sharing the node's memory.
    """

    id: int  # the NUMA node
    package: int
    cores: dict[CoreKey, list[int]]  # free CPUs per core, for dedicated pinning
    free_cpus: int
    all_cpus: tuple[int, ...]
    mem: MemState


@dataclass
class HostState:
    name: str
    topo: Topology
    nodes: list[NodeState]
    package_nodes: dict[int, list[int]]
    usable_packages: set[int]  # packages this cluster may use
    others_hpc: set[int] = field(default_factory=set)  # sockets other clusters hold whole
    reserved: set[int] = field(default_factory=set)  # hpc: packages held whole
    dedicated: set[int] = field(default_factory=set)  # CPUs pinned by anyone
    pages_needed: dict[tuple[int, int], int] = field(default_factory=dict)  # new nodes
    pages_seeded: dict[tuple[int, int], int] = field(default_factory=dict)  # running nodes
    shared_load: dict[tuple[int, int], int] = field(default_factory=dict)  # slot -> vCPUs
    placed: list[str] = field(default_factory=list)
    emulator_spare: int = 0  # CPUs usable by emulator threads that no vCPU holds
    free_dedicated: int = 0  # CPUs free for pinning in usable packages (kept current)
    core_size: dict[CoreKey, int] = field(default_factory=dict)  # threads per core
    cpu_package: dict[int, int] = field(default_factory=dict)
    # Home socket -> emulator CPUs, filled once every node is placed (the
    # planner's _emulator_cpus: the answer is then the same for every node).
    emulator_by_home: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class TopoFacts:
    """What host_state needs of a topology alone, worked out once per topology
    (an inventory of thousands of hosts often has only a few kinds of machine).
    Shared by the states built from it: nothing here is ever changed."""

    cpu_core: dict[int, CoreKey]
    cpu_pkg: dict[int, int]
    core_size: dict[CoreKey, int]  # online threads per core
    # Per CPU slot, in the order of topo.numa_nodes then socket: (index of its
    # NUMA node in topo.numa_nodes, socket, its online CPUs).
    slots: tuple[tuple[int, int, tuple[int, ...]], ...]
    package_nodes: dict[int, list[int]]


def topo_facts(topo: Topology) -> TopoFacts:
    cpu_core: dict[int, CoreKey] = {}
    cpu_pkg: dict[int, int] = {}
    for p in topo.packages:
        for i, core in enumerate(p.cores):
            for cpu in core.cpus:
                cpu_core[cpu] = (p.id, i)
                cpu_pkg[cpu] = p.id
    online = set(topo.online_cpus)
    core_size: dict[CoreKey, int] = {}
    for cpu in online:
        if cpu in cpu_core:
            core_size[cpu_core[cpu]] = core_size.get(cpu_core[cpu], 0) + 1
    slots: list[tuple[int, int, tuple[int, ...]]] = []
    package_nodes: dict[int, list[int]] = {}
    for k, n in enumerate(topo.numa_nodes):
        by_pkg: dict[int, list[int]] = {}
        for c in n.cpus:
            if c in online and c in cpu_pkg:
                by_pkg.setdefault(cpu_pkg[c], []).append(c)
        # A node without CPUs holds no slot: cells follow vCPUs, so no memory from it.
        for pkg, cpus in sorted(by_pkg.items()):
            slots.append((k, pkg, tuple(cpus)))
            package_nodes.setdefault(pkg, []).append(n.id)
    return TopoFacts(cpu_core, cpu_pkg, core_size, tuple(slots), package_nodes)


def host_state(
    name: str,
    topo: Topology,
    hpc: bool,
    reservation: HostReservation,
    facts: TopoFacts | None = None,
) -> HostState:
    """Build the starting state of a host for a cluster of the given partition
    (``facts``: ``topo_facts(topo)``, when the caller keeps them)."""
    f = facts or topo_facts(topo)
    cpu_core = f.cpu_core
    taken = set(reservation.dedicated_cpus)
    # Another cluster's shared nodes float over their CPUs: never pin over them.
    unpinnable = taken | set(reservation.shared_cpus)
    slots: list[NodeState] = []
    mems: dict[int, MemState] = {}
    for k, pkg, cpus in f.slots:
        mem = mems.get(k)
        if mem is None:
            n = topo.numa_nodes[k]
            mem = mems[k] = MemState(n.id, n.free_mib, {h.size_kib: h.free for h in n.hugepages})
        cores: dict[CoreKey, list[int]] = {}
        for cpu in cpus:
            if cpu not in unpinnable:
                cores.setdefault(cpu_core[cpu], []).append(cpu)
        free = sum(len(v) for v in cores.values())
        slots.append(NodeState(mem.id, pkg, cores, free, cpus, mem))
    usable = _usable_packages(set(f.package_nodes), hpc, reservation, f.cpu_pkg)
    state = HostState(
        name=name,
        topo=topo,
        nodes=slots,
        package_nodes=f.package_nodes,
        usable_packages=usable,
        dedicated=taken,
        others_hpc=set(reservation.hpc_packages),
        core_size=f.core_size,
        cpu_package=f.cpu_pkg,
    )
    state.free_dedicated = sum(n.free_cpus for n in slots if n.package in usable)
    # Emulator threads may run on any CPU no vCPU holds, outside other clusters'
    # hpc sockets (inside this cluster's own sockets first, see planner).
    held = set(reservation.hpc_packages)
    state.emulator_spare = sum(
        1 for n in slots if n.package not in held for c in n.all_cpus if c not in taken
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

"""Host topology as plain immutable data (see ``hpvc.topology.read_topology``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class HugePool:
    """One hugepage pool of a NUMA node."""

    size_kib: int
    total: int
    free: int


@dataclass(frozen=True)
class NumaNode:
    """A NUMA node: its online CPUs, memory and hugepage pools.

    ``free_mib`` is what the planner may still take from the node: free memory
    plus easily reclaimed page cache, in the spirit of MemAvailable.
    """

    id: int
    cpus: tuple[int, ...]
    memory_mib: int
    free_mib: int
    hugepages: tuple[HugePool, ...] = ()

    def pool(self, size_kib: int) -> HugePool | None:
        for p in self.hugepages:
            if p.size_kib == size_kib:
                return p
        return None


@dataclass(frozen=True)
class Core:
    """A physical core; ``id`` is the kernel's core_id (unique within a package)."""

    id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Package:
    """A socket (physical package) with the NUMA nodes whose CPUs sit on it."""

    id: int
    numa_nodes: tuple[int, ...]
    cores: tuple[Core, ...]

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for core in self.cores for c in core.cpus))


@dataclass(frozen=True)
class Topology:
    """Sockets, NUMA nodes, cores and online CPUs of one host.

    ``allowed_cpus`` and ``allowed_mems`` are the online CPUs and NUMA nodes the
    process that read the topology may use (its cpuset, see
    ``hpvc.topology.allowed``); left empty they mean every online CPU and every
    node. ``whole_system`` is False for a view cut down to them
    (``read_topology`` without ``whole_system=True`` on a restricted process):
    such a view holds only the allowed CPUs, and the nodes that are allowed or
    hold an allowed CPU.
    """

    packages: tuple[Package, ...]
    numa_nodes: tuple[NumaNode, ...]
    online_cpus: tuple[int, ...]
    notes: tuple[str, ...] = field(default=(), compare=False)
    allowed_cpus: tuple[int, ...] = ()
    allowed_mems: tuple[int, ...] = ()
    whole_system: bool = True

    def __post_init__(self) -> None:
        if not self.allowed_cpus:
            object.__setattr__(self, "allowed_cpus", tuple(self.online_cpus))
        if not self.allowed_mems:
            object.__setattr__(self, "allowed_mems", tuple(n.id for n in self.numa_nodes))

    @property
    def restricted(self) -> bool:
        """True when an online CPU or a NUMA node of the host is not allowed here."""
        return not self.whole_system or (
            set(self.online_cpus) > set(self.allowed_cpus)
            or {n.id for n in self.numa_nodes} > set(self.allowed_mems)
        )

    def node(self, node_id: int) -> NumaNode:
        for n in self.numa_nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def cpu_node(self) -> dict[int, int]:
        """Map of online CPU -> NUMA node id."""
        return {cpu: n.id for n in self.numa_nodes for cpu in n.cpus}

    def cpu_package(self) -> dict[int, int]:
        """Map of online CPU -> package id."""
        return {cpu: p.id for p in self.packages for core in p.cores for cpu in core.cpus}

    def to_json(self) -> dict[str, Any]:
        return {
            "packages": [
                {
                    "id": p.id,
                    "numa_nodes": list(p.numa_nodes),
                    "cores": [{"id": c.id, "cpus": list(c.cpus)} for c in p.cores],
                }
                for p in self.packages
            ],
            "numa_nodes": [
                {
                    "id": n.id,
                    "cpus": list(n.cpus),
                    "memory_mib": n.memory_mib,
                    "free_mib": n.free_mib,
                    "hugepages": [
                        {"size_kib": h.size_kib, "total": h.total, "free": h.free}
                        for h in n.hugepages
                    ],
                }
                for n in self.numa_nodes
            ],
            "online_cpus": list(self.online_cpus),
            "allowed_cpus": list(self.allowed_cpus),
            "allowed_mems": list(self.allowed_mems),
            "whole_system": self.whole_system,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Topology:
        return cls(
            packages=tuple(
                Package(
                    id=p["id"],
                    numa_nodes=tuple(p["numa_nodes"]),
                    cores=tuple(Core(id=c["id"], cpus=tuple(c["cpus"])) for c in p["cores"]),
                )
                for p in data["packages"]
            ),
            numa_nodes=tuple(
                NumaNode(
                    id=n["id"],
                    cpus=tuple(n["cpus"]),
                    memory_mib=n["memory_mib"],
                    free_mib=n.get("free_mib", n["memory_mib"]),
                    hugepages=tuple(
                        HugePool(h["size_kib"], h["total"], h["free"]) for h in n["hugepages"]
                    ),
                )
                for n in data["numa_nodes"]
            ),
            online_cpus=tuple(data["online_cpus"]),
            notes=tuple(data.get("notes", ())),
            allowed_cpus=tuple(data.get("allowed_cpus", ())),
            allowed_mems=tuple(data.get("allowed_mems", ())),
            whole_system=bool(data.get("whole_system", True)),
        )

"""The Plan: where every vCPU, memory cell, hugepage and address of a cluster goes.

Plain immutable data; ``Plan.to_json()`` is the documented JSON form (docs/plan.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpvc.plan.services import DEFAULT_SHARED, SharedPlan, SparkPlan


@dataclass(frozen=True)
class VcpuPin:
    vcpu: int
    pcpu: int | None  # None: floating over the node's cpuset (shared pinning)
    guest_node: int


@dataclass(frozen=True)
class NumaCell:
    guest_node: int
    host_node: int
    memory_mib: int
    vcpus: tuple[int, ...]


@dataclass(frozen=True)
class HugepageNeed:
    size_kib: int
    count: int


@dataclass(frozen=True)
class IOPlan:
    read_bps: int | None = None
    write_bps: int | None = None
    read_iops: int | None = None
    write_iops: int | None = None
    weight: int | None = None


@dataclass(frozen=True)
class PlannedNode:
    name: str
    role: str
    kind: str  # container | vm
    host: str
    partition: str  # hpc | commodity
    pinning: str  # dedicated | shared
    vcpus: tuple[VcpuPin, ...]
    cpuset: tuple[int, ...]  # every host CPU the node's vCPUs may run on
    emulator_cpus: tuple[int, ...]
    numa: tuple[NumaCell, ...]
    memory_mib: int
    hugepages: HugepageNeed | None
    mac: str
    ip: str
    io: IOPlan | None = None
    # Size of the node's writable layer / disk (spec `disk`); None: a plan made
    # before the key existed, whose nodes' layers are unlimited.
    disk_mib: int | None = None

    @property
    def hugepage_mib(self) -> int:
        """MiB of the node's memory in hugepages: a VM's guest RAM, a container's
        ``hugepage_memory`` (all of it in a plan of an hpvc before that key)."""
        hp = self.hugepages
        return hp.count * hp.size_kib // 1024 if hp else 0

    @property
    def normal_mib(self) -> int:
        """The node's memory less its hugepages: a container's memory limit. A
        container of an older plan has all its memory in pages; it keeps its
        whole memory as its limit, as it was planned (brought up again, it is
        planned anew)."""
        rest = self.memory_mib - self.hugepage_mib
        return rest if rest > 0 else self.memory_mib

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "kind": self.kind,
            "host": self.host,
            "partition": self.partition,
            "pinning": self.pinning,
            "vcpus": [
                {"vcpu": v.vcpu, "pcpu": v.pcpu, "guest_node": v.guest_node} for v in self.vcpus
            ],
            "cpuset": list(self.cpuset),
            "emulator_cpus": list(self.emulator_cpus),
            "numa": [
                {
                    "guest_node": c.guest_node,
                    "host_node": c.host_node,
                    "memory_mib": c.memory_mib,
                    "vcpus": list(c.vcpus),
                }
                for c in self.numa
            ],
            "memory_mib": self.memory_mib,
            "hugepages": (
                {"size_kib": self.hugepages.size_kib, "count": self.hugepages.count}
                if self.hugepages
                else None
            ),
            "mac": self.mac,
            "ip": self.ip,
            "io": ({k: v for k, v in vars(self.io).items() if v is not None} if self.io else None),
            "disk_mib": self.disk_mib,
        }


@dataclass(frozen=True)
class HostHugepages:
    host_node: int
    size_kib: int
    count: int  # pages of this size the plan needs on the node
    free: int  # pages free in the pool now
    grow: int  # how far hpvc must grow the pool at `up` (max(0, count - free))


@dataclass(frozen=True)
class HostPlan:
    name: str
    hpc_packages: tuple[int, ...]  # sockets reserved whole for the cluster
    hugepages: tuple[HostHugepages, ...]
    nodes: tuple[str, ...]  # virtual nodes placed on this host (the locality group)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hpc_packages": list(self.hpc_packages),
            "hugepages": [
                {
                    "host_node": h.host_node,
                    "size_kib": h.size_kib,
                    "count": h.count,
                    "free": h.free,
                    "grow": h.grow,
                }
                for h in self.hugepages
            ],
            "nodes": list(self.nodes),
        }


@dataclass(frozen=True)
class NetworkPlan:
    subnet: str
    gateway: str
    prefixlen: int
    mtu: int  # the nodes' MTU (across hosts: the fabric's minus VXLAN's 50 bytes, or less)
    bridge: str
    # Across hosts (a cluster on more than one host, each with a fabric address):
    # the VXLAN network joining the hosts' bridges. None/empty on one host.
    vni: int | None = None
    fabric_mtu: int | None = None  # the smallest fabric MTU of the hosts used
    vteps: tuple[tuple[str, str], ...] = ()  # (host, fabric address), in plan host order

    @property
    def across_hosts(self) -> bool:
        return self.vni is not None

    def to_json(self) -> dict[str, Any]:
        """The one-host keys; ``vni``, ``fabric_mtu`` and ``vteps`` only across hosts
        (so a one-host plan.json is what it always was)."""
        out: dict[str, Any] = {
            "subnet": self.subnet,
            "gateway": self.gateway,
            "prefixlen": self.prefixlen,
            "mtu": self.mtu,
            "bridge": self.bridge,
        }
        if self.vni is not None:
            out["vni"] = self.vni
            out["fabric_mtu"] = self.fabric_mtu
            out["vteps"] = [{"host": h, "address": a} for h, a in self.vteps]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NetworkPlan:
        return cls(
            subnet=d["subnet"],
            gateway=d["gateway"],
            prefixlen=d["prefixlen"],
            mtu=d["mtu"],
            bridge=d["bridge"],
            vni=d.get("vni"),
            fabric_mtu=d.get("fabric_mtu"),
            vteps=tuple((v["host"], v["address"]) for v in d.get("vteps", ())),
        )


@dataclass(frozen=True)
class Plan:
    cluster: str
    kind: str
    image: str
    network: NetworkPlan
    nodes: tuple[PlannedNode, ...]
    hosts: tuple[HostPlan, ...]
    notes: tuple[str, ...] = field(default=(), compare=False)
    # What the cluster serves itself (hpvc.plan.services); plans made before
    # these existed read as a host folder at /shared and no Spark.
    shared: SharedPlan = DEFAULT_SHARED
    spark: SparkPlan | None = None

    def node(self, name: str) -> PlannedNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def locality(self) -> dict[str, list[str]]:
        """Host name -> virtual nodes on it (co-resident nodes may share memory)."""
        return {h.name: list(h.nodes) for h in self.hosts}

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "kind": self.kind,
            "image": self.image,
            "network": self.network.to_json(),
            "nodes": [n.to_json() for n in self.nodes],
            "hosts": [h.to_json() for h in self.hosts],
            "locality": self.locality(),
            "notes": list(self.notes),
            # The default (a host folder at /shared) is left out: plans stay as they were.
            **({"shared": self.shared.to_json()} if self.shared != DEFAULT_SHARED else {}),
            **({"spark": self.spark.to_json()} if self.spark else {}),
        }


@dataclass(frozen=True)
class HostReservation:
    """What other clusters already hold on one host (read from hpvc's state)."""

    host: str
    dedicated_cpus: frozenset[int] = frozenset()  # pinned 1:1, never shared again
    shared_cpus: frozenset[int] = frozenset()  # used by shared-pinning nodes
    hpc_packages: frozenset[int] = frozenset()  # sockets reserved whole by an hpc cluster
    commodity_packages: frozenset[int] = frozenset()  # sockets with commodity nodes on them


@dataclass(frozen=True)
class Reservations:
    hosts: tuple[HostReservation, ...] = ()

    def for_host(self, name: str) -> HostReservation:
        for h in self.hosts:
            if h.host == name:
                return h
        return HostReservation(host=name)


def plan_from_json(d: dict[str, Any]) -> Plan:
    """Inverse of ``Plan.to_json`` (state files hold plans as JSON)."""
    nodes = tuple(
        PlannedNode(
            name=n["name"],
            role=n["role"],
            kind=n["kind"],
            host=n["host"],
            partition=n["partition"],
            pinning=n["pinning"],
            vcpus=tuple(VcpuPin(v["vcpu"], v["pcpu"], v["guest_node"]) for v in n["vcpus"]),
            cpuset=tuple(n["cpuset"]),
            emulator_cpus=tuple(n["emulator_cpus"]),
            numa=tuple(
                NumaCell(c["guest_node"], c["host_node"], c["memory_mib"], tuple(c["vcpus"]))
                for c in n["numa"]
            ),
            memory_mib=n["memory_mib"],
            hugepages=HugepageNeed(**n["hugepages"]) if n["hugepages"] else None,
            mac=n["mac"],
            ip=n["ip"],
            io=IOPlan(**n["io"]) if n["io"] else None,
            disk_mib=n.get("disk_mib"),
        )
        for n in d["nodes"]
    )
    hosts = tuple(
        HostPlan(
            name=h["name"],
            hpc_packages=tuple(h["hpc_packages"]),
            hugepages=tuple(HostHugepages(**g) for g in h["hugepages"]),
            nodes=tuple(h["nodes"]),
        )
        for h in d["hosts"]
    )
    return Plan(
        cluster=d["cluster"],
        kind=d["kind"],
        image=d["image"],
        network=NetworkPlan.from_json(d["network"]),
        nodes=nodes,
        hosts=hosts,
        notes=tuple(d.get("notes", ())),
        shared=SharedPlan.from_json(d["shared"]) if d.get("shared") else DEFAULT_SHARED,
        spark=SparkPlan.from_json(d["spark"]) if d.get("spark") else None,
    )

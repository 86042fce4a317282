"""What a cluster serves to itself: the shared directory and Spark (pure).

The shared directory (spec ``[shared]``, docs/storage.md) is either a host
folder bound into every node (``server = "host"``) or exported over NFS by one
node of the cluster: the first storage node, else the head, else the first
node, on its cluster address. Spark (spec ``[spark]``, docs/spark.md) runs its
master on the head and one worker per compute node, sized from the node: all
its vCPUs, and what its memory leaves after the node's own system, the worker
daemon and the executor JVM's overhead (``hpvc.spec.spark.worker_memory_mib``).

Both are planned from the spec and the placed nodes; a Slurm share, whose plan
holds only its host's nodes, still knows the server's and the master's
addresses: shares number addresses in spec order (``node_ip``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpvc.plan.addresses import node_ip
from hpvc.spec.spark import worker_memory_mib

if TYPE_CHECKING:
    from hpvc.plan.model import PlannedNode
    from hpvc.spec import Spec

# The NFS export's name on the server (its NFSv4 pseudo path).
EXPORT = "/shared"
# A VM cluster's NFS backing without a spec ``size``: a guest cannot export a
# host folder (no virtiofs), so the server VM gets a disk of this many MiB.
VM_SHARED_MIB = 4096


@dataclass(frozen=True)
class SharedPlan:
    server: str  # "host" | "nfs"
    path: str  # where the nodes see it
    keep: bool
    size_mib: int | None = None  # nfs: an ext4 file system of this size; None: a folder
    node: str | None = None  # nfs: the node that serves it
    address: str | None = None  # nfs: its cluster address
    export: str = EXPORT

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SharedPlan:
        return cls(**d)


DEFAULT_SHARED = SharedPlan(server="host", path="/shared", keep=False)


@dataclass(frozen=True)
class SparkWorker:
    node: str
    address: str
    cores: int
    memory_mib: int


@dataclass(frozen=True)
class SparkPlan:
    master: str  # node name
    address: str
    port: int
    ui_port: int
    workers: tuple[SparkWorker, ...]

    @property
    def url(self) -> str:
        return f"spark://{self.address}:{self.port}"

    @property
    def ui(self) -> str:
        return f"http://{self.address}:{self.ui_port}"

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "workers"}
        out["workers"] = [dict(vars(w)) for w in self.workers]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SparkPlan:
        workers = tuple(SparkWorker(**w) for w in d["workers"])
        return cls(**{k: v for k, v in d.items() if k != "workers"}, workers=workers)


def _spec_order(spec: Spec) -> list[tuple[str, str, int, int]]:
    """(name, role, vcpus, memory MiB) of every node, in spec order."""
    counters: dict[str, int] = {}
    out: list[tuple[str, str, int, int]] = []
    for g in spec.nodes:
        for _ in range(g.count):
            i = counters.get(g.role, 0)
            counters[g.role] = i + 1
            out.append((f"{g.role}{i}", g.role, g.vcpus, g.memory))
    return out


def _address(spec: Spec, nodes: tuple[PlannedNode, ...], name: str) -> str:
    for n in nodes:
        if n.name == name:
            return n.ip
    order = [n for n, *_ in _spec_order(spec)]
    return node_ip(ipaddress.IPv4Network(spec.network.subnet), order.index(name))


def server_node(spec: Spec) -> str:
    """The node that serves the shared directory over NFS."""
    order = _spec_order(spec)
    for role in ("storage", "head"):
        for name, r, *_ in order:
            if r == role:
                return name
    return order[0][0]


def shared_plan(spec: Spec, nodes: tuple[PlannedNode, ...]) -> SharedPlan:
    sh = spec.shared
    if sh.server == "host":
        return SharedPlan(server="host", path=sh.path, keep=sh.keep)
    name = server_node(spec)
    return SharedPlan(
        server="nfs",
        path=sh.path,
        keep=sh.keep,
        size_mib=sh.size if sh.size is not None or spec.kind != "vm" else VM_SHARED_MIB,
        node=name,
        address=_address(spec, nodes, name),
    )


def spark_plan(spec: Spec, nodes: tuple[PlannedNode, ...]) -> SparkPlan | None:
    sp = spec.spark
    if sp is None:
        return None
    order = _spec_order(spec)
    master = next(n for n, role, *_ in order if role == "head")
    # Workers: the compute nodes of the plan (scale changes them), sized from it.
    workers = tuple(
        SparkWorker(n.name, n.ip, len(n.vcpus), sp.worker_memory or worker_memory_mib(n.memory_mib))
        for n in nodes
        if n.role == "compute"
    )
    return SparkPlan(
        master=master,
        address=_address(spec, nodes, master),
        port=sp.master_port,
        ui_port=sp.ui_port,
        workers=workers,
    )

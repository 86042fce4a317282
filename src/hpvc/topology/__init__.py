"""Host topology discovery from sysfs/procfs under an injectable root."""

from hpvc.topology.allowed import allowed_view
from hpvc.topology.model import Core, HugePool, NumaNode, Package, Topology
from hpvc.topology.sysfs import offline_cpus, read_topology

__all__ = [
    "Core",
    "HugePool",
    "NumaNode",
    "Package",
    "Topology",
    "allowed_view",
    "offline_cpus",
    "read_topology",
]

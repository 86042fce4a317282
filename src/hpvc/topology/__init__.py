"""Host topology discovery from sysfs/procfs under an injectable root.

The names below are loaded on first use (``hpvc.lazy``): reading a stored
topology (``hpvc.topology.model``) does not import the sysfs readers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpvc.lazy import exports

if TYPE_CHECKING:
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

__getattr__ = exports(
    __name__,
    {
        "hpvc.topology.allowed": ["allowed_view"],
        "hpvc.topology.model": ["Core", "HugePool", "NumaNode", "Package", "Topology"],
        "hpvc.topology.sysfs": ["offline_cpus", "read_topology"],
    },
)

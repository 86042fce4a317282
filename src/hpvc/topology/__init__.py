"""Host topology discovery from sysfs/procfs under an injectable root."""

from hpvc.topology.model import Core, HugePool, NumaNode, Package, Topology

__all__ = ["Core", "HugePool", "NumaNode", "Package", "Topology"]

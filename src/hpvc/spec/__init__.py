"""Cluster spec: schema and loading."""

from hpvc.spec.load import load_spec, parse_spec
from hpvc.spec.model import IOLimits, Network, NodeGroup, Spec, Tuning

__all__ = ["IOLimits", "Network", "NodeGroup", "Spec", "Tuning", "load_spec", "parse_spec"]

"""Cluster spec: schema and loading.

The names below are loaded on first use (``hpvc.lazy``): reading Spark's
sizing rules (``hpvc.spec.spark``, used by the planner) does not import the
schema and pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpvc.lazy import exports

if TYPE_CHECKING:
    from hpvc.spec.load import load_spec, parse_spec, read_spec
    from hpvc.spec.model import IOLimits, Network, NodeGroup, Spec, Tuning

__all__ = [
    "IOLimits", "Network", "NodeGroup", "Spec", "Tuning", "load_spec", "parse_spec", "read_spec",
]  # fmt: skip

__getattr__ = exports(
    __name__,
    {"hpvc.spec.model": __all__[:5], "hpvc.spec.load": ["load_spec", "parse_spec", "read_spec"]},
)

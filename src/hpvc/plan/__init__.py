"""Pure placement: (spec, host topologies, reservations) -> Plan.

The names below are loaded on first use (``hpvc.lazy``): reading a stored
plan (``hpvc.plan.model``) does not import the planner and the spec schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpvc.lazy import exports

if TYPE_CHECKING:
    from hpvc.plan.model import (
        HostPlan,
        HostReservation,
        HugepageNeed,
        IOPlan,
        NetworkPlan,
        NumaCell,
        Plan,
        PlannedNode,
        Reservations,
        VcpuPin,
    )
    from hpvc.plan.network import host_overlay
    from hpvc.plan.planner import plan_cluster

__all__ = [
    "HostPlan",
    "HostReservation",
    "HugepageNeed",
    "IOPlan",
    "NetworkPlan",
    "NumaCell",
    "Plan",
    "PlannedNode",
    "Reservations",
    "VcpuPin",
    "host_overlay",
    "plan_cluster",
]

__getattr__ = exports(
    __name__,
    {
        "hpvc.plan.model": __all__[:10],
        "hpvc.plan.network": ["host_overlay"],
        "hpvc.plan.planner": ["plan_cluster"],
    },
)

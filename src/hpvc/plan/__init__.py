"""Pure placement: (spec, host topologies, reservations) -> Plan."""

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

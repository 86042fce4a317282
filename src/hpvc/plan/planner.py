"""Placement (being written)."""

from __future__ import annotations

from collections.abc import Sequence

from hpvc.plan.model import Plan, Reservations
from hpvc.spec.model import Spec
from hpvc.topology.model import Topology


def plan_cluster(
    spec: Spec,
    hosts: Sequence[tuple[str, Topology]],
    reservations: Reservations | None = None,
) -> Plan:
    raise NotImplementedError

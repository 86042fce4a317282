"""What running clusters hold, per host, and the planner's Reservations from it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported in merge: a record's Holding is read without them (`hpvc ls`)
    from hpvc.plan.model import Plan, Reservations
    from hpvc.topology.model import Topology


@dataclass
class Holding:
    """What one cluster holds on one host (stored in its state record)."""

    dedicated_cpus: list[int] = field(default_factory=list)
    shared_cpus: list[int] = field(default_factory=list)
    hpc_packages: list[int] = field(default_factory=list)
    commodity_packages: list[int] = field(default_factory=list)


def holdings_of(plan: Plan, cpu_package: Mapping[str, Mapping[int, int]]) -> dict[str, Holding]:
    """Per host: pinned CPUs, floated-over CPUs and the sockets the plan holds.

    ``cpu_package`` maps host -> CPU -> socket (commodity clusters mark the
    sockets they touch, so no hpc cluster takes them).
    """
    out: dict[str, Holding] = {}
    hpc = {h.name: list(h.hpc_packages) for h in plan.hosts}
    for n in plan.nodes:
        h = out.setdefault(n.host, Holding())
        target = h.dedicated_cpus if n.pinning == "dedicated" else h.shared_cpus
        target.extend(c for c in n.cpuset if c not in target)
        if n.partition == "hpc":
            h.hpc_packages = hpc.get(n.host, [])
        else:
            pkgs = cpu_package.get(n.host, {})
            h.commodity_packages = sorted(
                set(h.commodity_packages) | {pkgs[c] for c in n.cpuset if c in pkgs}
            )
    return out


def merge(holdings: Iterable[Mapping[str, Holding]]) -> Reservations:
    """The union of several clusters' holdings, host by host."""
    from hpvc.plan.model import HostReservation, Reservations

    acc: dict[str, dict[str, set[int]]] = {}
    for per_host in holdings:
        for host, h in per_host.items():
            a = acc.setdefault(host, {k: set() for k in asdict(Holding())})
            for k, v in asdict(h).items():
                a[k].update(v)
    return Reservations(
        hosts=tuple(
            HostReservation(
                host=host,
                dedicated_cpus=frozenset(a["dedicated_cpus"]),
                shared_cpus=frozenset(a["shared_cpus"]),
                hpc_packages=frozenset(a["hpc_packages"]),
                commodity_packages=frozenset(a["commodity_packages"]),
            )
            for host, a in sorted(acc.items())
        )
    )


def reservations_from_plans(
    plans: Iterable[Plan], topologies: Mapping[str, Topology]
) -> Reservations:
    """Merge the holdings of the given (running) plans, host by host."""
    cpu_pkg = {name: t.cpu_package() for name, t in topologies.items()}
    return merge(holdings_of(p, cpu_pkg) for p in plans)

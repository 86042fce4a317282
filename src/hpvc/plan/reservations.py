"""What running clusters hold, as the planner's Reservations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hpvc.plan.model import HostReservation, Plan, Reservations
from hpvc.topology.model import Topology


def reservations_from_plans(
    plans: Iterable[Plan], topologies: Mapping[str, Topology]
) -> Reservations:
    """Merge the holdings of the given (running) plans, host by host.

    ``topologies`` maps host name to its topology, to know which socket each
    CPU is on (commodity clusters mark the sockets they touch).
    """
    acc: dict[str, dict[str, set[int]]] = {}
    for plan in plans:
        hpc_hosts = {h.name: set(h.hpc_packages) for h in plan.hosts}
        for n in plan.nodes:
            a = acc.setdefault(
                n.host, {"dedicated": set(), "shared": set(), "hpc": set(), "commodity": set()}
            )
            (a["dedicated"] if n.pinning == "dedicated" else a["shared"]).update(n.cpuset)
            if n.partition == "hpc":
                a["hpc"].update(hpc_hosts.get(n.host, ()))
            else:
                pkg = topologies[n.host].cpu_package()
                a["commodity"].update(pkg[c] for c in n.cpuset if c in pkg)
    return Reservations(
        hosts=tuple(
            HostReservation(
                host=host,
                dedicated_cpus=frozenset(a["dedicated"]),
                shared_cpus=frozenset(a["shared"]),
                hpc_packages=frozenset(a["hpc"]),
                commodity_packages=frozenset(a["commodity"]),
            )
            for host, a in sorted(acc.items())
        )
    )

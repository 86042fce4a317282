"""The cluster API's read side for benchmarks: what ``hpvc up`` would do, what a node uses.

Would these specs fit on this host, one beside the other, as successive ``hpvc
up`` would place them (planned, nothing booked or changed)? How many hosts
would a plan use? How much CPU time has a node's cgroup used so far, and what
cpuset does the kernel hold for it? Each answer needs what only the cluster
layer puts together (the planner with reservations between plans, where a
node's cgroup is), and comes back in plain values. Host-wide facts that need
no cluster (CPU model, caches, a block device, the accelerator, the host's CPU
time) are asked of ``host/``'s read-only readers directly (docs/architecture.md,
rule 2). Everything that reads the host takes an injectable ``root``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hpvc.cluster.lifecycle import hostname
from hpvc.errors import DoesNotFit, HpvcError
from hpvc.host import cgroups, usage
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.reservations import reservations_from_plans
from hpvc.spec import Spec, load_spec, parse_spec
from hpvc.sysroot import HOST, RootLike
from hpvc.topology import Topology, read_topology

# --- planning without booking --------------------------------------------------------


@dataclass(frozen=True)
class HostView:
    """One host's topology, read once, under the name plans give it."""

    topology: Topology
    name: str = "local"

    @property
    def cpus(self) -> int:
        """Online CPUs."""
        return len(self.topology.online_cpus)

    @property
    def threads_per_core(self) -> int:
        """Hardware threads of the widest core (1 without hyper-threads)."""
        return max((len(c.cpus) for p in self.topology.packages for c in p.cores), default=1)

    def named(self, name: str) -> HostView:
        """The same host under another name (an inventory of replicated hosts)."""
        return replace(self, name=name)


def read_host(root: RootLike = HOST, name: str = "local") -> HostView:
    """The host at ``root`` (``/``, or an extracted topology snapshot)."""
    return HostView(read_topology(root), name)


def spec_of(text: str) -> Spec:
    """A spec from its TOML text (``hpvc up`` validates it the same way)."""
    return parse_spec(tomllib.loads(text))


def plan_together(texts: Sequence[str], host: HostView) -> list[Plan]:
    """Plan the spec texts on ``host`` in order, each beside the ones before it (as
    ``hpvc up`` of each in turn would place them); nothing is booked. Raises DoesNotFit."""
    hosts = [(host.name, host.topology)]
    plans: list[Plan] = []
    for text in texts:
        res = reservations_from_plans(plans, dict(hosts)) if plans else None
        plans.append(plan_cluster(spec_of(text), hosts, res))
    return plans


def why_not_fit(texts: Sequence[str], host: HostView) -> str | None:
    """Why the spec texts do not fit on ``host`` together; None when they do."""
    try:
        plan_together(texts, host)
    except DoesNotFit as e:
        return e.why
    return None


def why_spec_file_not_fit(path: Path, root: RootLike = HOST) -> str | None:
    """Why the spec file at ``path`` does not fit alone on the host at ``root``; None if
    it fits (clusters already up are not counted)."""
    try:
        plan_cluster(load_spec(path), [(hostname(), read_topology(root))])
    except DoesNotFit as e:
        return e.why
    return None


def hosts_used(spec: Spec, hosts: Sequence[HostView]) -> int:
    """How many of ``hosts`` a plan of ``spec`` uses (the planner at scale)."""
    return len(plan_cluster(spec, [(h.name, h.topology) for h in hosts]).hosts)


# --- what a running node uses ---------------------------------------------------------


def node_cpu_seconds(cluster: str, node: str, root: RootLike = HOST) -> float | None:
    """CPU seconds the node's cgroup used so far; None: unknown (no such cgroup)."""
    return usage.cgroup_cpu_seconds(cgroups.node_path(cluster, node), root)


def node_cpuset(cluster: str, node: str, root: RootLike = HOST) -> str | None:
    """The CPUs the kernel lets the node use (a CPU list); None when it cannot be read."""
    try:
        return str(cgroups.read_node_limits(cluster, node, root).get("cpus"))
    except (HpvcError, OSError):
        return None

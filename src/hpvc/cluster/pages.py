"""Hugepages a cluster holds on this host, and the free pages a plan may count.

A cluster holds every hugepage its plan gives its nodes, from ``up`` until it
goes, whether its programs have mapped them or not. The kernel only knows
mapped pages: a container's pages sit free in the pool until its programs
fault them in, so the kernel's free count includes pages another cluster
holds. A plan must count only pages nobody holds, so before planning hpvc
takes off the kernel's free count, per NUMA node and page size, what every
other cluster of this state directory holds and has not mapped yet:

    free for a new plan = kernel free - sum over other clusters of
                          max(0, pages held - pages mapped)

(floor 0). Pages held are in each record (``ClusterRecord.pages``, written
with the plan under the state lock, so a cluster holds its pages from the
moment it is booked, before it grows the pool). Pages mapped come from the
kernel: a backend whose nodes map all their pages when they start
(``Capabilities.pages_on_demand`` False: VMs preallocate) has mapped all of
them once running, and none before (counted held and free: the safe side);
for the others the hugetlb cgroups of the cluster's nodes say how many
pages they faulted in, per NUMA node. Pages hpvc did not grow (an
administrator's pool) are counted the same way: whoever plans first holds
them.

A scale keeps the cluster's own running nodes; the planner takes their pages
from the free count first, so their mapped pages (which the kernel no longer
counts free) are added back. A scale down returns the pages hpvc grew for
the cluster that it no longer holds (``shrink``), so the pool ends at what is
held.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

from hpvc.backends import registry
from hpvc.backends.base import Backend
from hpvc.host import cgroups, hugepages
from hpvc.host.journal import Journal
from hpvc.plan import Plan
from hpvc.plan.place import node_huge_mib
from hpvc.spec import parse_spec
from hpvc.store import ClusterRecord, Store
from hpvc.topology.model import Topology

Key = tuple[int, int]  # (host NUMA node, page KiB)
_log = logging.getLogger(__name__)


def held_by_plan(plan: Plan, host: str) -> dict[Key, int]:
    """Pages the plan's nodes on ``host`` need, per NUMA node and page size."""
    out: dict[Key, int] = {}
    for n in plan.nodes:
        if n.host != host or n.hugepages is None:
            continue
        size = n.hugepages.size_kib
        for c, mib in zip(n.numa, node_huge_mib(n), strict=True):
            key = (c.host_node, size)
            out[key] = out.get(key, 0) + mib * 1024 // size
    return out


def to_record(held: dict[Key, int]) -> dict[str, int]:
    return {f"{node}:{size}": n for (node, size), n in sorted(held.items()) if n}


def from_record(pages: dict[str, int]) -> dict[Key, int]:
    out: dict[Key, int] = {}
    for k, n in pages.items():
        node, size = k.split(":")
        out[int(node), int(size)] = n
    return out


def merged(a: dict[Key, int], b: dict[Key, int]) -> dict[Key, int]:
    """The larger of two holdings, key by key (a cluster while it scales)."""
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in set(a) | set(b)}


def held(rec: ClusterRecord, host: str) -> dict[Key, int]:
    """What a record holds (records of an older hpvc: what its plan gives)."""
    if rec.pages is not None:
        return from_record(rec.pages)
    return held_by_plan(rec.the_plan(), host)


def _backend(rec: ClusterRecord) -> Backend | None:
    try:
        return registry.get(rec.backend or registry.name_for(parse_spec(rec.spec, rec.spec_path)))
    except Exception:  # an unknown backend: count its pages as unmapped (the safe side)
        return None


def mapped(rec: ClusterRecord, host: str, nodes: Iterable[str] | None = None) -> dict[Key, int]:
    """Pages the cluster's nodes (``nodes``, default all) have mapped, per key."""
    plan = rec.the_plan()
    names = [n.name for n in plan.nodes if n.host == host]
    if nodes is not None:
        names = [n for n in names if n in set(nodes)]
    backend = _backend(rec)
    if backend is None:
        return {}
    if not backend.capabilities.pages_on_demand:
        if rec.status not in ("running", "scaling"):
            return {}
        return held_by_plan(replace(plan, nodes=tuple(plan.node(n) for n in names)), host)
    out: dict[Key, int] = {}
    for size in {s for _, s in held_by_plan(plan, host)}:
        got = hugepages.cgroup_pages([cgroups.node_path(rec.name, n) for n in names], size)
        for node, n in (got or {}).items():
            out[node, size] = n
    return out


def unheld(
    store: Store, topo: Topology, host: str, exclude: str, own: ClusterRecord | None = None
) -> Topology:
    """``topo`` with each pool's free count less what other clusters hold unmapped.

    ``own``: the cluster being scaled (its kept nodes' mapped pages count free
    again, since the planner takes their pages from the free count)."""
    take: dict[Key, int] = {}
    for name in store.names():
        rec = store.load(name)
        if name == exclude or rec is None:
            continue
        used = mapped(rec, host)
        for k, n in held(rec, host).items():
            take[k] = take.get(k, 0) + max(0, n - used.get(k, 0))
    if own is not None:
        for k, n in mapped(own, host).items():
            take[k] = take.get(k, 0) - n
    if not any(take.values()):
        return topo
    nodes = tuple(
        replace(
            nd,
            hugepages=tuple(
                replace(p, free=max(0, p.free - take.get((nd.id, p.size_kib), 0)))
                for p in nd.hugepages
            ),
        )
        for nd in topo.numa_nodes
    )
    return replace(topo, numa_nodes=nodes)


def shrink(journal: Journal, was_held: dict[Key, int], now_held: dict[Key, int]) -> None:
    """Return grown pages after a scale down: as many as the cluster let go of, at
    most what it grew. Its grown pages go first, so a cluster that also took
    pages that were free before it came leaves the pool where it found it."""
    for (node, size), n in sorted(hugepages.grown(journal).items()):
        let_go = was_held.get((node, size), 0) - now_held.get((node, size), 0)
        extra = min(n, let_go)
        if extra > 0:
            _log.info("hugepages: node %d -%d x %d KiB (no longer held)", node, extra, size)
            hugepages.give_back(journal, node, size, extra)

"""Say exactly what is short when a node fits on no host."""

from __future__ import annotations

from hpvc.errors import DoesNotFit
from hpvc.plan.hoststate import HostState, NodeState
from hpvc.plan.place import Rules, Want, shared_pool
from hpvc.units import format_mib


def _usable(h: HostState) -> list[NodeState]:
    return [n for n in h.nodes if n.package in h.usable_packages]


def _mem_capacity_mib(h: HostState, rules: Rules, huge: bool = True) -> int:
    """What the usable NUMA nodes can still give in the spec's page size (normal
    memory only when the node has no hugepage memory)."""
    total = 0
    mems = {n.id: n.mem for n in _usable(h)}
    for m in mems.values():
        if not rules.page_kib or not huge:
            total += m.free_mib
        elif rules.page_kib in m.pages_free:
            page_mib = rules.page_kib // 1024
            total += m.pages_free[rules.page_kib] * page_mib
            total += m.free_mib // page_mib * page_mib
    return total


def _where(rules: Rules) -> str:
    return " in sockets it may hold whole (partition hpc)" if rules.hpc else ""


def _pinnable(h: HostState, wants: list[Want]) -> int:
    """The CPUs ``h`` could pin for this cluster before planning began."""
    placed = set(h.placed)
    return h.free_dedicated + sum(x.vcpus for x in wants if x.dedicated and x.name in placed)


def does_not_fit(w: Want, states: list[HostState], rules: Rules, wants: list[Want]) -> DoesNotFit:
    """The error for node ``w`` fitting nowhere: the whole cluster's CPU shortfall
    first when there is one (what to change), else what ``w`` lacks."""
    total = sum(x.vcpus for x in wants if x.dedicated)
    cap = sum(_pinnable(h, wants) for h in states)
    alone = w.vcpus <= max(_pinnable(h, wants) for h in states)  # else w itself is the problem
    if w.dedicated and total > cap and alone:
        hosts = (
            f"host {states[0].name!r} has" if len(states) == 1 else f"its {len(states)} hosts have"
        )
        return DoesNotFit(
            f"the cluster needs {total} dedicated CPUs (one per vCPU), {hosts} {cap}"
            f" free to pin{_where(rules)}",
            f'give it at most {cap} vCPUs in all, or pinning = "shared" under [tuning]',
        )
    return DoesNotFit(explain(w, states, rules, wants))


def explain(w: Want, states: list[HostState], rules: Rules, wants: list[Want]) -> str:
    """One sentence naming the node, what it needs and the best any host offers."""
    total_dedicated = sum(x.vcpus for x in wants if x.dedicated)
    if w.dedicated:
        best = max(states, key=lambda h: (h.free_dedicated, -states.index(h)))
        extra = 1 if rules.vm else 0
        if w.vcpus + extra > best.free_dedicated:
            if len(states) == 1:
                return (
                    f"{w.name} needs {w.vcpus} dedicated CPUs"
                    f"{' plus one for emulator threads' if extra else ''} on one host,"
                    f" host {best.name!r} has {best.free_dedicated} free{_where(rules)}"
                    f" (the cluster needs {total_dedicated} dedicated CPUs in all)"
                )
            return (
                f"{w.name} needs {w.vcpus} dedicated CPUs"
                f"{' plus one for emulator threads' if extra else ''} on one host,"
                f" the most any host has free is {best.free_dedicated}"
                f" (host {best.name!r}){_where(rules)}"
            )
    elif not any(shared_pool(h, n) for h in states for n in _usable(h)):
        return (
            f"{w.name} (pinning shared) needs host CPUs that no vCPU is pinned to,"
            f" and every usable CPU is pinned{_where(rules)}"
        )
    return _memory_reason(w, states, rules)


def _memory_reason(w: Want, states: list[HostState], rules: Rules) -> str:
    size = "1G" if rules.page_kib == 1048576 else "2M"
    if (
        rules.page_kib
        and w.huge_mib
        and not any(rules.page_kib in n.mem.pages_free for h in states for n in h.nodes)
    ):
        return f"no host has a {size} hugepage pool (use another tuning.hugepages size)"
    huge = bool(rules.page_kib and w.huge_mib)
    best = max(states, key=lambda h: _mem_capacity_mib(h, rules, huge))
    if not huge:
        kind = "memory"
    elif w.huge_mib == w.memory_mib:
        kind = f"{size} hugepages"
    else:
        kind = f"memory ({format_mib(w.huge_mib)} of it {size} hugepages)"
    return (
        f"{w.name} needs {format_mib(w.memory_mib)} of {kind} on the NUMA nodes of its"
        f" {w.vcpus} vCPUs; host {best.name!r} can give at most"
        f" {format_mib(_mem_capacity_mib(best, rules, huge))}{_where(rules)}"
        f" (free memory plus free pool pages)"
    )

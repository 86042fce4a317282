"""Placing one virtual node on one host (pure; mutates only the HostState).

Rules, after the tuning of seed 000 ("Guest Performance Tuning") and the
partitioning of seed 002:
- dedicated: each vCPU gets a host CPU of its own; whole cores are taken
  before split ones, so hyper-thread siblings stay in one virtual node; a
  node's vCPUs use as few host NUMA nodes as possible, inside one socket when
  they can.
- shared: the node floats over the CPUs no vCPU is pinned to.
- mirror: one guest cell per host NUMA node used, memory split like the
  vCPUs and bound strictly there; none: one guest cell on the home node.
- memory: a node's memory is normal memory and hugepages (all of a VM's,
  ``hugepage_memory`` of a container's); each guest cell takes its share of
  both. A cell fits when the host node's free memory covers its normal memory
  and the node's free pages plus the pages its remaining free memory can still
  give cover its hugepages.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpvc.plan.hoststate import CoreKey, HostState, MemState, NodeState
from hpvc.plan.model import PlannedNode


@dataclass(frozen=True)
class Want:
    """A virtual node to place."""

    index: int
    name: str
    role: str
    vcpus: int
    memory_mib: int
    dedicated: bool
    huge_mib: int = 0  # of memory_mib, backed by hugepages (the rest is normal memory)


@dataclass(frozen=True)
class Placement:
    host: str
    pins: tuple[int | None, ...]  # per vCPU
    vcpu_cell: tuple[int, ...]  # per vCPU: guest cell
    cells: tuple[tuple[int, int], ...]  # per guest cell: (host node, memory MiB)
    cpuset: tuple[int, ...]


@dataclass(frozen=True)
class Rules:
    vm: bool
    hpc: bool
    mirror: bool
    page_kib: int  # 0: no hugepages


def _pages(mib: int, page_kib: int) -> int:
    return mib * 1024 // page_kib


def huge_split(cell_mib: list[int], huge_mib: int, page_kib: int) -> list[int]:
    """MiB of hugepages in each guest cell: ``huge_mib`` split like the cells'
    memory, in whole pages (each cell's share is at most its memory)."""
    if not page_kib or not huge_mib:
        return [0] * len(cell_mib)
    return split(huge_mib, cell_mib, page_kib // 1024)


def _page(w: Want, r: Rules) -> int:
    """The page size of the node's hugepages; 0: it has none (all normal memory)."""
    return r.page_kib if w.huge_mib else 0


def mem_fits(mem: MemState, mib: int, huge_mib: int, page_kib: int) -> bool:
    """``mib`` of a cell, ``huge_mib`` of it hugepages of ``page_kib`` (0: a node
    without hugepages), fit in this host node."""
    normal = mib - huge_mib
    if normal > mem.free_mib:
        return False
    if not page_kib:
        return True
    if page_kib not in mem.pages_free:
        return False  # the host has no pool of this size at all
    page_mib = page_kib // 1024
    spare = (mem.free_mib - normal) // page_mib
    return _pages(huge_mib, page_kib) <= mem.pages_free[page_kib] + spare


def _take_mem(
    h: HostState, mem: MemState, mib: int, huge_mib: int, page_kib: int, seeded: bool = False
) -> None:
    mem.free_mib -= mib - huge_mib
    if not page_kib:
        return
    need = _pages(huge_mib, page_kib)
    from_pool = min(need, mem.pages_free.get(page_kib, 0))
    if page_kib in mem.pages_free:
        mem.pages_free[page_kib] -= from_pool
    mem.free_mib -= (need - from_pool) * (page_kib // 1024)
    key = (mem.id, page_kib)
    book = h.pages_seeded if seeded else h.pages_needed
    book[key] = book.get(key, 0) + need


def split(total: int, weights: list[int], unit: int) -> list[int]:
    """Split ``total`` (a multiple of ``unit``) in proportion to ``weights``."""
    units = total // unit
    if len(weights) == 1 and weights[0] > 0:
        return [units * unit]  # what the general case gives, the common case made cheap
    wsum = sum(weights)
    shares = [units * w // wsum for w in weights]
    rest = units - sum(shares)
    order = sorted(range(len(weights)), key=lambda i: (-(units * weights[i] % wsum), i))
    for i in order[:rest]:
        shares[i] += 1
    return [s * unit for s in shares]


def _take_cpus(h: HostState, node: NodeState, count: int) -> list[int]:
    """Take ``count`` free CPUs of a slot, whole cores first, siblings together."""
    cores = node.cores
    picked: list[int] = []

    def grab(key: CoreKey, n: int) -> None:
        cpus = cores[key]
        picked.extend(cpus[:n])
        del cpus[:n]
        if not cpus:
            del cores[key]

    need = count
    for key in sorted(cores):
        if need == 0:
            break
        if len(cores[key]) == h.core_size.get(key, 1) and len(cores[key]) <= need:
            need -= len(cores[key])
            grab(key, len(cores[key]))
    while need:
        # Best fit for the remainder: the core with the fewest free CPUs that
        # still covers it (a split core before a whole one), else the largest.
        fitting = [k for k in cores if len(cores[k]) >= need]
        if fitting:
            key = min(fitting, key=lambda k: (len(cores[k]), k))
        else:
            key = max(cores, key=lambda k: (len(cores[k]), [-x for x in k]))
        n = min(need, len(cores[key]))
        need -= n
        grab(key, n)
    node.free_cpus -= count
    h.free_dedicated -= count
    h.dedicated.update(picked)
    h.emulator_spare -= count
    return picked


def _candidates(h: HostState) -> list[NodeState]:
    return [n for n in h.nodes if n.package in h.usable_packages]


def _pref(h: HostState, n: NodeState) -> int:
    """Sort key: slots in sockets the cluster already holds come first (hpc)."""
    return 0 if n.package in h.reserved else 1


Cell = tuple[MemState, int]  # a guest cell: host NUMA node memory, vCPUs in it


def cells_of(chosen: list[tuple[NodeState, int]]) -> list[Cell]:
    """Merge slots of one NUMA node (on several sockets) into one guest cell."""
    mems: dict[int, MemState] = {}
    counts: dict[int, int] = {}
    for n, k in chosen:
        mems.setdefault(n.id, n.mem)
        counts[n.id] = counts.get(n.id, 0) + k
    return [(mems[i], counts[i]) for i in mems]


def _choose_dedicated(h: HostState, w: Want, r: Rules) -> list[tuple[NodeState, int]] | None:
    """Pick CPU slots and how many vCPUs each takes, or None."""
    cands = _candidates(h)
    single = [
        n
        for n in cands
        if n.free_cpus >= w.vcpus and mem_fits(n.mem, w.memory_mib, w.huge_mib, _page(w, r))
    ]
    if single:
        best = min(single, key=lambda n: (_pref(h, n), n.free_cpus - w.vcpus, n.id, n.package))
        return [(best, w.vcpus)]
    # Spread: one socket if it can hold the node, else across sockets.
    by_pkg: dict[int, list[NodeState]] = {}
    for n in cands:
        if n.free_cpus:
            by_pkg.setdefault(n.package, []).append(n)
    groups = sorted(
        by_pkg.values(),
        key=lambda ns: (_pref(h, ns[0]), -sum(n.free_cpus for n in ns), ns[0].package),
    )
    for ns in [*(g for g in groups if sum(n.free_cpus for n in g) >= w.vcpus), None]:
        pool = ns if ns is not None else [n for g in groups for n in g]
        ordered = sorted(pool, key=lambda n: (_pref(h, n), -n.free_cpus, n.id, n.package))
        chosen = _fill(ordered, w.vcpus)
        if chosen is None:
            return None
        if _cells_fit(cells_of(chosen), w, r):
            return chosen
    return None


def _fill(pool: list[NodeState], need: int) -> list[tuple[NodeState, int]] | None:
    out: list[tuple[NodeState, int]] = []
    for n in pool:
        if need == 0:
            break
        k = min(n.free_cpus, need)
        out.append((n, k))
        need -= k
    return out if need == 0 else None


def _memory_shares(cells: list[Cell], w: Want, r: Rules) -> list[tuple[MemState, int, int]]:
    """(host node, MiB, hugepage MiB) per guest cell: all on the home node, or
    split like the vCPUs."""
    if not r.mirror:
        home = max(cells, key=lambda c: c[1])[0]
        return [(home, w.memory_mib, w.huge_mib)]
    unit = r.page_kib // 1024 if r.page_kib else 1
    shares = split(w.memory_mib, [k for _, k in cells], unit)
    huge = huge_split(shares, w.huge_mib, r.page_kib)
    return [(m, mib, hm) for (m, _), mib, hm in zip(cells, shares, huge, strict=True)]


def _cells_fit(cells: list[Cell], w: Want, r: Rules) -> bool:
    page = _page(w, r)
    return all(mem_fits(m, mib, hm, page) for m, mib, hm in _memory_shares(cells, w, r))


def _commit(
    h: HostState, chosen: list[tuple[NodeState, int]], w: Want, r: Rules
) -> tuple[tuple[tuple[int, int], ...], list[int]]:
    """Take the memory; return the cells (host node, MiB) and each slot's cell index."""
    cells = cells_of(chosen)
    shares = _memory_shares(cells, w, r)
    for m, mib, hm in shares:
        _take_mem(h, m, mib, hm, _page(w, r))
    index = {m.id: i for i, (m, _) in enumerate(cells)}
    slot_cell = [index[n.id] if r.mirror else 0 for n, _ in chosen]
    if r.hpc:
        h.reserved.update(n.package for n, _ in chosen)
    h.placed.append(w.name)
    return tuple((m.id, mib) for m, mib, _ in shares), slot_cell


def place_dedicated(h: HostState, w: Want, r: Rules) -> Placement | None:
    if w.vcpus > h.free_dedicated or (r.vm and h.emulator_spare - w.vcpus < 1):
        return None
    chosen = _choose_dedicated(h, w, r)
    if chosen is None:
        return None
    pins: list[int | None] = []
    for n, k in chosen:
        pins.extend(_take_cpus(h, n, k))
    cells, slot_cell = _commit(h, chosen, w, r)
    vcpu_cell = [c for (_, k), c in zip(chosen, slot_cell, strict=True) for _ in range(k)]
    cpuset = tuple(sorted(p for p in pins if p is not None))
    return Placement(h.name, tuple(pins), tuple(vcpu_cell), cells, cpuset)


def shared_pool(h: HostState, n: NodeState) -> list[int]:
    """CPUs of a slot that no vCPU is pinned to (where shared nodes float)."""
    return [c for c in n.all_cpus if c not in h.dedicated]


def _shared_slots(h: HostState, w: Want, r: Rules) -> list[tuple[NodeState, list[int]]]:
    cands = []
    for n in _candidates(h):
        pool = shared_pool(h, n)
        # Without mirroring all memory sits on one node; with it, it is split later.
        if pool and (r.mirror or mem_fits(n.mem, w.memory_mib, w.huge_mib, _page(w, r))):
            cands.append((n, pool))
    cands.sort(
        key=lambda c: (
            _pref(h, c[0]),
            h.shared_load.get((c[0].id, c[0].package), 0) / len(c[1]),
            c[0].id,
            c[0].package,
        )
    )
    chosen: list[tuple[NodeState, list[int]]] = []
    have = 0
    for n, pool in cands:
        if chosen and (not r.mirror or have >= w.vcpus or len(chosen) >= w.vcpus):
            break
        chosen.append((n, pool))
        have += len(pool)
    return chosen


def place_shared(h: HostState, w: Want, r: Rules) -> Placement | None:
    slots = _shared_slots(h, w, r)
    if not slots:
        return None
    counts = split(w.vcpus, [len(p) for _, p in slots], 1) if len(slots) > 1 else [w.vcpus]
    used = [(n, pool, k) for (n, pool), k in zip(slots, counts, strict=True) if k]
    chosen = [(n, k) for n, _, k in used]
    if not _cells_fit(cells_of(chosen), w, r):
        return None
    cells, slot_cell = _commit(h, chosen, w, r)
    vcpu_cell = [c for (_, k), c in zip(chosen, slot_cell, strict=True) for _ in range(k)]
    for n, k in chosen:
        key = (n.id, n.package)
        h.shared_load[key] = h.shared_load.get(key, 0) + k
    cpuset = tuple(sorted(c for _, pool, _ in used for c in pool))
    return Placement(h.name, (None,) * w.vcpus, tuple(vcpu_cell), cells, cpuset)


def _unpin(h: HostState, slot: NodeState, cpu: int) -> bool:
    """Take a CPU out of a slot's pinnable CPUs; False if it was not there."""
    for key, cpus in list(slot.cores.items()):
        if cpu in cpus:
            cpus.remove(cpu)
            if not cpus:
                del slot.cores[key]
            slot.free_cpus -= 1
            if slot.package in h.usable_packages:
                h.free_dedicated -= 1
            return True
    return False


def node_huge_mib(node: PlannedNode) -> list[int]:
    """MiB of hugepages in each guest cell of a planned node (a plan of an older
    hpvc gives a container node all its memory in pages: its cells' all)."""
    cells = [c.memory_mib for c in node.numa]
    if node.hugepages is None:
        return [0] * len(cells)
    return huge_split(cells, node.hugepage_mib, node.hugepages.size_kib)


def seed(h: HostState, node: PlannedNode, r: Rules) -> None:
    """Account for a node that already runs here (scaling a live cluster).

    Its pinned CPUs are taken. A floating node of this cluster does not hold
    its CPUs: new nodes may pin them, and the planner shrinks its set after.
    """
    by_cpu = {c: n for n in h.nodes for c in n.all_cpus}
    if node.pinning == "dedicated":
        for cpu in node.cpuset:
            slot = by_cpu.get(cpu)
            if slot is not None and _unpin(h, slot, cpu):
                h.emulator_spare -= 1
            h.dedicated.add(cpu)
    else:
        for cell in node.numa:
            slots = [(n.id, n.package) for n in h.nodes if n.id == cell.host_node]
            if slots:
                h.shared_load[slots[0]] = h.shared_load.get(slots[0], 0) + len(cell.vcpus)
    mems = {n.id: n.mem for n in h.nodes}
    huge = node_huge_mib(node)
    page_kib = node.hugepages.size_kib if node.hugepages else 0
    for cell, hm in zip(node.numa, huge, strict=True):
        if cell.host_node in mems:
            _take_mem(h, mems[cell.host_node], cell.memory_mib, hm, page_kib, seeded=True)
    if r.hpc:
        h.reserved.update(by_cpu[c].package for c in node.cpuset if c in by_cpu)
    h.placed.append(node.name)

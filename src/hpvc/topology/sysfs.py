"""Read a host's :class:`Topology` from sysfs and procfs under an injectable root.

Every path is read relative to ``root`` (``hpvc.sysroot.HOST`` for this host, or a
``SysRoot``/path naming an extracted ``hwloc-gather-topology`` snapshot). Files may
be missing; what was assumed instead is recorded, one readable line per assumption,
in ``Topology.notes``.

Counting follows hwloc's Linux backend: PUs are the online CPUs; a core is a
group of thread siblings (``core_cpus``/``thread_siblings``), except that
siblings reporting different ``core_id`` values (AMD compute units) are one
core each; NUMA nodes are those in ``node/online`` (else the ``nodeN`` folders).
Packages follow ``physical_package_id``.

Like hwloc without ``--whole-system``, the topology holds only what this
process may use (its cpuset, ``hpvc.topology.allowed``) unless asked for the
whole system; either way ``allowed_cpus``/``allowed_mems`` say what that is.

hwloc's counting rules (thread siblings, AMD compute units, offline CPUs,
CPU-less and memory-less nodes, hugepage pools per node) are one reading of one
tree, so they stay in this one module; the file reader is ``files.py``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from hpvc.errors import TopologyError
from hpvc.sysroot import HOST, RootLike, as_root
from hpvc.topology.allowed import allowed_sets, allowed_view
from hpvc.topology.files import Reader
from hpvc.topology.model import Core, HugePool, NumaNode, Package, Topology
from hpvc.units import format_cpulist

_CPU = "sys/devices/system/cpu"
_NODE = "sys/devices/system/node"
_GLOBAL_HUGE = "sys/kernel/mm/hugepages"
_CPU_DIR = re.compile(r"^cpu(\d+)$")
_NODE_DIR = re.compile(r"^node(\d+)$")
_HUGE_DIR = re.compile(r"^hugepages-(\d+)kB$")
_FREE_FIELDS = ("MemFree", "Inactive(file)", "SReclaimable")
_THREAD_FILES = ("core_cpus_list", "thread_siblings_list", "core_cpus", "thread_siblings")
_PACKAGE_FILES = ("package_cpus_list", "core_siblings_list", "package_cpus", "core_siblings")


def _parse_meminfo(text: str) -> dict[str, int]:
    """``MemTotal: 123 kB`` or ``Node 0 MemTotal: 123 kB`` lines -> {field: number}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(":")
        words = right.split()
        if sep and left.split() and words and words[0].isdigit():
            out[left.split()[-1]] = int(words[0])
    return out


@dataclass
class _Cpu:
    """What sysfs says about one online CPU."""

    id: int
    package: int | None
    core_id: int | None
    threads: set[int] | None
    package_sets: list[tuple[str, set[int]]] = field(default_factory=list)


# ---------------------------------------------------------------- CPUs


def _present_cpus(r: Reader) -> list[int]:
    present = r.cpuset(f"{_CPU}/present")
    return sorted(present) if present is not None else r.entries(_CPU, _CPU_DIR)


def _online_cpus(r: Reader) -> list[int]:
    online = r.cpuset(f"{_CPU}/online")
    if online is not None:
        return sorted(online)
    dirs = r.entries(_CPU, _CPU_DIR)
    flags = {cpu: r.text(f"{_CPU}/cpu{cpu}/online") for cpu in dirs}
    if any(flag is not None for flag in flags.values()):
        r.note(
            f"no {_CPU}/online; took CPUs whose cpuN/online is not 0"
            " (a CPU without that file, like cpu0, counts as online)"
        )
        return [cpu for cpu, flag in flags.items() if flag != "0"]
    if dirs:
        r.note(f"no {_CPU}/online nor per-CPU online files; assumed every cpuN online")
    return dirs


def _read_cpu(r: Reader, cpu: int) -> _Cpu:
    topo = f"{_CPU}/cpu{cpu}/topology"
    if not r.path(topo).is_dir():
        r.assume("online but without a topology folder", "CPU", cpu)
    package = r.integer(f"{topo}/physical_package_id")
    if package is None or package < 0:
        package = r.cpuinfo(cpu, "physical id")
        if package is not None:
            r.assume("no physical_package_id; took 'physical id' from /proc/cpuinfo", "CPU", cpu)
    core_id = r.integer(f"{topo}/core_id")
    if core_id is None:
        core_id = r.cpuinfo(cpu, "core id")
    threads = next(
        (s for s in (r.cpuset(f"{topo}/{name}") for name in _THREAD_FILES) if s is not None),
        None,
    )
    package_sets = [(name, s) for name in _PACKAGE_FILES if (s := r.cpuset(f"{topo}/{name}"))]
    return _Cpu(cpu, package, core_id, threads, package_sets)


def _resolve_packages(r: Reader, cpus: dict[int, _Cpu]) -> None:
    """Give CPUs without a package id one, from their package sibling set, else 0."""
    known = [c.package for c in cpus.values() if c.package is not None]
    next_id = max(known, default=-1) + 1
    by_set: dict[frozenset[int], int] = {}
    for c in cpus.values():
        if c.package is not None:
            continue
        if c.package_sets:
            key = frozenset(c.package_sets[0][1])
            if key not in by_set:
                by_set[key], next_id = next_id, next_id + 1
            c.package = by_set[key]
            r.assume("no package id; grouped into packages by package sibling list", "CPU", c.id)
        else:
            c.package = 0
            r.assume("no package information; assumed package 0", "CPU", c.id)


def _check_packages(r: Reader, cpus: dict[int, _Cpu]) -> None:
    """Note where a package sibling file disagrees with the package ids (id wins)."""
    members: dict[int | None, set[int]] = defaultdict(set)
    for c in cpus.values():
        members[c.package].add(c.id)
    for c in cpus.values():
        for name, listed in c.package_sets:
            listed = listed & cpus.keys()
            if listed != members[c.package]:
                r.note(
                    f"cpu{c.id}: topology/{name} lists CPUs {format_cpulist(listed)}, but"
                    f" package {c.package} holds CPUs {format_cpulist(members[c.package])};"
                    " trusted physical_package_id (hwloc drops such a package)"
                )


def _core_members(r: Reader, c: _Cpu, cpus: dict[int, _Cpu]) -> set[int]:
    """The online CPUs sharing ``c``'s core (always including ``c``)."""
    if c.threads is not None:
        group = {t for t in c.threads if t in cpus and cpus[t].package == c.package} | {c.id}
        if len(group) > 1 and len({cpus[t].core_id for t in group}) > 1:
            r.assume(
                "thread siblings with different core_id (compute units); one core per"
                " thread, as hwloc counts them",
                "CPU",
                c.id,
            )
            return {c.id}
        return group
    if c.core_id is not None:
        r.assume("no thread sibling list; grouped threads by (package, core_id)", "CPU", c.id)
        return {t.id for t in cpus.values() if (t.package, t.core_id) == (c.package, c.core_id)}
    r.assume("no core information; each CPU counted as its own core", "CPU", c.id)
    return {c.id}


def _cores(r: Reader, cpus: dict[int, _Cpu]) -> dict[int, list[Core]]:
    """Package id -> its cores; every online CPU lands in exactly one core."""
    out: dict[int, list[Core]] = defaultdict(list)
    taken: set[int] = set()
    for cpu in sorted(cpus):
        if cpu in taken:
            continue
        c = cpus[cpu]
        group = (_core_members(r, c, cpus) - taken) | {cpu}
        taken |= group
        core_id = c.core_id
        if core_id is None:
            r.assume("no core_id; used the CPU number as core id", "CPU", cpu)
            core_id = cpu
        out[c.package or 0].append(Core(core_id, tuple(sorted(group))))
    return out


# ---------------------------------------------------------------- memory


def _memory(r: Reader, info: dict[str, int], node: int) -> tuple[int, int]:
    """(memory_mib, free_mib) from one meminfo; free = MemFree+Inactive(file)+SReclaimable."""
    if "MemTotal" not in info:
        r.assume("no MemTotal in meminfo; memory and free taken as 0", "node", node)
        return 0, 0
    total = info["MemTotal"] // 1024
    fields = [f for f in _FREE_FIELDS if f in info]
    if not fields:
        r.assume("no MemFree in meminfo; assumed all memory free", "node", node)
        return total, total
    if len(fields) < len(_FREE_FIELDS):
        r.assume(f"meminfo lacks some free fields; free = {' + '.join(fields)}", "node", node)
    return total, min(total, sum(info[f] for f in fields) // 1024)


def _pools(r: Reader, rel: str) -> list[HugePool] | None:
    """Hugepage pools from a ``hugepages/hugepages-<size>kB`` folder; None if absent."""
    sizes = r.entries(rel, _HUGE_DIR)
    if not sizes:
        return None
    pools = []
    for size in sizes:
        total = r.integer(f"{rel}/hugepages-{size}kB/nr_hugepages")
        free = r.integer(f"{rel}/hugepages-{size}kB/free_hugepages")
        if total is None:
            r.note(f"{rel}/hugepages-{size}kB: no nr_hugepages; pool ignored")
            continue
        if free is None:
            r.note(f"{rel}/hugepages-{size}kB: no free_hugepages; assumed 0 free")
        pools.append(HugePool(size, total, free or 0))
    return pools


def _meminfo_pool(r: Reader, info: dict[str, int], node: int) -> list[HugePool]:
    """The default-size pool from meminfo's HugePages_* lines, when its size is known."""
    size = _parse_meminfo(r.text("proc/meminfo") or "").get("Hugepagesize")
    if size is None or "HugePages_Total" not in info:
        r.assume("no hugepage information; no pools", "node", node)
        return []
    r.assume(f"no hugepages folder; took the {size}kB pool from meminfo", "node", node)
    return [HugePool(size, info["HugePages_Total"], info.get("HugePages_Free", 0))]


def _hugepages(r: Reader, node: int, info: dict[str, int], alone: bool) -> list[HugePool]:
    """A node's pools: its own folder, else (sole node) the system-wide one, else meminfo."""
    pools = _pools(r, f"{_NODE}/node{node}/hugepages")
    if pools is None and alone:
        pools = _pools(r, _GLOBAL_HUGE)
        if pools is not None:
            r.assume(f"no per-node hugepages; used {_GLOBAL_HUGE}", "node", node)
    if pools is None:
        pools = _meminfo_pool(r, info, node)
    return pools


# ---------------------------------------------------------------- NUMA nodes


def _node_ids(r: Reader) -> list[int]:
    """Online NUMA node ids (``node/online``, else the ``nodeN`` folders)."""
    dirs = r.entries(_NODE, _NODE_DIR)
    online = r.cpuset(f"{_NODE}/online")
    if online is None:
        return dirs
    for node in sorted(set(dirs) - online):
        r.note(f"node{node} has a folder but is not in {_NODE}/online; ignored")
    for node in sorted(online - set(dirs)):
        r.note(f"node{node} is online but has no folder; no CPUs or memory known for it")
    return sorted(online)


def _node_cpus(r: Reader, node: int) -> set[int]:
    base = f"{_NODE}/node{node}"
    for name in ("cpulist", "cpumap"):
        found = r.cpuset(f"{base}/{name}")
        if found is not None:
            return found
    r.assume("no cpulist or cpumap; took CPUs from the cpuN entries", "node", node)
    return {int(m.group(1)) for m in map(_CPU_DIR.match, r.listdir(base)) if m}


def _read_node(r: Reader, node: int, online: set[int], alone: bool) -> NumaNode:
    info = _parse_meminfo(r.text(f"{_NODE}/node{node}/meminfo") or "")
    memory, free = _memory(r, info, node)
    cpus = tuple(sorted(_node_cpus(r, node) & online))
    pools = _hugepages(r, node, info, alone)
    return NumaNode(node, cpus, memory, free, tuple(sorted(pools, key=lambda p: p.size_kib)))


def _whole_host_node(r: Reader, online: list[int]) -> NumaNode:
    """Node 0 holding every CPU, for roots without NUMA information."""
    r.note(f"no NUMA nodes under {_NODE}; assumed one node 0 with all CPUs and /proc/meminfo")
    info = _parse_meminfo(r.text("proc/meminfo") or "")
    memory, free = _memory(r, info, 0)
    pools = _pools(r, _GLOBAL_HUGE)
    if pools is None:
        pools = _meminfo_pool(r, info, 0)
    return NumaNode(0, tuple(online), memory, free, tuple(sorted(pools, key=lambda p: p.size_kib)))


def _numa_nodes(r: Reader, online: list[int]) -> list[NumaNode]:
    ids = _node_ids(r)
    if not ids:
        return [_whole_host_node(r, online)]
    nodes = [_read_node(r, n, set(online), len(ids) == 1) for n in ids]
    homeless = set(online).difference(*(n.cpus for n in nodes))
    if homeless:
        links = sorted(_linked_nodes(r, homeless))
        named = f" (their cpuN folders name node {format_cpulist(links)})" if links else ""
        r.note(
            f"CPUs {format_cpulist(homeless)} are online but in no online NUMA node{named};"
            " they belong to no node"
        )
    return nodes


def _linked_nodes(r: Reader, cpus: Iterable[int]) -> set[int]:
    """Node ids named by ``cpuN/nodeM`` entries (links are not followed)."""
    found: set[int] = set()
    for cpu in cpus:
        names = r.listdir(f"{_CPU}/cpu{cpu}")
        found.update(int(m.group(1)) for m in map(_NODE_DIR.match, names) if m)
    return found


# ---------------------------------------------------------------- assembly


def _packages(cores: dict[int, list[Core]], nodes: Iterable[NumaNode]) -> tuple[Package, ...]:
    out = []
    for pid in sorted(cores):
        cpus = {cpu for core in cores[pid] for cpu in core.cpus}
        local = tuple(sorted(n.id for n in nodes if cpus.intersection(n.cpus)))
        ordered = tuple(sorted(cores[pid], key=lambda c: (c.id, c.cpus)))
        out.append(Package(pid, local, ordered))
    return tuple(out)


def _open(root: RootLike) -> Reader:
    r = as_root(root)
    path = r.path
    if not path.is_dir():
        raise TopologyError(
            "cannot read topology",
            f"{path} is not a directory",
            "pass --root a folder holding sys/ and proc/, or leave it out for /",
        )
    return Reader(r)


def read_topology(root: RootLike = HOST, whole_system: bool = False) -> Topology:
    """Read packages, NUMA nodes, cores and online CPUs of the host at ``root``.

    Only the CPUs and NUMA nodes this process may use (``hpvc.topology.allowed``),
    unless ``whole_system``: then every online CPU and node, with what is allowed
    in ``allowed_cpus``/``allowed_mems``."""
    r = _open(root)
    online = _online_cpus(r)
    if not online:
        raise TopologyError(
            "cannot read topology",
            f"no CPUs found under {r.path(_CPU)}",
            "pass --root a folder holding sys/ and proc/ of a Linux host",
        )
    offline = sorted(set(_present_cpus(r)) - set(online))
    if offline:
        r.note(f"CPUs {format_cpulist(offline)} are present but offline; left out")
    cpus = {cpu: _read_cpu(r, cpu) for cpu in online}
    _resolve_packages(r, cpus)
    _check_packages(r, cpus)
    cores = _cores(r, cpus)
    nodes = sorted(_numa_nodes(r, online), key=lambda n: n.id)
    allowed_cpus, allowed_mems = allowed_sets(r, online, [n.id for n in nodes])
    whole = Topology(
        packages=_packages(cores, nodes),
        numa_nodes=tuple(nodes),
        online_cpus=tuple(online),
        notes=r.all_notes(),
        allowed_cpus=allowed_cpus,
        allowed_mems=allowed_mems,
    )
    return whole if whole_system else allowed_view(whole)


def offline_cpus(root: RootLike = HOST) -> tuple[int, ...]:
    """CPUs that are present (``cpu/present``, else ``cpuN`` folders) but not online."""
    r = _open(root)
    return tuple(sorted(set(_present_cpus(r)) - set(_online_cpus(r))))

"""What this process may use: the CPUs and memory nodes of its cpuset, and the
topology cut down to them.

``read_allowed`` reads, under the reader's root (the host, or a snapshot):

1. ``proc/self/status``: ``Cpus_allowed_list`` and ``Mems_allowed_list``, the
   process's CPU affinity and its cpuset's memory nodes (``taskset`` and
   ``numactl`` change them). ``hwloc-gather-topology`` does not save this file,
   so a snapshot has it only when someone put it there.
2. The cpuset cgroup, found the way hwloc's Linux backend finds it
   (``hwloc_linux__get_allowed_resources``, ``hwloc_find_linux_cgroup_mntpnt``
   and ``hwloc_read_linux_cgroup_name`` in hwloc/topology-linux.c): the first
   mount in ``proc/mounts`` that is cgroup2 with ``cpuset`` in its
   ``cgroup.controllers``, a ``cpuset`` filesystem, or cgroup v1 with the
   ``cpuset`` option (with ``noprefix`` its files are named like the cpuset
   filesystem's); the process's path in it from ``proc/self/cpuset``, else from
   the ``:cpuset:`` (v1) or ``::`` (v2) line of ``proc/self/cgroup``; then
   ``cpuset.cpus.effective``/``cpuset.mems.effective`` (v2),
   ``cpuset.cpus``/``cpuset.mems`` (v1) or ``cpus``/``mems`` (cpuset
   filesystem). A file that is missing restricts nothing, as in hwloc.

The allowed CPUs and nodes are the online ones that every source allows. hwloc
keeps a process's affinity apart from its allowed set; hpvc counts it, since a
cluster it starts may use only what the process itself may use:
``taskset -c 0 hpvc topology`` shows CPU 0 alone. ``allowed_view`` (pure) cuts a
whole-system topology down to its allowed part, which is what ``read_topology``
returns unless asked for the whole system.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from hpvc.errors import TopologyError
from hpvc.topology.files import Reader, parse_cpumask
from hpvc.topology.model import Core, HugePool, NumaNode, Package, Topology
from hpvc.units import format_cpulist, parse_cpulist

STATUS = "proc/self/status"
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Source:
    """What one source allows; None where it says nothing."""

    name: str  # "/proc/self/status", "cgroup cpuset /user.slice/..."
    cpus: frozenset[int] | None
    mems: frozenset[int] | None

    def cuts(self, cpus: set[int], mems: set[int]) -> bool:
        """True when it leaves out some of ``cpus`` or ``mems``."""
        left_cpus = cpus - self.cpus if self.cpus is not None else set()
        left_mems = mems - self.mems if self.mems is not None else set()
        return bool(left_cpus or left_mems)


@dataclass(frozen=True)
class Allowed:
    """The sources that say what this process may use."""

    sources: tuple[Source, ...] = ()

    @property
    def cpus(self) -> frozenset[int] | None:
        """The CPUs every source allows; None when none restricts CPUs."""
        sets = [s.cpus for s in self.sources if s.cpus is not None]
        return frozenset.intersection(*sets) if sets else None

    @property
    def mems(self) -> frozenset[int] | None:
        """The NUMA nodes every source allows; None when none restricts them."""
        sets = [s.mems for s in self.sources if s.mems is not None]
        return frozenset.intersection(*sets) if sets else None


def _field_set(r: Reader, fields: dict[str, str], name: str) -> set[int] | None:
    """``<name>_list`` (a CPU list) of /proc/self/status, else ``<name>`` (a mask)."""
    try:
        if f"{name}_list" in fields:
            return set(parse_cpulist(fields[f"{name}_list"]))
        if name in fields:
            return set(parse_cpumask(fields[name]))
    except ValueError:
        r.note(f"/{STATUS}: cannot parse {name}; ignored")
    return None


def _status(r: Reader) -> tuple[set[int] | None, set[int] | None]:
    fields: dict[str, str] = {}
    for line in (r.text(STATUS) or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return _field_set(r, fields, "Cpus_allowed"), _field_set(r, fields, "Mems_allowed")


def _join(*parts: str) -> str:
    """Absolute paths joined into one relative to the root: ``/a/``, ``/b`` -> ``a/b``."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


@dataclass(frozen=True)
class _Cpusets:
    """How one kind of mount that carries cpusets names its files, and which line
    of ``proc/self/cgroup`` holds the process's path in it: the line naming
    ``line`` among its controllers (cgroup2's line names none: ``0::PATH``)."""

    cpus: str
    mems: str
    line: str


_CGROUP2 = _Cpusets("cpuset.cpus.effective", "cpuset.mems.effective", "")
_CGROUP1 = _Cpusets("cpuset.cpus", "cpuset.mems", "cpuset")
_CPUSET_FS = _Cpusets("cpus", "mems", "cpuset")  # also cgroup v1 mounted with noprefix


def _cpuset_mount(r: Reader) -> tuple[_Cpusets, str] | None:
    """(kind, mount point) of the first mount that carries cpusets, hwloc's way:
    the one place that tells the kinds apart."""
    for line in (r.text("proc/mounts") or "").splitlines():
        words = line.split()
        if len(words) < 4:
            continue
        where = _OCTAL.sub(lambda m: chr(int(m[1], 8)), words[1])
        kind, options = words[2], set(words[3].split(","))
        if kind == "cgroup2":
            controllers = r.text(_join(where, "cgroup.controllers"))
            if controllers is not None and "cpuset" in controllers.split():
                return _CGROUP2, where
        elif kind == "cpuset":
            return _CPUSET_FS, where
        elif kind == "cgroup" and "cpuset" in options:
            return (_CPUSET_FS if "noprefix" in options else _CGROUP1), where
    return None


def _cgroup_name(r: Reader, kind: _Cpusets) -> str | None:
    """The process's cpuset path: ``proc/self/cpuset``, else its line of
    ``proc/self/cgroup`` (``0::PATH`` for cgroup2, ``N:...cpuset...:PATH`` for v1;
    hwloc takes the first of either, which on a host mounting both can be the
    wrong one)."""
    named = r.text("proc/self/cpuset")
    if named:
        return named.splitlines()[0]
    for line in (r.text("proc/self/cgroup") or "").splitlines():
        _, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if sep and sep2 and kind.line in controllers.split(","):
            return path
    return None


def _list_file(r: Reader, rel: str) -> set[int] | None:
    text = r.text(rel)
    if not text:
        return None
    try:
        return set(parse_cpulist(text))
    except ValueError:
        r.note(f"/{rel}: cannot parse {text!r}; ignored")
        return None


def _cgroup(r: Reader) -> tuple[set[int] | None, set[int] | None, str]:
    """(cpus, mems, the cgroup's path) of the process's cpuset cgroup."""
    mount = _cpuset_mount(r)
    if mount is None:
        return None, None, ""
    kind, where = mount
    name = _cgroup_name(r, kind)
    if name is None:
        return None, None, ""
    base = _join(where, name)
    cpus, mems = (_list_file(r, _join(base, f)) for f in (kind.cpus, kind.mems))
    return cpus, mems, name


def read_allowed(r: Reader) -> Allowed:
    """What ``proc/self/status`` and the cpuset cgroup under ``r``'s root allow."""
    status_cpus, status_mems = _status(r)
    cg_cpus, cg_mems, name = _cgroup(r)
    found = (
        Source(f"/{STATUS}", _frozen(status_cpus), _frozen(status_mems)),
        Source(f"cgroup cpuset {name}", _frozen(cg_cpus), _frozen(cg_mems)),
    )
    return Allowed(tuple(s for s in found if s.cpus is not None or s.mems is not None))


def _frozen(found: set[int] | None) -> frozenset[int] | None:
    return None if found is None else frozenset(found)


def _plural(word: str, items: list[int]) -> str:
    return f"{word}{'s' if len(items) > 1 else ''} {format_cpulist(items)}"


def allowed_sets(
    r: Reader, online: list[int], nodes: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(allowed CPUs, allowed NUMA nodes) among ``online`` and ``nodes``; a note
    under ``r`` says what and who leaves anything out."""
    found = read_allowed(r)
    allow_cpus, allow_mems = found.cpus, found.mems
    cpus = sorted(set(online) & allow_cpus) if allow_cpus is not None else list(online)
    mems = sorted(set(nodes) & allow_mems) if allow_mems is not None else list(nodes)
    said = ", ".join(s.name for s in found.sources if s.cuts(set(online), set(nodes)))
    if not cpus:
        r.note(f"{said}: allow none of the online CPUs; ignored")
        cpus = list(online)
    if not mems:
        r.note(f"{said}: allow none of the online NUMA nodes; ignored")
        mems = list(nodes)
    if cpus != list(online) or mems != list(nodes):
        r.note(
            f"this process may use only {_plural('CPU', cpus)} and the memory of"
            f" {_plural('NUMA node', mems)} ({said}); hpvc places nodes there alone"
            " ('hpvc topology --whole-system' shows the whole machine)"
        )
    return tuple(cpus), tuple(mems)


def _no_memory(node: NumaNode, cpus: tuple[int, ...]) -> NumaNode:
    """``node`` with only ``cpus`` and nothing free: its memory is not allowed."""
    pools = tuple(HugePool(p.size_kib, p.total, 0) for p in node.hugepages)
    return NumaNode(node.id, cpus, node.memory_mib, 0, pools)


def allowed_view(topo: Topology) -> Topology:
    """``topo`` cut down to its allowed CPUs and NUMA nodes (pure).

    Cores and packages keep their allowed CPUs and go when none is left. A NUMA
    node that is allowed keeps its memory (and its allowed CPUs, maybe none); a
    node that is not allowed but holds allowed CPUs stays for them, with no free
    memory or hugepages, so nothing is placed in its memory; any other node goes.
    """
    if not topo.restricted or not topo.whole_system:
        return topo
    cpus, mems = set(topo.allowed_cpus), set(topo.allowed_mems)
    nodes: list[NumaNode] = []
    for n in topo.numa_nodes:
        kept = tuple(c for c in n.cpus if c in cpus)
        if n.id in mems:
            nodes.append(replace(n, cpus=kept))
        elif kept:
            nodes.append(_no_memory(n, kept))
    packages: list[Package] = []
    for p in topo.packages:
        cores = tuple(
            Core(c.id, tuple(x for x in c.cpus if x in cpus)) for c in p.cores if cpus & set(c.cpus)
        )
        if not cores:
            continue
        mine = {x for c in cores for x in c.cpus}
        local = tuple(n.id for n in nodes if mine.intersection(n.cpus))
        packages.append(Package(p.id, local, cores))
    online = tuple(c for c in topo.online_cpus if c in cpus)
    if not online:
        raise TopologyError(
            "cannot read topology",
            "this process may use none of the host's online CPUs",
            "check its cpuset (taskset -p, /proc/self/status)",
        )
    return Topology(
        packages=tuple(packages),
        numa_nodes=tuple(nodes),
        online_cpus=online,
        notes=topo.notes,
        allowed_cpus=online,
        allowed_mems=tuple(sorted(mems)),
        whole_system=False,
    )

"""Slurm's abstract core numbers to this host's OS CPU numbers (pure).

The SPANK plugin hands ``hpvc node up --cpus`` the job's cores on this host,
``S_JOB_ALLOC_CORES`` (``0-3,8``). Those are not OS CPU ids: Slurm numbers cores
its own way, and slurmd translates them before it builds the job's cpuset. This
module does the same translation, following Slurm's source (SchedMD/slurm):

- ``src/slurmd/common/xcpuinfo.c``, ``xcpuinfo_hwloc_topo_get()``: slurmd loads
  the whole-system hwloc topology (``HWLOC_TOPOLOGY_FLAG_WHOLE_SYSTEM``, so CPUs
  outside its own cpuset count too) and builds ``block_map``, abstract CPU ->
  OS CPU: sockets that hold cores in hwloc's logical order, the cores of each
  socket in logical order, the hardware threads (PUs) of each core in logical
  order; abstract CPU = core index x threads per core + thread index.
- same file, ``xcpuinfo_abs_to_mac()``: abstract core ``i`` stands for abstract
  CPUs ``i * actual_threads + t`` for ``t < ThreadsPerCore``, each mapped
  through ``block_map``: all the hardware threads of that core.
- ``src/plugins/task/cgroup/task_cgroup_cpuset.c`` turns the job's cores
  (``job->job_alloc_cores``, which ``spank_get_item(S_JOB_ALLOC_CORES)`` returns,
  ``src/common/plugstack.c``) into the job's cpuset with ``xcpuinfo_abs_to_mac``.
- ``src/slurmd/slurmd/slurmd.c``, ``_read_config()``: a node defined only by
  ``CPUs=<number of PUs>`` (slurm.conf then takes Sockets=CPUs and
  CoresPerSocket=ThreadsPerCore=1) makes slurmd count every hardware thread as
  a core (sockets = CPUs, cores = threads = actual threads = 1): abstract core
  ``i`` is then PU ``i`` in the same logical order. Pass ``threads_per_core=1``
  for such a node.

hwloc's logical order walks its tree, each object's children sorted by their
lowest CPU. slurmd drops L1/L2 (and L4/L5) caches from that tree
(``xcpuinfo_hwloc_topo_load``), so cores sharing an L2 are not grouped: with
packages in order of their lowest CPU and the cores of each package in order of
their lowest CPU, abstract core ``i`` is hwloc's ``Core L#i`` (one thread per
core: ``PU L#i``). The tests check this against ``lstopo --whole-system`` with
slurmd's filters on every snapshot. On a host whose sockets interleave (socket
0 = CPUs 0,2,4..., socket 1 = 1,3,5...) with hyper-threads, core 1 is therefore
the second core of socket 0, with both its threads, not CPU 1.

Limits: slurmd's tree keeps L3 caches and dies, which order cores by group
first; that equals the order above wherever each group's cores are numbered
before the next group's (true of the snapshots and of usual x86 numbering),
and this topology model does not record those groups. Slurm assumes every core
has as many threads; on a hybrid CPU (P-cores with two threads, E-cores with
one) slurmd drops the E-cores by default, where this mapping keeps counting
them after the P-cores (which come first, so their numbers agree). A slurm.conf
giving ThreadsPerCore=1 with the real core count (each job then gets the first
thread of each core) is not modelled: the whole core is returned.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpvc.errors import InputError, TopologyError
from hpvc.topology.model import Topology
from hpvc.units import format_cpulist


def slurm_cores(topo: Topology) -> list[tuple[int, ...]]:
    """The host's cores in Slurm's abstract order, each as its CPUs in thread order."""
    packages = sorted(topo.packages, key=lambda p: min(p.cpus, default=-1))
    return [
        tuple(sorted(core.cpus))
        for p in packages
        for core in sorted(p.cores, key=lambda c: min(c.cpus, default=-1))
        if core.cpus
    ]


def _units(topo: Topology, threads_per_core: int | None) -> tuple[list[tuple[int, ...]], str]:
    """What each abstract index names (cores, or PUs one by one) and its word."""
    cores = slurm_cores(topo)
    widths = {len(c) for c in cores}
    if threads_per_core is None or widths == {threads_per_core}:
        return cores, "core"
    if threads_per_core == 1:
        return [(cpu,) for core in cores for cpu in core], "PU"
    have = "/".join(map(str, sorted(widths)))
    raise InputError(
        f"Slurm ThreadsPerCore={threads_per_core}",
        f"this host's cores have {have} hardware threads",
        "give 1 where slurm.conf counts every hardware thread as a core, else leave it out",
    )


def os_cpus(topo: Topology, cores: Sequence[int], threads_per_core: int | None = None) -> set[int]:
    """The OS CPU ids of Slurm's abstract ``cores`` (S_JOB_ALLOC_CORES) on this host.

    ``topo`` must be the whole system (``read_topology(root, whole_system=True)``),
    as slurmd numbers every core of the machine, not only those this process may
    use. Each index gives all the hardware threads of its core; with
    ``threads_per_core=1`` (slurm.conf counts hardware threads as cores: the node
    is described by ``CPUs=<number of PUs>`` alone, so Sockets=CPUs and
    ThreadsPerCore=1) each index is one PU. ``None`` (or the host's real threads
    per core) means slurm.conf describes the hardware. Raises InputError for an
    index that is not a core (or PU) of this host.
    """
    if not topo.whole_system:
        raise TopologyError(
            "Slurm cores",
            "the topology leaves out CPUs this process may not use, but Slurm numbers"
            " every core of the host",
            "read it with read_topology(root, whole_system=True)",
        )
    units, word = _units(topo, threads_per_core)
    bad = sorted({i for i in cores if not 0 <= i < len(units)})
    if bad:
        named = format_cpulist(bad) if bad[0] >= 0 else ",".join(map(str, bad))
        raise InputError(
            f"Slurm cores {named}",
            f"this host has {len(units)} {word}s, numbered 0-{len(units) - 1} by Slurm",
            "check this node's CPUs/Sockets/CoresPerSocket/ThreadsPerCore in slurm.conf"
            " against slurmd -C",
        )
    return {cpu for i in cores for cpu in units[i]}

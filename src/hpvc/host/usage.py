"""CPU time used so far: the whole host's (/proc/stat) and one cgroup's (cpuacct, cpu.stat).

Read-only counters that only grow; a caller takes two readings and divides the
difference by the wall time between them. Every reader takes an injectable
``root`` and answers None where the kernel does not say (a cgroup that is gone,
a controller that is not mounted), never raising for that.
"""

from __future__ import annotations

import os

from hpvc.host.blkio import read_text
from hpvc.host.cgroupfs import find_manager
from hpvc.host.command import at
from hpvc.sysroot import HOST, RootLike


def clock_ticks() -> int:
    """Ticks per second of /proc/stat's counters (``USER_HZ``)."""
    return os.sysconf("SC_CLK_TCK")


def parse_proc_stat(text: str, tick: int) -> tuple[float | None, float | None]:
    """Busy (user, nice, system, irq, softirq) and stolen seconds of /proc/stat's ``cpu``
    line; (None, None) when the line is not there."""
    first = text.split("\n", 1)[0].split()
    if len(first) < 9 or first[0] != "cpu":
        return None, None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    return (user + nice + system + irq + softirq) / tick, steal / tick


def host_cpu_seconds(root: RootLike = HOST) -> tuple[float | None, float | None]:
    """Busy and stolen CPU seconds of the whole host so far, from /proc/stat."""
    return parse_proc_stat(read_text(at(root, "/proc/stat")) or "", clock_ticks())


def cgroup_cpu_seconds(path: str, root: RootLike = HOST) -> float | None:
    """CPU seconds the cgroup at ``path`` (``/hpvc/c1/compute0``, relative to the
    hierarchy's mount) used so far: v1 ``cpuacct.usage``, v2 ``cpu.stat``."""
    m = find_manager(root)
    return m.cpu_seconds(path) if m is not None else None

"""Native Spark held to the CPUs Slurm gave the job: the fair native side of
``hpvc bench spark --slurm`` (issue 31 Figures).

hpvc pins each host's share of a job to the CPUs Slurm gave the job on that
host (``hpvc node up --cpus``, docs/slurm.md). On the Slurm test cluster the
hosts are namespaces of one machine and share its CPUs; each host's slurmd
numbers them from 0, so ``sbatch -N3`` with one task per host gets the same
CPU on every host, and the whole job runs on one CPU of the machine while an
unpinned native Spark uses all of them. ``native-pinned`` runs the same
native daemons held, place by place, to exactly the CPUs the job's share on
that host was planned on (its record's plan): the master and the driver to
the first host's, worker ``i`` to host ``i``'s, as head0, compute0 and
compute``i`` are.

The daemons stay up for the whole run (their start is not timed); pinning
moves every thread of each daemon JVM (``taskset -a -p``) and the driver is
started under ``taskset -c``. The executors are new JVMs per application,
forked by the (pinned) workers, so they start on the pinned CPUs and size
their thread pools to them, as the job's do. ``taskset`` is util-linux's;
this module reads no ``/proc`` itself (architecture rule 2).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from hpvc.errors import HpvcError
from hpvc.slurm.policy import parse_share_name
from hpvc.units import format_cpulist

if TYPE_CHECKING:
    from hpvc.bench.slurm.cluster import SlurmCluster
    from hpvc.spark.native import NativeSpark


def share_cpus(cluster: SlurmCluster, job: int) -> dict[str, tuple[int, ...]]:
    """Per host, the CPUs the nodes of ``job``'s share there may run on (from
    its record's plan); a host without a share of the job is left out."""
    out: dict[str, tuple[int, ...]] = {}
    for host in cluster.hosts:
        store = cluster.store(host)
        for name in store.names():
            parsed = parse_share_name(name)
            rec = store.load(name) if parsed and parsed[0] == job else None
            if rec is None:
                continue
            cpus = {c for n in rec.the_plan().nodes for c in (*n.cpuset, *n.emulator_cpus)}
            out[host] = tuple(sorted(set(out.get(host, ())) | cpus))
    return out


def place_cpus(cpus: dict[str, tuple[int, ...]], hosts: Sequence[str]) -> list[str]:
    """The CPU list (``taskset -c``'s) of each place, in ``hosts``' order."""
    missing = [h for h in hosts if not cpus.get(h)]
    if missing:
        raise HpvcError("native-pinned", f"no CPUs recorded for the job's share on {missing}")
    return [format_cpulist(cpus[h]) for h in hosts]


def _taskset(cpulist: str, pid: int) -> None:
    r = subprocess.run(["taskset", "-a", "-p", "-c", cpulist, str(pid)],
                       capture_output=True, text=True, check=False)  # fmt: skip
    if r.returncode != 0:
        raise HpvcError("taskset", f"pid {pid} to {cpulist}: {r.stderr.strip()[-200:]}")


def _place_of(daemon: str, places: int) -> int:
    """Where a daemon of NativeSpark runs: the master at place 0, worker-i at i."""
    if daemon == "master":
        return 0
    return int(daemon.removeprefix("worker-")) % places


@contextmanager
def pinned(native: NativeSpark, cpulists: list[str]) -> Iterator[None]:
    """``native``'s daemons and its next drivers held to ``cpulists`` (one per
    place) inside the block; back on every CPU of this process's after it."""
    everywhere = format_cpulist(sorted(os.sched_getaffinity(0)))
    before = list(native.places)
    try:
        for d in native.daemons:
            _taskset(cpulists[_place_of(d.name, len(cpulists))], d.proc.pid)
        native.places = [(a, [*p, "taskset", "-c", cpulists[i]]) for i, (a, p) in enumerate(before)]
        yield
    finally:
        native.places = before
        for d in native.daemons:
            if d.proc.poll() is None:
                _taskset(everywhere, d.proc.pid)

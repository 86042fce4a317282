"""A node that shares an ivshmem region, moved on its own host (issues 27 and 29).

The VMs of a cluster on one host share one ivshmem region (a file in /dev/shm,
``hpvc.host.ivshmem``), which ``ivshmem-plain,master=on`` lets QEMU migrate
like RAM. A move on the same host keeps the guest co-resident with its peers:
the target maps the same file, and the job goes on over the region. But the
target writes the region's pages from the stream into that file as they
arrive, and the stream holds them as they were when sent: a peer guest (or
the moving one) that wrote the region meanwhile would see its writes undone.
So, for the copy, every guest that maps the region is stopped (``paused``):
the peers over QMP here, the moving guest by ``migration.start(stop=True)``.
Nothing writes the region until the target runs, so what the stream puts back
is what the file already holds. The peers' pause is the copy's length; they
are resumed whatever happens (``cont``, also on failure).

A node that leaves the host leaves the region first instead
(``hpvc.backends.qemu.across``, ``hpvc.host.region_departure``): its ranks'
pairs go on over TCP, and the target gives it a region of its own.
Architecture: docs/architecture.md (``backends/``); docs/vms.md "Live migration".
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from hpvc.backends.base import ClusterEnv
from hpvc.backends.qemu.across import qmp_socket
from hpvc.backends.qemu.backend import QemuBackend
from hpvc.backends.vm import migration
from hpvc.errors import HpvcError
from hpvc.host import procfs
from hpvc.plan import Plan
from hpvc.progress import Progress

REGION_RE = re.compile(r"(?:^|,)id=ivshmem0,mem-path=([^,]+)")


def region_of(argv: Sequence[str]) -> str | None:
    """The ivshmem region file a QEMU command line maps, or None."""
    for arg in argv:
        m = REGION_RE.search(arg)
        if m and arg.startswith("memory-backend-file,"):
            return m.group(1)
    return None


def peers(
    backend: QemuBackend, env: ClusterEnv, plan: Plan, node: str, region: str
) -> dict[str, int]:
    """The running QEMUs (node name -> PID) of ``plan``'s other nodes here that map ``region``."""
    out = {}
    for other in plan.nodes:
        if other.name == node:
            continue
        pid = backend.live_pid(env, plan, other)
        if pid is not None and region_of(procfs.cmdline(pid) or []) == region:
            out[other.name] = pid
    return out


@contextmanager
def paused(
    env: ClusterEnv, plan: Plan, pids: dict[str, int], progress: Progress
) -> Iterator[list[str]]:
    """The guests ``pids`` (node name -> QEMU) stopped for the block, resumed after,
    every one even when one fails; the list yielded is then filled with the ones
    left paused (never raised here: after a switch-over the caller must not undo
    the move for it)."""
    runs = {n: migration.socket_runner(qmp_socket(env, plan, n), p) for n, p in pids.items()}
    stopped: list[str] = []
    left: list[str] = []
    try:
        for n, run in runs.items():
            run("stop")
            stopped.append(n)
        if stopped:
            progress(f"region peers {', '.join(stopped)}: paused for the copy")
        yield left
    finally:
        for n in stopped:
            try:
                runs[n]("cont")
            except HpvcError as e:
                left.append(f"{n} ({e.why})")
        if stopped:
            progress(f"region peers {', '.join(stopped)}: resumed")

"""What container clusters leave when their record is lost, for ``hpvc gc``.

Containers ``hpvc-<cluster>-<node>`` (as crun lists them) and the namespace
holders of clusters whose nodes share memory (``unshare`` processes with
``$HPVC_HOLDER=<cluster>`` in their environment). They are removed by the
code their journals' undo runs (``hpvc.backends.crun.container``); the
network namespaces, veths, cgroups and mounts of a container cluster are
every cluster's kind of leftover (``hpvc.host.orphans``).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from hpvc.backends.crun import container as ct
from hpvc.host import procfs
from hpvc.host.orphans import Keep, Orphan

CONTAINER = "container"
HOLDER = "holder"


def _containers(keep: Keep, prefix: str) -> list[Orphan]:
    crun = shutil.which(ct.RUNTIME)
    if crun is None:
        return []  # no crun here: no container either
    r = subprocess.run([crun, "list", "-q"], capture_output=True, text=True, check=False)
    return [Orphan(CONTAINER, cid) for cid in r.stdout.split() if keep.stray(cid, prefix)]


def _holders(keep: Keep, prefix: str) -> list[Orphan]:
    out: list[Orphan] = []
    for pid in procfs.pids():
        cluster = procfs.environ(pid).get(ct.HOLDER_ENV)
        args = procfs.cmdline(pid) or [""]
        if cluster is None or os.path.basename(args[0]) != "unshare":
            continue
        if cluster.startswith(prefix) and cluster not in keep.clusters:
            out.append(Orphan(HOLDER, str(pid), cluster))
    return out


def find(keep: Keep, prefix: str) -> list[Orphan]:
    """Containers, then holders, of clusters starting with ``prefix`` that ``keep`` lacks."""
    return [*_containers(keep, prefix), *_holders(keep, prefix)]


def remove(o: Orphan) -> None:
    """Remove one of ``find``'s orphans (HpvcError when crun refuses)."""
    if o.kind == CONTAINER:
        ct.delete_container(o.name, check=True)
    elif o.kind == HOLDER:  # still a holder of that cluster: not a reused PID
        ct.kill_holder(int(o.name), lambda p: procfs.environ(p).get(ct.HOLDER_ENV) == o.detail)
    else:
        raise ValueError(f"not an orphan of {__name__}: {o.kind} {o.name}")

"""What VM clusters leave running when their record is lost, for ``hpvc gc``.

QEMU processes hpvc named: ``-name hpvc-<cluster>-<node>,...`` as this
backend starts them, ``-name guest=hpvc-<cluster>-<node>,...`` as libvirt
starts hpvc's domains. They are stopped as their journal's undo stops them
(``hpvc.backends.qemu.process.stop_qemu``: SIGTERM, then SIGKILL, each only
while the PID still runs that ``-name``). Taps and the cluster's other host
objects are every cluster's kind of leftover (``hpvc.host.orphans``).
"""

from __future__ import annotations

import itertools
import os

from hpvc.backends.qemu.process import stop_qemu
from hpvc.host import procfs
from hpvc.host.orphans import Keep, Orphan

QEMU = "qemu"


def _names(args: list[str]) -> dict[str, str]:
    """Node name (``hpvc-<cluster>-<node>``) -> the ``-name`` value it came from."""
    values = (b for a, b in itertools.pairwise(args) if a == "-name")
    return {v.split(",")[0].removeprefix("guest="): v for v in values}


def find(keep: Keep, prefix: str) -> list[Orphan]:
    """QEMU processes of clusters starting with ``prefix`` that ``keep`` lacks."""
    out: list[Orphan] = []
    for pid in procfs.pids():
        args = procfs.cmdline(pid) or []
        if not args or "qemu-system" not in os.path.basename(args[0]):
            continue
        out += [Orphan(QEMU, str(pid), n) for n in _names(args) if keep.stray(n, prefix)]
    return out


def remove(o: Orphan) -> None:
    """Stop one of ``find``'s QEMUs (HpvcError when it outlives SIGKILL); a PID that
    runs another program now is left alone."""
    if o.kind != QEMU:
        raise ValueError(f"not an orphan of {__name__}: {o.kind} {o.name}")
    pid = int(o.name)
    value = _names(procfs.cmdline(pid) or []).get(o.detail)
    if value is not None:
        stop_qemu(pid, value, None)

"""A node's own mount namespace: the flags of its root.

A tenant's container node (a Slurm share, run for an ordinary user) has its
root mounted nosuid,nodev, so a setuid binary of the image (su, mount,
passwd) or a device node gives a user inside nothing. The overlay is mounted
so on the host, but crun binds the root over itself without those flags: the
root is remounted inside the node's mount namespace after ``crun create`` and
before ``crun start``, when nothing runs there yet.

No journal entry: the change lives in the node's mount namespace and goes
with it; the host's own mounts are not touched.
"""

from __future__ import annotations

import subprocess
import sys

from hpvc.errors import HpvcError
from hpvc.host.procfs import PROC

HARDENED = ("nosuid", "nodev")
_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND = 0x2, 0x4, 0x20, 0x1000
# Run in a process of its own: setns() into a mount namespace wants a
# single-threaded caller. Remounting a bind keeps it read-write.
_REMOUNT_ROOT = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CLOEXEC)
flags = ctypes.c_ulong({_MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV})
if libc.setns(fd, {_CLONE_NEWNS}) != 0 or libc.mount(None, b"/", None, flags, None) != 0:
    sys.exit(os.strerror(ctypes.get_errno()))
"""


def root_options(pid: int) -> set[str]:
    """The per-mount options of "/" as process ``pid`` sees it (the top mount there)."""
    found: set[str] = set()
    for line in (PROC / str(pid) / "mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[4] == "/":
            found = set(fields[5].split(","))
    return found


def harden_root(pid: int) -> None:
    """Remount the root of ``pid``'s mount namespace nosuid,nodev, and check it."""
    ns = PROC / str(pid) / "ns" / "mnt"
    r = subprocess.run(
        [sys.executable, "-c", _REMOUNT_ROOT, str(ns)], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(f"nosuid,nodev root of PID {pid}", why[-1] if why else "remount failed")
    missing = set(HARDENED) - root_options(pid)
    if missing:
        raise HpvcError(f"root of PID {pid}", f"still mounted without {','.join(sorted(missing))}")

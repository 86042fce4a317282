"""A VM node's disk file reopenable by its QEMU's own uid, for a live migration.

QEMU opens a node's disk as root, then drops to the cluster's uid (``-runas``,
docs/vms.md). At the end of a migration the source QEMU hands the disk over:
it drops its write permission, and QEMU 7.2's file driver then opens the
file again by its path, read-only (``openat(..., O_RDONLY|O_DIRECT)``); the
target QEMU likewise takes write access back. Under the cluster's uid that
open fails with EACCES (hpvc's state folders are root's alone), the source
fails the switch-over with ``bdrv_inactivate_all() failed`` and the guest
stays where it was (strace of the failing run in docs/slurm.md "Moving a VM
node to another host").

So, while a node moves, its QEMU's uid gets a POSIX ACL entry: search (``x``)
on each folder above the disk that not every user may search (the state
root's and hpvc's own, made 0700), read and write on the disk file; nothing
for any other uid, and no folder listing. The uid already
holds the disk open for writing, so this gives it nothing it did not have.
``setfacl`` (Debian package acl) rather than hand-built ``system.posix_acl_access``
attributes: its format and mask rules are the tool's to keep.

Undo kind (architecture rule 5): ``"disk-access"`` ``{path, dirs, uid}`` removes
the entries again. Architecture: docs/architecture.md (``host/``).
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

from hpvc.errors import HpvcError, MissingDependency
from hpvc.host.journal import Args, Journal, undoer


def closed_folders(path: Path) -> list[Path]:
    """The folders above ``path``, root first, that not every user may search
    (no ``o+x``): those a uid must be given search on to reach ``path``."""
    return [p for p in reversed(Path(path).parents) if not p.stat().st_mode & stat.S_IXOTH]


def _setfacl() -> str:
    found = shutil.which("setfacl")
    if found is None:
        raise MissingDependency("moving a VM node", "setfacl not found", "apt-get install acl")
    return found


def _run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        raise HpvcError("setfacl", why)


def grant(journal: Journal, path: Path, top: Path, uid: int) -> None:
    """Let ``uid`` reach ``path`` (search on each closed folder above it: hpvc's
    state root ``top`` and those under it, and any above it made 0700) and open
    it for reading and writing."""
    if Path(top) not in Path(path).parents:
        raise HpvcError(f"disk {path}", f"is not under {top}")
    setfacl = _setfacl()
    dirs = [str(p) for p in closed_folders(path)]
    journal.record("disk-access", path=str(path), dirs=dirs, uid=uid)
    if dirs:
        _run([setfacl, "-m", f"u:{uid}:x", *dirs])
    _run([setfacl, "-m", f"u:{uid}:rw", str(path)])


def revoke(path: Path, dirs: list[str], uid: int) -> None:
    """Remove ``grant``'s entries (of the paths still there)."""
    setfacl = shutil.which("setfacl")
    if setfacl is None:
        return
    there = [p for p in [*dirs, str(path)] if Path(p).exists()]
    if there:
        _run([setfacl, "-x", f"u:{uid}", *there])


@undoer("disk-access")
def _undo(args: Args) -> None:
    revoke(Path(args["path"]), [str(d) for d in args["dirs"]], int(args["uid"]))

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
on each folder from the state root down to the disk, read and write on the
disk file; nothing for any other uid, and no folder listing. The uid already
holds the disk open for writing, so this gives it nothing it did not have.
``setfacl`` (Debian package acl) rather than hand-built ``system.posix_acl_access``
attributes: its format and mask rules are the tool's to keep.

Undo kind (architecture rule 5): ``"disk-access"`` ``{path, top, uid}`` removes
the entries again. Architecture: docs/architecture.md (``host/``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hpvc.errors import HpvcError, MissingDependency
from hpvc.host.journal import Args, Journal, undoer


def chain(path: Path, top: Path) -> list[Path]:
    """The folders from ``top`` down to ``path``'s, ``top`` first (``path`` under ``top``)."""
    path, top = Path(path), Path(top)
    if top not in path.parents:
        raise HpvcError(f"disk {path}", f"is not under {top}")
    return [top, *reversed([p for p in path.parents if top in p.parents])]


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
    """Let ``uid`` reach ``path`` from ``top`` and open it for reading and writing."""
    setfacl = _setfacl()
    dirs = chain(path, top)
    journal.record("disk-access", path=str(path), top=str(top), uid=uid)
    _run([setfacl, "-m", f"u:{uid}:x", *map(str, dirs)])
    _run([setfacl, "-m", f"u:{uid}:rw", str(path)])


def revoke(path: Path, top: Path, uid: int) -> None:
    """Remove ``grant``'s entries (those of paths still there)."""
    setfacl = shutil.which("setfacl")
    if setfacl is None:
        return
    there = [p for p in [*chain(path, top), Path(path)] if p.exists()]
    if there:
        _run([setfacl, "-x", f"u:{uid}", *map(str, there)])


@undoer("disk-access")
def _undo(args: Args) -> None:
    revoke(Path(args["path"]), Path(args["top"]), int(args["uid"]))

"""A node's folder in hpvc's state directory, and its undo, for every backend.

``record`` journals the folder before anything is put in it; the undo
unmounts what a backend mounted in it (a container's root, a shared-memory
tmpfs) and removes it, and refuses any path outside a cluster's state.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.host.journal import Args, Journal, undoer
from hpvc.paths import CLUSTERS

MOUNTED_INSIDE = ("rootfs", "layer", "shm")  # rootfs before the layer under it


def umount(path: str) -> None:
    """Lazily unmount ``path`` if something is mounted there."""
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", path], capture_output=True, check=False)


def record(journal: Journal, path: Path) -> None:
    """Journal a node's folder (call before creating anything in it)."""
    journal.record("tree", path=str(path))


@undoer("tree")
def _undo_tree(args: Args) -> None:
    path = Path(args["path"])
    if CLUSTERS not in path.parts:  # only ever a cluster's own state directory
        raise HpvcError(f"refusing to remove {path}", "not under a cluster's state directory")
    for sub in MOUNTED_INSIDE:
        umount(str(path / sub))
    shutil.rmtree(path, ignore_errors=True)

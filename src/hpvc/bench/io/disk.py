"""The block-I/O benchmark's own disk: a sparse file on a loop device, ext4, mounted.

It is a throw-away state directory, so the nodes' files and the limits hpvc
puts on the state directory's disk are on a device nobody else uses. All of
it (clusters in it, mount, loop device, file) is undone on leaving
``loop_state``, also when the benchmark fails.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.errors import HpvcError
from hpvc.host import hwinfo
from hpvc.progress import Progress, quiet
from hpvc.store import Store

DISK_BYTES = 2 << 30


def _release(tmp: Path, mnt: Path, dev: str | None, mounted: bool, progress: Progress) -> str:
    """Tear down the clusters, unmount, detach, remove; return what failed ("" if none)."""
    if mounted:
        errors = common.teardown_all(Store(mnt), progress)
        if errors:
            return f"{errors[0]} (kept: {mnt} mounted from {dev})"
        progress(f"unmounting {mnt}")
        r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            return f"umount {mnt}: {r.stderr.strip()} (kept: {dev})"
    if dev is not None:
        r = subprocess.run(["losetup", "-d", dev], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            return f"losetup -d {dev}: {r.stderr.strip()} (kept: {tmp})"
    shutil.rmtree(tmp, ignore_errors=True)
    return ""


@contextmanager
def loop_state(progress: Progress = quiet) -> Iterator[tuple[Path, Store, str]]:
    """A state directory on a fresh loop device (sparse file, ext4); all undone at the end.

    Yields (temporary directory, store, loop device).
    """
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-bench-io-"))
    mnt, backing = tmp / "state", tmp / "disk.img"
    dev: str | None = None
    mounted = False
    failed = True
    try:
        with open(backing, "wb") as f:
            f.truncate(DISK_BYTES)
        dev = common.sh(["losetup", "-f", "--show", str(backing)], f"loop device for {backing}")
        progress(f"loop device {dev}: ext4 on a {DISK_BYTES >> 30} GiB sparse file")
        common.sh(["mkfs.ext4", "-q", "-F", dev], f"mkfs.ext4 {dev}")
        mnt.mkdir()
        common.sh(["mount", dev, str(mnt)], f"mount {dev}")
        mounted = True
        yield tmp, Store(mnt), dev
        failed = False
    finally:
        left = _release(tmp, mnt, dev, mounted, progress)
        if left and failed:
            progress(f"clean-up failed: {left}")
    if left:
        raise HpvcError("bench io: clean-up", left, f"HPVC_STATE_DIR={mnt} hpvc down NAME")


def device_facts(dev: str, tmp: Path) -> dict[str, Any]:
    """The loop device as the kernel shows it now (scheduler, direct-I/O of the loop)."""
    queue = hwinfo.block_queue(Path(dev).name)
    backing_fs = common.sh(["df", "--output=fstype", str(tmp)], "df").splitlines()[-1].strip()
    return {
        "device": dev,
        "major_minor": queue.major_minor,
        "kind": "loop device on a sparse file, ext4",
        "size_bytes": DISK_BYTES,
        "backing_file_fs": backing_fs,
        "loop_direct_io": queue.loop_direct_io,
        "scheduler": queue.scheduler,
        "rotational": queue.rotational,
    }

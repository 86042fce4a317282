"""Block I/O of a cluster's NFS server: its own blkio cgroup, its throttles, its counters.

The storage bandwidth coordinator (``hpvc.coordinator``, docs/io.md) limits
what each cluster's storage side may take of a shared disk. On that side the
I/O is done by the cluster's NFS server (NFS-Ganesha, ``hpvc.host.nfs_server``),
so the server runs in a cgroup of its own, beside the cluster's nodes:

    <blkio mount>/hpvc/<cluster>/nfs-server          (cgroup v1, as on these hosts)
    <cgroup2 mount>/hpvc/<cluster>/nfs-server        (v2)

``server_cgroup`` makes it (undo kind ``"io-server-cgroup"``, journaled in the
server node's journal before the server starts, so the undo runs after the
server is stopped) and returns the ``cgroup.procs`` file the server's launcher
joins. ``set_limits`` writes a device's read/write throttles (v1
``blkio.throttle.{read,write}_bps_device``, v2 ``io.max``); ``limits`` reads
them back; ``io_bytes`` reads the cgroup's own counters (v1
``blkio.throttle.io_service_bytes``, v2 ``io.stat``). Which files those are is
the cgroup manager's (``hpvc.host.cgroupfs``), chosen once from the layout.

What the kernel charges to this cgroup (measured on 6.18, docs/io.md): I/O the
server submits in its own context (O_DIRECT, O_SYNC, fsync), and, through a
loop device with direct I/O (hpvc's loop set-up), the loop's I/O to the disk
below it (the loop worker runs as the submitting cgroup since Linux 5.12).
Buffered writeback (the flusher threads) is charged to the root cgroup on v1.
``storage`` tells which device to throttle: the export's loop device when it
is a loop file system, else the disk. The v1 counters of a device appear only
once any cgroup has a throttle rule on it (blk-throttle is set up per disk on
first use).

Undo kind (architecture rule 5):

``"io-server-cgroup"`` ``{root, path, hierarchy, export, stable_writes, made_parents}``
    rmdir the server's cgroup (its throttles go with it), then the parents
    this call made if they are empty. A cgroup with tasks is kept and the
    undo raises ``HpvcError`` with their PIDs. ``export`` (the folder the
    server exports) and ``stable_writes`` are what the coordinator reads: the
    disk the cluster's data is on, and whether the server's writes are
    charged to its cgroup.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpvc.errors import HpvcError, InputError
from hpvc.host.blkio import block_device
from hpvc.host.blkio import read_text as _read
from hpvc.host.cgroupfs import find_manager
from hpvc.host.cgroupfs.base import CgroupManager, Version, mkdir, procs
from hpvc.host.cgroups import PARENT, check_name
from hpvc.host.command import at as _at
from hpvc.host.journal import Args, Journal, undoer
from hpvc.sysroot import HOST, RootLike

SERVER = "nfs-server"  # the cgroup's name under /hpvc/<cluster> (no node is named so)
KIND = "io-server-cgroup"
DIRECTIONS = ("read", "write")
Device = tuple[int, int]
_rmdir: Callable[[Path], None] = os.rmdir  # tests put a fake kernel's in
SETTLE_S = 5.0  # how long undo waits for exiting tasks to leave the cgroup


@dataclass(frozen=True)
class ServerCgroup:
    """A cluster's NFS-server cgroup as it is in the kernel."""

    cluster: str
    dir: Path  # the cgroup's folder, as this process reaches it (under the root)
    manager: CgroupManager = field(compare=False, repr=False)  # the host's layout

    @property
    def version(self) -> Version:
        return self.manager.version

    @property
    def procs(self) -> Path:
        return self.dir / "cgroup.procs"


def server_path(cluster: str) -> str:
    """``/hpvc/<cluster>/nfs-server``: the same in every layout."""
    return f"/{PARENT}/{cluster}/{SERVER}"


def _hierarchy(root: RootLike) -> tuple[CgroupManager, str]:
    """(manager, mount point) of the hierarchy that holds block I/O."""
    m = find_manager(root)
    mount = m.io_mount() if m is not None else None
    if m is None or mount is None:
        raise HpvcError(
            "storage bandwidth coordinator",
            "no blkio (v1) or io (v2) cgroup controller is mounted",
            "mount -t cgroup -o blkio cgroup /sys/fs/cgroup/blkio",
        )
    return m, mount


def server_cgroup(
    journal: Journal,
    cluster: str,
    *,
    export_dir: Path,
    stable_writes: bool = False,
    root: RootLike = HOST,
) -> Path:
    """Make the cgroup of ``cluster``'s NFS server (undo kind ``"io-server-cgroup"``);
    return its ``cgroup.procs``, for ``nfs_server.start(cgroup_procs=...)``.
    ``stable_writes`` (whether that server writes through) is only written down,
    for ``hpvc io status``."""
    check_name("cluster", cluster)
    m, mount = _hierarchy(root)
    rel = server_path(cluster)
    d = _at(root, mount) / rel.lstrip("/")
    chain = (d.parent.parent, d.parent, d)  # /hpvc and /hpvc/<cluster> exist after prepare
    made = [str(p) for p in chain[:2] if not p.is_dir()]
    journal.record(
        KIND,
        root=str(root),
        path=rel,
        hierarchy=mount,
        export=os.path.abspath(export_dir),
        stable_writes=stable_writes,
        made_parents=made,
    )
    for part in chain:
        mkdir(part)
    m.enable(chain[:2], ["io"])
    return d / "cgroup.procs"


def _settled(d: Path) -> list[int]:
    """The cgroup's tasks, once those on their way out had time to go: the
    server's undo (just before this one) ends its processes, and an exiting
    process (or its orphaned rpcbind, a zombie for a moment) is still listed."""
    deadline = time.monotonic() + SETTLE_S
    while (busy := procs(d)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return busy


@undoer(KIND, what=lambda a: f"NFS server cgroup {a['path']}")
def _undo_server_cgroup(args: Args) -> None:
    rel = str(args["path"]).strip("/")
    parts = rel.split("/")
    if len(parts) != 3 or parts[0] != PARENT or parts[2] != SERVER:
        raise HpvcError(f"undo cgroup {args['path']!r}", f"not /{PARENT}/<cluster>/{SERVER}")
    d = _at(Path(args["root"]), args["hierarchy"]) / rel
    if not d.is_dir():
        return
    busy = _settled(d)
    if busy:
        raise HpvcError(
            f"remove cgroup /{rel}",
            f"tasks are still in it ({' '.join(map(str, busy))})",
            "stop the cluster's NFS server (hpvc down stops it), then undo again",
        )
    try:
        _rmdir(d)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise HpvcError(f"remove cgroup /{rel}", e.strerror or str(e)) from e
    for parent in reversed(args.get("made_parents", [])):  # made here: gone when left empty
        with contextlib.suppress(OSError):
            _rmdir(Path(parent))


def find(cluster: str, root: RootLike = HOST) -> ServerCgroup | None:
    """The server cgroup of ``cluster``, when it exists."""
    check_name("cluster", cluster)
    m, mount = _hierarchy(root)
    d = _at(root, mount) / server_path(cluster).lstrip("/")
    return ServerCgroup(cluster, d, m) if d.is_dir() else None


def tasks(cg: ServerCgroup) -> list[int]:
    """PIDs in the cgroup (the server and its rpcbind)."""
    return procs(cg.dir)


# --- throttles and counters ----------------------------------------------------------


def key(device: Device) -> str:
    return f"{device[0]}:{device[1]}"


def set_limits(cg: ServerCgroup, device: Device, rates: dict[str, int | None]) -> None:
    """Throttle ``device`` for the cgroup: ``rates`` maps "read"/"write" to bytes/s,
    None for no limit. Only what differs from what the kernel holds is written."""
    have = limits(cg).get(key(device), {})
    for direction, value in rates.items():
        if direction not in DIRECTIONS:
            raise InputError(f"throttle {direction!r}", "want read or write")
        if value is not None and value < 1:
            raise InputError(f"throttle {direction} {value}", "want a positive rate")
        if have.get(direction) == value:
            continue
        cg.manager.set_bps(cg.dir, key(device), direction, value)
    now = limits(cg).get(key(device), {})
    wrong = {d: v for d, v in rates.items() if now.get(d) != v}
    if wrong:
        raise HpvcError(f"block I/O limits of {cg.dir}", f"the kernel holds {now}, not {rates}")


def limits(cg: ServerCgroup) -> dict[str, dict[str, int | None]]:
    """``{"254:0": {"read": bytes/s or None, "write": ...}}``: what the kernel holds."""
    return cg.manager.bps_limits(cg.dir)


def io_bytes(cg: ServerCgroup) -> dict[str, dict[str, int]]:
    """``{"254:0": {"read": bytes, "write": bytes}}`` the kernel charged to the
    cgroup since it was made (v1 ``blkio.throttle.io_service_bytes``, v2 ``io.stat``)."""
    return cg.manager.io_bytes(cg.dir)


# --- where a cluster's data is -------------------------------------------------------


@dataclass(frozen=True)
class Storage:
    """The block devices under an export: the whole disk the data ends on, and
    the loop device in between when the export is a loop file system."""

    disk: Device
    loop: Device | None = None

    def devices(self) -> tuple[Device, ...]:
        """The device to throttle: the loop when there is one (every byte of the
        server's file system passes it, submitted by the server itself, with or
        without direct I/O below), else the disk. One throttle, not both: two in
        a row delay each request twice at low rates (measured: -6% at 10 MB/s)."""
        return (self.loop,) if self.loop is not None else (self.disk,)


def storage(export_dir: Path, root: RootLike = HOST) -> Storage | None:
    """The disk under ``export_dir`` (through its loop device, if it is a loop
    file system); None on a file system with no block device (tmpfs, overlay)."""
    try:
        dev = os.stat(export_dir).st_dev
    except OSError:
        return None
    here = (os.major(dev), os.minor(dev))
    loop = _at(root, f"/sys/dev/block/{key(here)}/loop")
    backing = _read(loop / "backing_file")
    if backing is None:
        disk = block_device(export_dir, root)
        return Storage(disk) if disk is not None else None
    try:
        disk = block_device(Path(backing.removesuffix(" (deleted)")).parent, root)
    except OSError:
        disk = None
    return Storage(disk or here, here)

"""Shared-memory regions between co-resident VMs of a cluster (QEMU ivshmem-plain).

Every VM of a cluster on one host maps the same host file as the BAR 2 of an
``ivshmem-plain`` PCI device (``render.qemu`` adds the device when the render
context has ``ivshmem``); a write in one guest is read in the others (the
guest tool is ``hpvc-shm``, ``native/guest/shmtool.c``).

Each region has a small integer id, unique in its state directory, and lives in
``<dir>/hpvc-ivshmem-<id>``, where ``<dir>`` is this state directory's region
folder in /dev/shm (a tmpfs, so the region is memory, never disk): made by
``mkdtemp`` (``/dev/shm/hpvc-ivshmem.XXXXXXXX``, mode 0700, root's), its name
kept in ``<state_root>/ivshmem.dir`` and used again only while it is still a
real folder of hpvc's user that no one else may enter. /dev/shm is writable by
everyone: a fixed name there (the old ``/dev/shm/hpvc-ivshmem-<id>``, or a fixed
folder) can be taken first by any user, who so denied every region
(``touch /dev/shm/hpvc-ivshmem-{0..4095}``) or made QEMU map the user's file.
A name no one can guess, made by root with O_EXCL, cannot be taken first;
when the recorded folder is gone (a reboot) or is not what hpvc made, a new one
is made. The region goes in the cluster's hugetlbfs mount instead when the
caller gives one (root's, mode 0755) and the size is a multiple of its page
size. Ids are chosen under an flock on ``<state_root>/ivshmem.lock``; a live id
is a file ``<state_root>/ivshmem/<id>`` naming its cluster and backing file. An
id is never given out while its id file or its backing file exists; a freed id
may be given out again.

Journal kind ``"ivshmem"`` (architecture rule 5), recorded before the id file and the
backing file are made: ``{id, cluster, path, record, lock}``. Its undo removes
the backing file and then the id file, under the lock, but only while the id
file still names that cluster and path: an id that was never taken, or is
another cluster's by now, is left alone; the region folder goes with its last
region. A journal written by an older hpvc names ``/dev/shm/hpvc-ivshmem-<id>``:
the same undo frees it. The backing file is preallocated
(``posix_fallocate``), so a full /dev/shm or an empty hugepage pool is an
error here rather than a SIGBUS in a running VM later.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from hpvc.errors import HpvcError, InputError
from hpvc.host.journal import Args, Journal, undoer
from hpvc.locks import file_lock
from hpvc.paths import open_to_others, private_dir

MiB = 1 << 20
DEFAULT_MIB = 64  # a power of two: QEMU aborts on a BAR size that is not
MAX_MIB = 1 << 16
SHM_DIR = Path("/dev/shm")
PREFIX = "hpvc-ivshmem-"
LOCK_NAME = "ivshmem.lock"
IDS_DIR = "ivshmem"
DIR_RECORD = "ivshmem.dir"  # in the state root: the name of its region folder
DIR_PREFIX = "hpvc-ivshmem."  # a region folder in /dev/shm: hpvc-ivshmem.XXXXXXXX
MAX_IDS = 4096


def check_size(size_mib: int) -> None:
    """InputError unless ``size_mib`` is a power of two (the PCI BAR size) in range."""
    if not 1 <= size_mib <= MAX_MIB or size_mib & (size_mib - 1):
        raise InputError(
            f"ivshmem size {size_mib} MiB",
            "not a power of two from 1 to 65536 MiB (a PCI BAR)",
            f"use e.g. {DEFAULT_MIB}",
        )


def page_size(directory: Path) -> int:
    """Bytes per page of the file system at ``directory`` (a hugetlbfs: its huge page)."""
    return os.statvfs(directory).f_bsize


def _read_record(record: Path) -> tuple[str, str] | None:
    """(cluster, backing path) named by an id file, or None when there is none."""
    try:
        lines = record.read_text().splitlines()
    except FileNotFoundError:
        return None
    lines += ["", ""]  # a torn file still holds its id
    return lines[0], lines[1]


def live_ids(state_root: Path) -> dict[int, tuple[str, str]]:
    """Every live id on this state root -> (cluster, backing path)."""
    out: dict[int, tuple[str, str]] = {}
    ids = state_root / IDS_DIR
    for f in ids.iterdir() if ids.is_dir() else ():
        owner = _read_record(f) if f.name.isdigit() else None
        if owner is not None:
            out[int(f.name)] = owner
    return out


def find(state_root: Path, cluster: str) -> Path | None:
    """The backing file of the region ``cluster`` already holds, if any."""
    for _, (owner, path) in sorted(live_ids(state_root).items()):
        if owner == cluster and path:
            return Path(path)
    return None


def _private(path: Path) -> bool:
    """Is ``path`` a folder (not a link) of this process's user that no one else may enter?"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    mine = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    return mine and not open_to_others(path, st)  # an ACL: QEMUs' traversal


def region_dir(state_root: Path, shm_dir: Path) -> Path:
    """This state root's region folder in ``shm_dir``: the recorded one while it is
    still private, else a new one (mkdtemp: 0700, a name no one can take first).
    Call under the ids' lock."""
    record = state_root / DIR_RECORD
    try:
        found = Path(record.read_text().strip())
    except FileNotFoundError:
        found = None
    ours = found is not None and found.parent == shm_dir and found.name.startswith(DIR_PREFIX)
    if found is not None and ours and _private(found):
        return found
    made = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=shm_dir))
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    tmp.write_text(f"{made}\n")
    os.replace(tmp, record)
    return made


def _drop_if_empty(folder: Path) -> None:
    """Remove a region folder that holds no region any more (anything else stays)."""
    if folder.name.startswith(DIR_PREFIX) and _private(folder):
        try:
            folder.rmdir()
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise


def _backing_dir(size_mib: int, hugepage_dir: Path | None, shm_dir: Path) -> Path:
    if hugepage_dir is not None and (size_mib * MiB) % page_size(hugepage_dir) == 0:
        return hugepage_dir
    return shm_dir


def _free_id(state_root: Path, dirs: tuple[Path, ...]) -> int:
    """The smallest id with neither an id file nor a backing file in any of ``dirs``."""
    for i in range(MAX_IDS):
        taken = (state_root / IDS_DIR / str(i)).exists() or any(
            (d / f"{PREFIX}{i}").exists() for d in dirs
        )
        if not taken:
            return i
    raise HpvcError(
        "ivshmem", f"all {MAX_IDS} region ids are in use", "hpvc down clusters you no longer need"
    )


def _create(path: Path, size: int) -> bool:
    """Make ``path`` with ``size`` bytes preallocated; False if it exists already."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        path.unlink(missing_ok=True)
        why = "no free huge pages or memory" if e.errno in (errno.ENOSPC, errno.ENOMEM) else e
        raise HpvcError(
            f"ivshmem file {path}",
            f"cannot allocate {size // MiB} MiB: {why}",
            "free memory in that file system, or use a smaller region",
        ) from None
    finally:
        os.close(fd)
    return True


def allocate(
    journal: Journal,
    state_root: Path,
    cluster: str,
    size_mib: int,
    hugepage_dir: Path | None,
    *,
    shm_dir: Path | None = None,
) -> Path:
    """A new shared region of ``size_mib`` MiB for ``cluster``; returns its backing file.

    ``shm_dir`` (default /dev/shm) holds the state root's region folder, where a
    region goes unless ``hugepage_dir`` is given and ``size_mib`` is a multiple
    of its page size.
    """
    check_size(size_mib)
    private_dir(state_root)
    private_dir(state_root / IDS_DIR, tighten=True)  # its files name clusters
    lock = state_root / LOCK_NAME
    with file_lock(lock):
        shm = region_dir(state_root, shm_dir or SHM_DIR)
        where = _backing_dir(size_mib, hugepage_dir, shm)
        while True:
            n = _free_id(state_root, (shm, where))
            path, record = where / f"{PREFIX}{n}", state_root / IDS_DIR / str(n)
            journal.record(
                "ivshmem",
                id=n,
                cluster=cluster,
                path=str(path),
                record=str(record),
                lock=str(lock),
            )
            with open(record, "x") as f:  # under the lock: nobody else makes it
                f.write(f"{cluster}\n{path}\n")
            try:
                if _create(path, size_mib * MiB):
                    return path
            except BaseException:
                record.unlink(missing_ok=True)
                _drop_if_empty(shm)
                raise
            record.unlink()  # made just now by someone outside this state root: next id


@undoer("ivshmem")
def _undo(args: Args) -> None:
    record, lock = Path(args["record"]), Path(args["lock"])
    if not lock.parent.is_dir():
        return  # the state root is gone, and with it every id
    with file_lock(lock):
        if _read_record(record) != (args["cluster"], args["path"]):
            return  # never taken, already freed, or another cluster's now
        path = Path(args["path"])
        path.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        _drop_if_empty(path.parent)  # an older journal's /dev/shm is no region folder

"""The unprivileged uid each VM cluster's QEMUs run as (one uid per cluster).

QEMU starts as root, opens what the command line names (disks, the tap, the
QMP and console sockets, the pid file, hugepage and ivshmem files, /dev/kvm),
then drops to ``-runas UID:GID`` before the guest runs, under ``-sandbox``
(``hpvc.render.qemu``). The uid is the cluster's own, so one cluster's QEMU
(and a guest that breaks out into it) cannot signal, ptrace or open another
cluster's QEMU, and it holds no file on the host: nothing is chowned to it.

The uids come from a fixed range, ``FIRST_UID`` .. ``FIRST_UID + COUNT - 1``
(gid = uid), numeric: no /etc/passwd entry is made, so nothing is left in the
host's user database when a cluster is lost. A uid is given out only while no
user or group of the host has it and no process runs under it (a second state
directory on the same host, or a site user in the range). A claimed uid is a
file ``<state_root>/qemu-uids/<uid>`` naming its cluster, made under an flock
on ``<state_root>/qemu-uids.lock``; a cluster that holds one gets the same
uid again (scale, restart). The search for a free uid starts at an offset
derived from the state root's path (``first_try``), so two state roots on one
host do not hand out the same uid to clusters that start at the same time. A
claim whose cluster has no folder under ``<state_root>/clusters`` any more (its
state was swept, never undone) is freed by the next claim.

Journal kind ``"qemu-uid"`` (architecture rule 5), recorded before the uid file
is made: ``{uid, cluster, record, lock}``. Its undo removes the uid file while
it still names that cluster.
"""

from __future__ import annotations

import grp
import os
import pwd
import zlib
from collections.abc import Iterable
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.host import procfs
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.procfs import PROC
from hpvc.locks import file_lock
from hpvc.paths import CLUSTERS, private_dir

FIRST_UID = 0x7E000000  # 2113929216: far above any site's users, below 2^31
COUNT = 65536
LOCK_NAME = "qemu-uids.lock"
UIDS_DIR = "qemu-uids"


def _holder(record: Path) -> str | None:
    try:
        return record.read_text().strip() or None
    except OSError:
        return None


def find(state_root: Path, cluster: str) -> int | None:
    """The uid ``cluster`` holds in ``state_root``, or None."""
    folder = state_root / UIDS_DIR
    if not folder.is_dir():
        return None
    for entry in sorted(folder.iterdir()):
        if entry.name.isdigit() and _holder(entry) == cluster:
            return int(entry.name)
    return None


def _known_to_host(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


def process_uids(proc: Path = PROC) -> set[int]:
    """The real, effective, saved and file-system uids of every process now."""
    uids: set[int] = set()
    for pid in procfs.pids(proc):
        try:
            for line in (proc / str(pid) / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    uids.update(int(u) for u in line.split()[1:])
                    break
        except (OSError, ValueError):
            continue  # gone meanwhile
    return uids


def first_try(state_root: Path) -> int:
    """The uid the search for a free one starts at in ``state_root`` (then up,
    wrapping around the range)."""
    return FIRST_UID + zlib.crc32(os.fsencode(os.path.realpath(state_root))) % COUNT


def _free_uid(state_root: Path, busy: Iterable[int]) -> int:
    taken = set(busy)
    folder = state_root / UIDS_DIR
    for entry in folder.iterdir():
        if not entry.name.isdigit():
            continue
        holder = _holder(entry)
        if holder is not None and not (state_root / CLUSTERS / holder).is_dir():
            entry.unlink(missing_ok=True)  # a cluster whose state is gone (lost, swept)
        else:
            taken.add(int(entry.name))
    # Each state root starts at its own offset: two state roots on one host
    # (the Slurm test cluster's hosts) claiming at once, before either QEMU runs,
    # got the same first uid, and one's teardown then revoked the ACL entries
    # (hpvc.host.qemu_access) the other's QEMU needed (issue 28).
    start = first_try(state_root) - FIRST_UID
    for i in range(COUNT):
        uid = FIRST_UID + (start + i) % COUNT
        if uid not in taken and not _known_to_host(uid):
            return uid
    raise HpvcError(
        "QEMU uid",
        f"all {COUNT} uids from {FIRST_UID} are in use",
        "hpvc gc (clusters that are gone still hold theirs)",
    )


def claim(journal: Journal, state_root: Path, cluster: str, *, proc: Path = PROC) -> int:
    """The uid ``cluster``'s QEMUs run as: the one it holds, else a new one."""
    private_dir(state_root)
    private_dir(state_root / UIDS_DIR, tighten=True)  # its files name clusters
    lock = state_root / LOCK_NAME
    with file_lock(lock):
        held = find(state_root, cluster)
        if held is not None:
            return held
        uid = _free_uid(state_root, process_uids(proc))
        record = state_root / UIDS_DIR / str(uid)
        journal.record("qemu-uid", uid=uid, cluster=cluster, record=str(record), lock=str(lock))
        fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:  # under the lock: nobody else makes it
            f.write(f"{cluster}\n")
        return uid


@undoer("qemu-uid")
def _undo(args: Args) -> None:
    record, lock = Path(args["record"]), Path(args["lock"])
    if not lock.parent.is_dir():
        return  # the state root is gone, and with it every claim
    with file_lock(lock):
        if _holder(record) == args["cluster"]:
            record.unlink(missing_ok=True)

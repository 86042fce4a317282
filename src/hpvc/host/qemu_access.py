"""What a QEMU that starts as its cluster's uid may open: POSIX ACL entries, journaled.

A libvirt domain of hpvc's carries a static DAC label (``hpvc.render.libvirt``):
libvirtd starts its QEMU as the cluster's uid (``hpvc.host.qemu_user``) from the
beginning, so QEMU opens its disks, kernel, initramfs, fw_cfg files and the
ivshmem region as that uid, not as root. hpvc's state is root's alone (0700
folders, ``hpvc.paths.private_dir``), and the label says ``relabel='no'``, so
libvirt chowns nothing (the guest cache's kernel, initramfs and base disk are
every cluster's). Instead hpvc adds one ACL entry for the uid to each file QEMU
opens (``r`` or ``rw``) and ``x`` (traversal only, no listing) to each folder on
the way to it that others may not enter. Nothing is chowned; the owner, group
and other bits stay as they were (the group bits of an ACL'd file read as its
ACL mask).

``grant`` reads and writes the ``system.posix_acl_access`` attribute itself
(the kernel's binary form: a version, then tag/perm/id entries), so no
``setfacl`` is needed; it works on ext4, xfs, btrfs and tmpfs (/dev/shm).
Changes to one file are made under an flock (``lock``) and an flock on that
file itself (``_path_lock``), so two clusters that add their entries to a
shared folder at once both keep them, also when their state roots (and so
their ``lock``) differ: the Slurm test cluster's hosts share this machine's
folders above their state roots, and two hosts' checkpoints granting at once
could each write the ACL it had read, losing the other's entry, so that host's
QEMU could not reopen its disk (``bdrv_inactivate_all() failed``, issue 28).

Journal kind ``"qemu-acl"`` (architecture rule 5), recorded before the entry is
written: ``{path, uid, before, lock}`` (``before``: the uid's entry's perms
before, -1 for none). Its undo puts the entry back as it was (removes it when
there was none); a file left with no named entry loses its ACL and gets its
group bits back from the owning group's entry. A path that is gone is fine.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

from hpvc.host.journal import Args, Journal, undoer
from hpvc.locks import file_lock

XATTR = "system.posix_acl_access"
LOCK_NAME = "qemu-acl.lock"  # in the state root
VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
NO_ID = 0xFFFFFFFF
R, W, X = 4, 2, 1
PERMS = {"r": R, "rw": R | W, "x": X}
_HEAD = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
QCOW2_MAGIC = b"QFI\xfb"

Entry = tuple[int, int, int]  # tag, perm, id


def parse(raw: bytes) -> list[Entry]:
    """The entries of an ACL in the kernel's xattr form."""
    (version,) = _HEAD.unpack_from(raw)
    if version != VERSION or (len(raw) - _HEAD.size) % _ENTRY.size:
        raise ValueError(f"not a POSIX ACL of version {VERSION} ({len(raw)} bytes)")
    return [_ENTRY.unpack_from(raw, off) for off in range(_HEAD.size, len(raw), _ENTRY.size)]


def pack(entries: Iterable[Entry]) -> bytes:
    """The xattr form, entries in the order the kernel requires (tag, then id)."""
    return _HEAD.pack(VERSION) + b"".join(_ENTRY.pack(*e) for e in sorted(entries))


def from_mode(mode: int) -> list[Entry]:
    """The three entries a file without an ACL has."""
    return [
        (USER_OBJ, (mode >> 6) & 7, NO_ID),
        (GROUP_OBJ, (mode >> 3) & 7, NO_ID),
        (OTHER, mode & 7, NO_ID),
    ]


def with_user(entries: list[Entry], uid: int, perm: int | None) -> list[Entry]:
    """``entries`` with uid's named entry set to ``perm`` (None: removed) and the
    mask made the union of the group class (none when no named entry is left)."""
    rest = [e for e in entries if e[0] != MASK and not (e[0] == USER and e[2] == uid)]
    if perm is not None:
        rest.append((USER, perm, uid))
    named = [e for e in rest if e[0] in (USER, GROUP)]
    if named:
        mask = 0
        for tag, p, _ in rest:
            if tag in (USER, GROUP, GROUP_OBJ):
                mask |= p
        rest.append((MASK, mask, NO_ID))
    return sorted(rest)


def read_acl(path: Path) -> list[Entry]:
    try:
        return parse(os.getxattr(path, XATTR))
    except OSError as e:
        if e.errno != errno.ENODATA:
            raise
        return from_mode(os.stat(path).st_mode)


def user_perm(entries: list[Entry], uid: int) -> int | None:
    for tag, perm, who in entries:
        if tag == USER and who == uid:
            return perm
    return None


def allows(path: Path, uid: int, want: int) -> bool:
    """Does ``path`` already give uid ``want`` (others' bits, or its own entry
    under the mask)? uid owns nothing and is in no group of the host's files."""
    st = os.stat(path)
    if st.st_uid == uid:
        return (st.st_mode >> 6) & want == want
    if st.st_mode & want == want:
        return True
    entries = read_acl(path)
    mine = user_perm(entries, uid)
    mask = next((p for tag, p, _ in entries if tag == MASK), 7)
    return mine is not None and mine & mask & want == want


def _write(path: Path, entries: list[Entry]) -> None:
    if any(tag in (USER, GROUP) for tag, _, _ in entries):
        os.setxattr(path, XATTR, pack(entries))
        return
    with contextlib.suppress(OSError):
        os.removexattr(path, XATTR)
    group = next(p for tag, p, _ in entries if tag == GROUP_OBJ)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    os.chmod(path, (mode & ~0o070) | (group << 3))  # the mask's bits were the group's


@contextlib.contextmanager
def _path_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path`` itself (a file or a folder), which every
    writer of its ACL takes, whatever its state root. QEMU's own image locks
    are fcntl (OFD) locks, which flock does not touch."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _add(journal: Journal, path: Path, uid: int, want: int, lock: Path) -> None:
    with file_lock(lock), _path_lock(path):
        if allows(path, uid, want):
            return
        entries = read_acl(path)
        before = user_perm(entries, uid)
        journal.record(
            "qemu-acl", path=str(path), uid=uid, before=-1 if before is None else before,
            lock=str(lock),
        )  # fmt: skip
        _write(path, with_user(entries, uid, (before or 0) | want))


def grant(journal: Journal, uid: int, path: Path, perms: str, *, lock: Path) -> None:
    """Let ``uid`` open ``path`` (``perms``: "r" or "rw"), and traverse each folder
    above it that others may not: an ACL entry each, journaled in ``journal``."""
    real = Path(os.path.realpath(path))
    for folder in reversed(real.parents):
        _add(journal, folder, uid, X, lock)
    _add(journal, real, uid, PERMS[perms], lock)


def traverse(journal: Journal, uid: int, folder: Path, *, lock: Path) -> None:
    """Let ``uid`` pass through ``folder`` and each folder above it (x only)."""
    real = Path(os.path.realpath(folder))
    for f in [*reversed(real.parents), real]:
        _add(journal, f, uid, X, lock)


def backing_chain(disk: Path, limit: int = 16) -> list[Path]:
    """The files under a qcow2 overlay (its backing file, that one's, ...), which
    QEMU opens read-only; [] for a raw disk. Relative names are relative to the
    overlay's folder, as QEMU takes them."""
    chain: list[Path] = []
    current = disk
    for _ in range(limit):
        try:
            with open(current, "rb") as f:
                head = f.read(20)
                if len(head) < 20 or head[:4] != QCOW2_MAGIC:
                    return chain
                offset, size = struct.unpack(">QI", head[8:20])
                if not offset or not size:
                    return chain
                f.seek(offset)
                name = f.read(size).decode()
        except (OSError, UnicodeDecodeError):
            return chain
        current = current.parent / name
        chain.append(current)
    return chain


@undoer("qemu-acl")
def _undo(args: Args) -> None:
    path, uid, before = Path(args["path"]), int(args["uid"]), int(args["before"])
    lock = Path(args["lock"])
    if not lock.parent.is_dir():
        return  # the state root is gone
    with file_lock(lock), contextlib.ExitStack() as held:
        try:
            held.enter_context(_path_lock(path))
            entries = read_acl(path)
        except FileNotFoundError:
            return
        if user_perm(entries, uid) is None and before < 0:
            return
        _write(path, with_user(entries, uid, None if before < 0 else before))

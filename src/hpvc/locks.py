"""The one file-lock helper every part of hpvc uses (state, images, guests, ivshmem ids)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path, mode: int = 0o600) -> Iterator[None]:
    """An exclusive fcntl lock on ``path`` (created if missing), held for the block.

    Each call opens its own file description, so threads of one process
    exclude each other as well as other processes.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextmanager
def owned_lock(path: Path, owner: str, on_wait: Callable[[str], None]) -> Iterator[None]:
    """``file_lock`` that says who holds it: the holder writes ``owner`` (e.g.
    ``PID 123 hpvc up``) into the file; a second caller is told who it waits
    for (``on_wait``), then waits."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another command"
            on_wait(holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, owner.encode(), 0)
        except OSError as e:  # a full disk: the lock holds, its owner goes unnamed
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # still ours: nobody else can hold it yet
        os.close(fd)


def holder(path: Path) -> str | None:
    """Who holds ``owned_lock(path)`` now: its owner text, or None when nobody
    does. A holder killed outright holds nothing (the kernel drops its lock
    with its last descriptor), whatever text it left in the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another command"
        fcntl.flock(fd, fcntl.LOCK_UN)  # a probe: given back at once
        return None
    finally:
        os.close(fd)

"""The one file-lock helper every part of hpvc uses (state, images, guests, ivshmem ids)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
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

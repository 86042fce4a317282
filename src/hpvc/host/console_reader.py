"""The reader behind a node's console log: stdin into a file kept to a size.

Run as ``python -S -I console_reader.py CAP LOG [append]`` by
``hpvc.host.console_ring`` (which says why the reader exists and journals
it), one per node. It imports nothing but the standard library, and the
interpreter starts without site packages (``-S -I``), so a reader is running
in about 10 ms instead of the 40 ms that importing hpvc costs: an 8-node
cluster starts 8 of them at once on hosts with few CPUs.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from pathlib import Path

CHUNK = 1 << 16
ROTATED = ".1"  # the older half: console.log.1
NEW = ".new"  # a name a rotation passes through (console.log.new, console.log.1.new)


class RingLog:
    """A file that never grows past ``cap`` bytes: when a write would take it
    past, it becomes ``<path>.1`` and a new file starts. Between them they hold
    the newest bytes written, at most twice ``cap``."""

    def __init__(self, path: Path, cap: int, append: bool = False) -> None:
        if cap < 1:
            raise ValueError(f"a console log's cap must be positive: {cap}")
        self.path, self.cap = path, cap
        keep = os.O_APPEND if append else os.O_TRUNC  # a node's restart adds to its log
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | keep | os.O_CLOEXEC, 0o600)
        self.size = os.fstat(self._fd).st_size

    def write(self, data: bytes) -> None:
        if len(data) > self.cap:  # only its last cap bytes can be kept
            data = data[-self.cap :]
        if self.size + len(data) > self.cap:
            self._rotate()
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self.size += len(data)

    def _rotate(self) -> None:
        # The log's path never goes missing, not even for a moment (a test that
        # stat'ed it during a flood once found nothing between a rename and the
        # new file): the full file becomes the older half by a hard link renamed
        # over it, then a new empty file is renamed over the path.
        older = self.path.with_name(self.path.name + ROTATED)
        link, fresh = older.with_name(older.name + NEW), self.path.with_name(self.path.name + NEW)
        with contextlib.suppress(FileNotFoundError):  # a reader killed mid-rotation left it
            os.unlink(link)
        os.link(self.path, link)
        os.replace(link, older)
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.replace(fresh, self.path)
        os.close(self._fd)
        self._fd, self.size = fd, 0

    def close(self) -> None:
        os.close(self._fd)


def copy(source: int, log: RingLog) -> None:
    """Copy ``source`` (a descriptor, made non-blocking) into ``log`` until end of
    file. poll() first: a FIFO no writer has opened yet reads as end of file,
    but polls as nothing to read, until its writer (QEMU) comes and goes."""
    os.set_blocking(source, False)
    poller = select.poll()
    poller.register(source, select.POLLIN)
    while True:
        poller.poll()
        try:
            data = os.read(source, CHUNK)
        except (BlockingIOError, InterruptedError):
            continue
        if not data:
            return
        log.write(data)


def main(argv: list[str]) -> int:
    """``CAP LOG [append]``: copy stdin (a pipe or FIFO) into LOG, kept to CAP bytes."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    cap, log = int(argv[0]), Path(argv[1])
    ring = RingLog(log, cap, append=argv[2:] == ["append"])
    copy(0, ring)
    ring.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

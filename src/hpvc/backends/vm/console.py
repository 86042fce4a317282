"""A VM's logs as files: their last lines in errors, and a guest's ready line.

Both VM backends run QEMU with its serial console written to a file (the
node's ``console.log``, which may be rotated to ``console.log.1`` when it
reaches its cap) and QEMU's own messages to another (``qemu.log``). A
guest says it is ready by a line on its console (``hpvc-ready <node>``,
written by hpvc-init); ``wait_ready`` follows the file until the line comes,
the QEMU process exits, or time runs out. Errors quote the log's last lines.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.host.procfs import PROC, running

TAIL_LINES = 12


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` non-empty lines of a log (empty when unreadable)."""
    try:
        text = path.read_bytes()[-16384:].decode(errors="replace")
    except OSError:
        return []
    clean = [line.replace("\r", "").rstrip() for line in text.splitlines()]
    return [line for line in clean if line][-lines:]


def with_tail(why: str, log: Path) -> str:
    """``why`` followed by the last lines of ``log`` (or a note that it is empty)."""
    last = tail(log)
    return f"{why}; last lines of {log}: " + " | ".join(last) if last else f"{why} ({log} is empty)"


class _LogFollower:
    """Reads what was appended to a log since the last call, in whole lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.inode: int | None = None  # of the file read so far

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                data, st = b"", os.fstat(f.fileno())
                if self.inode is not None and st.st_ino != self.inode:  # rotated
                    data, self.offset = self._rotated_rest(), 0
                    self.partial = self.partial if data else b""
                elif st.st_size < self.offset:  # truncated: start over
                    self.offset, self.partial = 0, b""
                self.inode = st.st_ino
                f.seek(self.offset)
                new = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(new)
        data += new
        *whole, self.partial = (self.partial + data).split(b"\n")
        return [w.decode(errors="replace").replace("\r", "") for w in whole]

    def _rotated_rest(self) -> bytes:
        """What the file held past our offset when hpvc's console reader renamed
        it to ``<log>.1`` (hpvc.host.console_ring); empty when that is another."""
        try:
            with open(self.path.with_name(self.path.name + ".1"), "rb") as f:
                if os.fstat(f.fileno()).st_ino != self.inode:
                    return b""
                f.seek(self.offset)
                return f.read()
        except FileNotFoundError:
            return b""


def wait_ready(
    console_log: Path, marker: str, timeout: float, pid: int, proc: Path = PROC
) -> float:
    """Wait for a console line holding ``marker`` as a whole word; seconds waited.

    Fails at once, with the log's last lines, when the QEMU process exits.
    """
    pattern = re.compile(rf"(^|\s){re.escape(marker)}(\s|$)")
    follow = _LogFollower(console_log)
    start = time.monotonic()
    while True:
        lines = [*follow.lines(), follow.partial.decode(errors="replace")]
        if any(pattern.search(line) for line in lines):
            return time.monotonic() - start
        if not running(pid, proc):
            why = with_tail(f"QEMU (PID {pid}) exited before '{marker}'", console_log)
            raise HpvcError(f"VM boot ({marker})", why)
        if time.monotonic() - start > timeout:
            why = with_tail(f"no '{marker}' after {timeout:g} s", console_log)
            raise HpvcError(f"VM boot ({marker})", why, "see the console log")
        time.sleep(0.05)

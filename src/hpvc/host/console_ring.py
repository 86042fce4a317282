"""A node's console log on the host, kept to a size (issue 25, item 6).

A node's console is whatever its init and anyone in it write there: a
container's stdout and stderr, a VM's serial port. Written straight to a file,
a node that writes without end fills the state disk, which holds every
cluster's records and every node's layer. So hpvc puts a small reader of its
own between the node and the file: it copies what arrives on a pipe (a
container's stdio) or a FIFO (QEMU's chardev ``logfile=``) into
``console.log``, and when the next write would take that file past the cap,
renames it to ``console.log.1`` (replacing the older one) and starts a new
one. The host keeps at most twice the cap per node, the newest bytes always.

Why a reader of ours, not something simpler: neither crun nor QEMU caps a log
(QEMU's chardev log has no size option); RLIMIT_FSIZE on the writer would
also cap its other files (QEMU's disks) and kill it with SIGXFSZ; a
size-limited tmpfs or loop mount per node costs a mount each and ends in a
writer that blocks or fails when full, where the newest lines are the ones
that matter (readiness, the last words before a crash). Rotating by rename
keeps whole files that a reader following ``console.log`` by path sees start
over (``hpvc.backends.vm.console`` reads the rest of ``console.log.1`` then).

The reader is ``python -S -I console_reader.py CAP LOG [append]``
(``hpvc.host.console_reader``, standard library only, so it starts in
milliseconds), in a
session of its own (like the QEMU it serves), reading its stdin (the pipe's
read end, or the FIFO); it ends by itself at end of file, when the last writer
(the container's processes, QEMU) is gone. The node never blocks on a file
write of its own and a copy costs one read and one write per chunk.

Journal kind ``"console-ring"`` (architecture rule 5), recorded as soon as the
reader runs: ``{pid, start_time, log}``, and ``fifo`` when it reads one. Its
undo ends that process (SIGTERM, then SIGKILL) while the PID still names it,
then removes the FIFO (while it is one); the backends record it before the
node it serves, so the node is gone first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from hpvc.host import procfs
from hpvc.host.journal import Args, Journal, undoer

READER = Path(__file__).with_name("console_reader.py")  # stdlib only: starts fast
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}  # readers this process started, to reap


def start(
    journal: Journal, log: Path, cap: int, *, append: bool = False, fifo: Path | None = None
) -> int | None:
    """Run a reader that keeps ``log`` to ``cap`` bytes (see the module's text),
    from its end (``append``) or from empty.

    With ``fifo``: makes that FIFO (0600), opened for reading here so that its
    writer's (QEMU's) open never waits, and the reader copies what is written
    there; returns None. Without: returns the write end of a new pipe, for the
    node's stdio; the caller closes it once the node holds it.
    """
    if fifo is not None:
        with contextlib.suppress(FileNotFoundError):
            fifo.unlink()
        os.mkfifo(fifo, 0o600)
        read_end, write_end = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), None
    else:
        read_end, write_end = os.pipe()
    argv = [sys.executable, "-S", "-I", str(READER), str(cap), str(log)]
    try:
        child = subprocess.Popen(
            [*argv, *(["append"] if append else [])],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except BaseException:
        if write_end is not None:
            os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _CHILDREN[child.pid] = child
    where = {"log": str(log)} | ({"fifo": str(fifo)} if fifo is not None else {})
    journal.record("console-ring", pid=child.pid, start_time=procfs.start_time(child.pid),
                   **where)  # fmt: skip
    return write_end


def settle(log: Path, quiet_s: float = 0.1, limit_s: float = 2.0) -> None:
    """Wait until ``log`` has not grown for ``quiet_s`` (at most ``limit_s``): what
    a failed command wrote through the pipe is in the file before it is quoted."""
    deadline = time.monotonic() + limit_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            size = log.stat().st_size
        except OSError:
            size = -1
        if size != last:
            last, since = size, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.02)


def _gone(pid: int, started: object) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]
    return not procfs.running(pid) or procfs.start_time(pid) != started


@undoer("console-ring", lambda a: f"console reader {a.get('pid')} of {a.get('log')}")
def _stop(args: Args) -> None:
    _end(int(args["pid"]), args.get("start_time"))
    if "fifo" in args:
        fifo = Path(args["fifo"])
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISFIFO(fifo.lstat().st_mode):
                fifo.unlink()


def _end(pid: int, started: object) -> None:
    for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        if _gone(pid, started):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if _gone(pid, started):
                return
            time.sleep(0.02)

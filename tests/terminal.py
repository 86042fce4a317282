"""A real terminal for the tests of interactive use (``srun --pty``, ``hpvc
exec -it``, ``hpvc console``; issue 30 items 3 and 4): the command runs as the
session leader of a fresh pty (Python's ``pty`` module), that pty its
controlling terminal, and the test types into the master side and reads what
comes back, as a person at a terminal emulator would. ``scenario`` is the one
check every such test runs against the shell it reached."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def _controlling_tty() -> None:
    """In the child, after setsid (start_new_session): stdin (the pty's slave)
    becomes its controlling terminal, as a terminal emulator's shell has it."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """``argv`` on the slave side of a new pty; ``send``/``expect`` on the master."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path | None = None,
        uid: int | None = None,
        gid: int | None = None,
        rows: int = 24,
        cols: int = 80,
    ) -> None:
        self.master, slave = pty.openpty()
        self.resize(rows, cols)
        self.out = b""
        self._seen = 0
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=dict(env),
                cwd=cwd,
                user=uid,
                group=gid,
                extra_groups=[] if uid is not None else None,
                start_new_session=True,
                preexec_fn=_controlling_tty,
            )
        except BaseException:
            os.close(self.master)
            raise
        finally:
            os.close(slave)

    def resize(self, rows: int, cols: int) -> None:
        """TIOCSWINSZ on the master: the kernel sends SIGWINCH to the terminal's
        foreground job (srun, hpvc exec), as a terminal emulator's resize does."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def line(self, text: str) -> None:
        """``text`` and Enter (a carriage return, what a terminal sends)."""
        self.send(text.encode() + b"\r")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every holder of the slave is gone
            return False
        self.out += chunk
        return bool(chunk)

    def expect(self, pattern: str, timeout: float) -> re.Match[bytes]:
        """The first match of ``pattern`` in what came back after the last
        match; AssertionError with the screen's tail after ``timeout`` s."""
        rx = re.compile(pattern.encode())
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.out, self._seen)
            if m:
                self._seen = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.5)):
                m = rx.search(self.out, self._seen)
                if m:
                    self._seen = m.end()
                    return m
                tail = self.out[-1500:].decode(errors="replace")
                raise AssertionError(f"no {pattern!r} in {timeout} s; the terminal shows:\n{tail}")

    def wait(self, timeout: float) -> int:
        """The command's exit status, reading the terminal meanwhile (a full
        pty would block the writer)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        """The command killed (by its PID: we started it) if still running."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        os.close(self.master)


PROMPT = r"P2> "


def scenario(term: Terminal, timeout: float, start_s: float = 0, host: str = "") -> int:
    """Drive the shell at the other end of ``term`` through what makes a
    terminal real, then ``exit 7``; returns the exit status the terminal's
    command (srun, hpvc exec ...) gave back. ``timeout`` is per step (guests
    under TCG are slow), ``start_s`` for the first prompt (a job's guests boot);
    ``host``: the node's hostname the shell must report."""
    # The prompt, spelled so that the echo of this line cannot match it.
    term.line("PS1='P''2> '; PROMPT_COMMAND=")
    term.expect(PROMPT, max(timeout, start_s))
    # A real terminal in the node: tty names a pty.
    term.line("tty; hostname")
    m = term.expect(r"/dev/pts/\d+\r\n(\S+)\r\n", timeout)
    assert not host or m.group(1).decode() == host, f"the shell runs on {m.group(1)!r}, not {host}"
    term.expect(PROMPT, timeout)
    # The window's size, and a resize of the outer terminal followed inside.
    term.line("stty size")
    term.expect(r"(?<!\d)24 80\r\n", timeout)
    term.expect(PROMPT, timeout)
    term.resize(33, 101)
    deadline = time.monotonic() + timeout
    while True:
        term.line("stty size")
        m = term.expect(r"(?<!\d)(\d+ \d+)\r\n", timeout)
        term.expect(PROMPT, timeout)
        if m.group(1) == b"33 101":
            break
        assert time.monotonic() < deadline, f"stty size stayed {m.group(1)!r}, not 33 101"
        time.sleep(0.5)
    # Ctrl-C reaches the foreground job, not the shell (nor srun, nor hpvc).
    term.line("sleep 1000; echo after-''sleep")
    time.sleep(1)
    term.send(b"\x03")
    term.expect(PROMPT, timeout)
    term.line("echo alive$((6*7))")
    term.expect(r"alive42", timeout)
    term.expect(PROMPT, timeout)
    assert b"after-sleep" not in term.out, "Ctrl-C did not stop the whole line"
    # Ctrl-Z stops the foreground job; the shell's job control knows it.
    term.line("sleep 1001")
    time.sleep(1)
    term.send(b"\x1a")
    term.expect(r"Stopped", timeout)
    term.expect(PROMPT, timeout)
    term.line("jobs")
    term.expect(r"\[1\]\+\s+Stopped\s+sleep 1001", timeout)
    term.expect(PROMPT, timeout)
    term.line("kill -9 %1")
    term.expect(PROMPT, timeout)
    # The exit status comes back.
    term.line("exit 7")
    try:  # bash may warn once of a job it still lists, then exits on the next
        term.expect("There are stopped jobs", 3)
        term.line("exit 7")
    except AssertionError:
        pass
    return term.wait(timeout)

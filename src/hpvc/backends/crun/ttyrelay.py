"""``hpvc exec -t`` into a container node: the caller's terminal relayed to a
pty in the node, window size changes included.

crun 1.8's own ``exec --tty`` relays the bytes but never passes a resize on
(the node's ``stty size`` stays what it was at start), so hpvc takes the pty's
master itself through the OCI console socket (``--console-socket``: crun
sends the master over a Unix socket, SCM_RIGHTS) and relays it here, as
terminal emulators and ``docker exec -it`` do: the caller's terminal raw for
the run (Ctrl-C, Ctrl-Z go as bytes to the node's line discipline) and
restored after, the window's size copied onto the master (TIOCSWINSZ), crun's
exit status (the command's) returned. Hand-written: no library of ours does
a console-socket relay, and it is short.

Run as ``python -m hpvc.backends.crun.ttyrelay CRUN_EXEC_ARGV...`` (what
``CrunBackend.exec_argv`` gives ``hpvc exec -t``): it imports nothing of hpvc.
"""

from __future__ import annotations

import array
import fcntl
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import tty


def _copy_size(src: int, dst: int) -> None:
    try:
        size = fcntl.ioctl(src, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(dst, termios.TIOCSWINSZ, size)
    except OSError:
        pass  # no size to copy: the node's default stays


def _receive_master(srv: socket.socket, proc: subprocess.Popen[bytes]) -> int | None:
    """The pty master crun sends, or None if crun ended first (it failed)."""
    while proc.poll() is None:
        if not select.select([srv], [], [], 0.2)[0]:
            continue
        conn, _ = srv.accept()
        with conn:
            fds = array.array("i")
            _, anc, _, _ = conn.recvmsg(1024, socket.CMSG_SPACE(fds.itemsize))
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[: fds.itemsize])
            return fds[0] if fds else None
    return None


def _relay(master: int, proc: subprocess.Popen[bytes]) -> None:
    """Bytes both ways until the node's side of the pty is closed."""
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGWINCH, lambda *_: None)
    _copy_size(stdin, master)
    watch = [master, stdin, rfd]
    while True:
        ready = select.select(watch, [], [], 0.5)[0]
        if rfd in ready:
            os.read(rfd, 512)
        # On SIGWINCH, and every half second: under `hpvc serve` the terminal's
        # foreground group (which gets SIGWINCH) is the client, not this process.
        if rfd in ready or not ready:
            _copy_size(stdin, master)
        if stdin in ready:
            data = os.read(stdin, 65536)
            if data:
                os.write(master, data)
            else:
                watch.remove(stdin)
        if master in ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the command and whatever held the pty are gone
                return
            if not data:
                return
            os.write(stdout, data)
        if not ready and proc.poll() is not None:
            return


def main(crun_exec: list[str]) -> int:
    """crun_exec: ``crun exec ... CID ARGV`` (without --tty); its exit status."""
    stdin = sys.stdin.fileno()
    saved = termios.tcgetattr(stdin)
    with tempfile.TemporaryDirectory(prefix="hpvc-tty-") as d:
        path = os.path.join(d, "console.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)
        argv = [*crun_exec[:2], "--tty", "--console-socket", path, *crun_exec[2:]]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        master = _receive_master(srv, proc)
        srv.close()
        if master is None:
            return proc.wait()
        try:
            tty.setraw(stdin, termios.TCSANOW)  # not TCSAFLUSH: keep what was typed ahead
            _relay(master, proc)
        finally:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
            os.close(master)
        return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

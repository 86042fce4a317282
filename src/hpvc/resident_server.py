"""The resident hpvc's server (``hpvc serve``): the protocol and the client
are in ``hpvc.resident``, which says why and how.

One process, one thread: a selector over the listening socket, the clients
and a wake-up pipe (SIGCHLD, SIGTERM). A request is forked at once; the
server never runs a command itself, so it holds nothing a command changes
(records, topology, consoles) and every child starts from the same state.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpvc.resident import EXIT, HEADER, MAX_REQUEST, REFUSED, RELAYED, SIGNAL, decode, identity


@dataclass
class _Client:
    sock: socket.socket
    buf: bytes = b""
    fds: tuple[int, ...] = ()
    child: int | None = None
    gone: bool = False  # the client hung up while its command ran
    what: str = ""  # for the log: "uid 1000: ls --json"
    began: float = 0.0


Runner = Callable[[list[str]], int]
Log = Callable[[str], None]


class _Server:
    """One listening socket, its clients (by socket fd) and their commands (by PID)."""

    def __init__(self, listener: socket.socket, run: Runner, log: Log) -> None:
        self.listener = listener
        self.run = run
        self.log = log
        self.sel = selectors.DefaultSelector()
        self.clients: dict[int, _Client] = {}
        self.children: dict[int, _Client] = {}

    def accept(self) -> None:
        conn, _addr = self.listener.accept()
        self.clients[conn.fileno()] = _Client(conn)
        self.sel.register(conn, selectors.EVENT_READ, "client")

    def drop(self, c: _Client) -> None:
        """Stop listening to a client; its socket stays open while its command runs."""
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(c.sock)
        self.clients.pop(c.sock.fileno(), None)
        for fd in c.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        c.fds = ()
        if c.child is None:
            c.sock.close()

    def readable(self, c: _Client) -> None:
        try:
            if c.child is None and not c.fds:
                data, fds, _flags, _addr = socket.recv_fds(c.sock, 1 << 16, 8)
                c.fds = tuple(fds)
            else:
                data = c.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:  # the client went away: so does its command
            if c.child is not None:
                c.gone = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.child, signal.SIGTERM)
            self.drop(c)
            return
        if c.child is not None:  # "S<signum>" pairs while the command runs
            for i in range(0, len(data) - 1, 2):
                if data[i : i + 1] == SIGNAL and data[i + 1] in RELAYED:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(c.child, data[i + 1])
            return
        c.buf += data
        if len(c.buf) < HEADER.size:
            return
        (size,) = HEADER.unpack(c.buf[: HEADER.size])
        if size > MAX_REQUEST or len(c.fds) != 4:  # not for us: the client runs it
            with contextlib.suppress(OSError):
                c.sock.sendall(REFUSED + HEADER.pack(0))
            self.drop(c)
            return
        if len(c.buf) >= HEADER.size + size:
            try:
                request = decode(c.buf[HEADER.size : HEADER.size + size])
            except (ValueError, IndexError):
                self.drop(c)
                return
            self.start(c, request)

    def start(self, c: _Client, request: tuple[str, int, list[str], dict[str, str]]) -> None:
        who, umask, argv, env = request
        if who != identity():  # another hpvc: the client runs it
            with contextlib.suppress(OSError):
                c.sock.sendall(REFUSED + HEADER.pack(0))
            self.drop(c)
            return
        creds = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, gid = struct.unpack("3i", creds)
        groups = _peer_groups(c.sock)
        child = os.fork()
        if child == 0:  # pragma: no cover - the child ends in os._exit
            code = 70
            try:
                self.sel.close()
                self.listener.close()
                for other in [*self.clients.values(), *self.children.values()]:
                    if other is not c:
                        other.sock.close()
                os.umask(umask & 0o777)
                code = _child(c, argv, env, (uid, gid, groups), self.run)
            finally:
                os._exit(code)
        c.child = child
        c.what = f"uid {uid}: {' '.join(argv)}"[:200]
        c.began = time.monotonic()
        self.children[child] = c
        for fd in c.fds:
            os.close(fd)
        c.fds = ()

    def reap(self) -> None:
        """Tell each client whose command ended how it ended."""
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            c = self.children.pop(pid, None)
            if c is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code  # killed by a signal: 128 + N
            gone = " (the client went away)" if c.gone else ""
            self.log(f"pid {pid} {c.what} -> {code} in {time.monotonic() - c.began:.3f} s{gone}")
            if not c.gone:
                with contextlib.suppress(OSError):
                    c.sock.sendall(EXIT + HEADER.pack(code))
            c.child = None
            self.drop(c)
            c.sock.close()


def serve(
    path: Path, run: Runner, ready: Callable[[], None] = lambda: None, log: Log = lambda _: None
) -> None:
    """Answer clients on ``path`` until SIGTERM or SIGINT; ``run(argv)`` runs a
    command in a forked child and returns its exit status; ``log`` gets a line
    per command that ended."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)  # /run/hpvc
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o666)  # every user's commands come here (and run as that user)
    listener.listen(64)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    stop = [False]

    def stopping(_n: int, _f: object) -> None:
        stop[0] = True

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stopping)
    signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only wakes the loop
    server = _Server(listener, run, log)
    server.sel.register(listener, selectors.EVENT_READ, "listener")
    server.sel.register(wake_r, selectors.EVENT_READ, "wake")
    ready()
    try:
        while not stop[0]:
            for key, _ in server.sel.select():
                if key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 512)
                elif key.data == "listener":
                    server.accept()
                elif key.fd in server.clients:
                    server.readable(server.clients[key.fd])
            server.reap()
    finally:
        for pid in server.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13; Python 3.11 has no name for it


def _peer_groups(sock: socket.socket) -> list[int] | None:
    """The caller's supplementary groups as they were when it connected (not
    the user's from /etc/group: a caller that dropped some keeps them
    dropped); None where the kernel cannot say (or for more than 256)."""
    try:  # Python takes at most 1024 bytes: 256 groups; more is ERANGE
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 1024)
    except OSError:
        return None
    return list(struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4]))


def _child(
    c: _Client,
    argv: list[str],
    env: dict[str, str],
    creds: tuple[int, int, list[int] | None],
    run: Runner,
) -> int:
    """In the forked child: become the client (ids, descriptors, directory,
    environment), run the command, return its status."""
    for s in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    c.sock.close()
    stdin, stdout, stderr, cwd = c.fds
    uid, gid, groups = creds
    if uid != 0:
        _become(uid, gid, groups)
    os.fchdir(cwd)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    for fd in c.fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["hpvc", *argv]
    import random

    random.seed()  # not the server's sequence, shared by every child
    return run(argv)


def _become(uid: int, gid: int, groups: list[int] | None) -> None:
    """The client's user and groups, for good: no way back to root."""
    if groups is not None:
        os.setgroups(groups)
    else:  # an old kernel: the user's groups as login gives them
        import pwd

        try:
            os.initgroups(pwd.getpwuid(uid).pw_name, gid)
        except KeyError:  # no passwd entry: just its group
            os.setgroups([gid])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)

"""The resident hpvc's server (``hpvc serve``): the protocol and the client
are in ``hpvc.resident``, which says why and how.

Long because the root loop and the forks it makes belong on one page: what
root does with a connection, and that it reads nothing of it, is checked by
reading both halves together.

Root handles nothing a client sends. The main loop (one process, one
thread, a selector over the listening socket and a wake-up pipe for SIGCHLD
and SIGTERM) only accepts a connection, asks the kernel who made it
(SO_PEERCRED), counts that user's connections and forks; it never reads
from a client's socket and never holds one past the fork, so a descriptor a
client sends (a file whose close or release hangs) never reaches root. The
child, the *relay*, takes the caller's groups, resource limits and cgroups
from ``/proc/<pid>`` (``hpvc.host.caller``: the kernel's word, not the
client's), drops to the caller for good, and only then reads the request
and the descriptors, with a deadline for a client that sends nothing. It
forks the command, passes the client's signals on and sends the exit
status back. The server never runs a command itself, so it holds nothing a
command changes (records, topology, consoles) and every child starts from
the same state.

A user has at most ``per_user`` connections at a time (root: no limit); a
connection over that is turned away (the client runs the command itself).
A turned-away connection on which the client already queued something is
closed by a fork that is that user, not by root. An error of ``accept``
(out of descriptors) pauses the listener briefly; no error ends the loop.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import selectors
import signal
import socket
import struct
import sys
import termios
import time
from collections import Counter
from collections.abc import Callable

from hpvc.host import caller as callers
from hpvc.resident import EXIT, HEADER, MAX_REQUEST, REFUSED, RELAYED, SIGNAL, decode, identity

Runner = Callable[[list[str]], int]
Log = Callable[[str], None]
Request = tuple[str, int, list[str], dict[str, str]]

PER_USER = 16
IDLE_S = 10.0
PAUSE_S = 0.2  # the listener's rest after accept ran out of descriptors
CLOSERS = 64  # a user's turned-away connections being closed by forks at a time
SHORT = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class _Server:
    """The listening socket and the forks it made (relays and closers, by PID)."""

    def __init__(
        self, listener: socket.socket, run: Runner, log: Log, per_user: int, idle: float
    ) -> None:
        self.listener, self.run, self.log = listener, run, log
        self.per_user, self.idle = per_user, idle
        self.sel = selectors.DefaultSelector()
        self.own: list[int] = []  # the wake-up pipe: closed in every fork
        self.relays: dict[int, int] = {}  # pid -> uid
        self.closers: dict[int, int] = {}
        self.active: Counter[int] = Counter()
        self.closing: Counter[int] = Counter()
        self.paused_until = 0.0
        self.said: dict[str, float] = {}

    def say(self, key: str, line: str) -> None:
        """Log ``line``, at most every 10 s per ``key`` (a flood is not a log flood)."""
        now = time.monotonic()
        if now - self.said.get(key, -1e9) >= 10:
            self.said[key] = now
            self.log(line)

    def accept_all(self) -> None:
        for _ in range(64):  # then let the loop reap
            try:
                conn, _addr = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in SHORT:
                    self.say("accept", f"accept: {e.strerror}; pausing {PAUSE_S} s")
                    self.pause()
                return  # ECONNABORTED and the like: the next one
            self.take(conn)

    def pause(self) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(self.listener)
        self.paused_until = time.monotonic() + PAUSE_S

    def resume(self) -> float | None:
        """Listen again after a pause; how long to wait in select (None: no limit)."""
        if not self.paused_until:
            return None
        left = self.paused_until - time.monotonic()
        if left > 0:
            return left
        self.paused_until = 0.0
        self.sel.register(self.listener, selectors.EVENT_READ, "listener")
        return None

    def take(self, conn: socket.socket) -> None:
        """Root's whole part in a connection: who, how many, fork."""
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            conn.close()  # nothing could have been queued by no one
            return
        pid, uid, gid = struct.unpack("3i", creds)
        if uid != 0 and self.active[uid] >= self.per_user:
            self.say(
                f"uid {uid}", f"uid {uid}: {self.per_user} connections open; turning more away"
            )
            self.turn_away(conn, uid, gid)
            return
        child = self.fork(
            conn, lambda: _relay(conn, (pid, uid, gid), self.run, self.log, self.idle)
        )
        if child is None:
            self.turn_away(conn, uid, gid)
            return
        self.relays[child] = uid
        self.active[uid] += 1

    def turn_away(self, conn: socket.socket, uid: int, gid: int) -> None:
        """REFUSED (the client runs the command itself) and close, without root
        reading or releasing what the client queued: after the shutdown nothing
        more can arrive, and anything already there is closed by a fork that is
        the user."""
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            conn.send(REFUSED + HEADER.pack(0))
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        if _queued(conn) == 0:
            conn.close()
            return
        child = None
        if self.closing[uid] < CLOSERS:
            child = self.fork(conn, lambda: _close_as(conn, uid, gid))
        else:  # that many closes hang or lag: the user's own files
            self.say(f"closers {uid}", f"uid {uid}: {CLOSERS} closes under way; root closes")
        if child is None:  # the kernel releases what was queued (a release, no flush)
            conn.close()
            return
        self.closers[child] = uid
        self.closing[uid] += 1

    def fork(self, conn: socket.socket, body: Callable[[], int]) -> int | None:
        """Fork ``body`` with ``conn``; root's copy is closed before the child
        may touch it, so the child's close is always the last one."""
        try:
            r, w = os.pipe2(os.O_CLOEXEC)
        except OSError:
            return None
        try:
            child = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return None
        if child == 0:  # pragma: no cover - the child ends in os._exit
            code = 70
            try:
                os.close(w)
                self.forget()
                os.read(r, 1)  # EOF once root has closed its copy of conn
                os.close(r)
                code = body()
            finally:
                os._exit(code)
        conn.close()
        os.close(r)
        os.close(w)
        return child

    def forget(self) -> None:
        """In a fork: none of the server's descriptors or handlers."""
        signal.set_wakeup_fd(-1)
        for s in (signal.SIGTERM, signal.SIGCHLD, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        self.sel.close()
        self.listener.close()
        for fd in self.own:
            os.close(fd)

    def reap(self) -> None:
        while self.relays or self.closers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for table, counts in ((self.relays, self.active), (self.closers, self.closing)):
                if pid in table:
                    uid = table.pop(pid)
                    counts[uid] -= 1
                    if counts[uid] <= 0:
                        del counts[uid]
                    code = os.waitstatus_to_exitcode(status)
                    if code != 0:
                        self.log(f"relay {pid} of uid {uid} ended with {code}")


def _queued(conn: socket.socket) -> int:
    """Bytes the client sent that no one read (-1: cannot say)."""
    try:
        got = fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return -1
    return int(struct.unpack("i", got)[0])


def serve(
    path: str,
    run: Runner,
    ready: Callable[[], None] = lambda: None,
    log: Log = lambda _: None,
    per_user: int = PER_USER,
    idle: float = IDLE_S,
) -> None:
    """Answer clients on ``path`` until SIGTERM or SIGINT; ``run(argv)`` runs a
    command in a forked child and returns its exit status; ``log`` gets a line
    per command that ended. Commands under way when it stops finish, and
    their relays still answer their clients."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)  # /run/hpvc
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)  # every user's commands come here (and run as that user)
    listener.listen(4096)  # the kernel caps it at net.core.somaxconn
    listener.setblocking(False)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    stop = [False]

    def stopping(_n: int, _f: object) -> None:
        stop[0] = True

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stopping)
    signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only wakes the loop
    server = _Server(listener, run, log, per_user, idle)
    server.own = [wake_r, wake_w]
    server.sel.register(listener, selectors.EVENT_READ, "listener")
    server.sel.register(wake_r, selectors.EVENT_READ, "wake")
    ready()
    try:
        while not stop[0]:
            try:
                for key, _ in server.sel.select(server.resume()):
                    if key.data == "wake":
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_r, 512)
                    elif key.data == "listener":
                        server.accept_all()
                server.reap()
            except Exception as e:  # one error never ends the server
                server.say(type(e).__name__, f"error, going on: {e!r}")
    finally:
        signal.set_wakeup_fd(-1)
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# --- in the forks: everything below runs as the caller, after the drop -----------------


def _relay(
    conn: socket.socket, peer: tuple[int, int, int], run: Runner, log: Log, idle: float
) -> int:
    """Become the caller, read its request, run it in a fork, report how it ended."""
    pid, uid, gid = peer
    found = callers.read(pid, uid)
    problem = "its process is gone" if found is None else callers.too_small(found.limits)
    if found is not None and problem is None:
        problem = callers.join(found.cgroups)
    if found is not None and problem is None:
        callers.apply_limits(found.limits)
    _become(uid, gid, list(found.groups) if found else [gid])
    if problem is not None:
        log(f"uid {uid}: {problem}; the client runs the command itself")
        return _refuse(conn)
    got = _read_request(conn, idle)
    if got is None:
        return 0
    if isinstance(got, str):
        return _refuse(conn)
    request, fds = got
    _who, umask, argv, env = request
    what = f"uid {uid}: {shown(argv)}"[:200]
    began = time.monotonic()
    child = os.fork()
    if child == 0:  # pragma: no cover - the command's process ends in os._exit
        code = 70
        try:
            code = _command(conn, fds, umask, argv, env, run)
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    code, gone = _watch(conn, child)
    went = " (the client went away)" if gone else ""
    log(f"pid {child} {what} -> {code} in {time.monotonic() - began:.3f} s{went}")
    if not gone:
        with contextlib.suppress(OSError):
            conn.sendall(EXIT + HEADER.pack(code))
    conn.close()
    return 0


def shown(argv: list[str]) -> str:
    """argv for a log line: a word with anything but printable ASCII (a
    newline that would start a forged line) or quotes, in JSON quotes."""
    plain = set("!#$%&()*+,-./0123456789:;<=>?@[]^_`{|}~") | set(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    )
    return " ".join(a if a and set(a) <= plain else json.dumps(a) for a in argv)


def _refuse(conn: socket.socket) -> int:
    with contextlib.suppress(OSError):
        conn.sendall(REFUSED + HEADER.pack(0))
    conn.close()
    return 0


def _read_request(conn: socket.socket, idle: float) -> tuple[Request, list[int]] | str | None:
    """The request and its four descriptors; a reason to refuse (str: the
    client runs the command itself); None when the client sent nothing in
    ``idle`` seconds or went away."""
    deadline = time.monotonic() + idle
    buf, fds = bytearray(), []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            data, got, _flags, _addr = socket.recv_fds(conn, 1 << 16, 4)
        except OSError:
            break
        fds += got
        if not data:
            break
        buf += data
        if len(buf) < HEADER.size:
            continue
        (size,) = HEADER.unpack(buf[: HEADER.size])
        if size > MAX_REQUEST or len(fds) != 4:
            reason = "not for us"
        elif len(buf) < HEADER.size + size:
            continue
        else:
            try:
                request = decode(bytes(buf[HEADER.size : HEADER.size + size]))
                reason = "" if request[0] == identity() else "another hpvc"
            except (ValueError, IndexError):
                reason = "bad request"
            if not reason:
                conn.settimeout(None)
                return request, fds
        for fd in fds:
            os.close(fd)
        return reason
    for fd in fds:
        os.close(fd)
    return None


def _watch(conn: socket.socket, child: int) -> tuple[int, bool]:
    """Pass the client's signals on until the command ends: (its status, whether
    the client went away, which SIGTERMs the command)."""
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    pending, gone = b"", False
    while True:
        for fd, _event in poller.poll():
            if fd == pidfd:
                _pid, status = os.waitpid(child, 0)
                os.close(pidfd)
                code = os.waitstatus_to_exitcode(status)
                return (128 - code if code < 0 else code), gone  # a signal: 128 + N
            try:
                data = conn.recv(1 << 12)
            except OSError:
                data = b""
            if not data:
                gone = True
                poller.unregister(conn)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGTERM)
                continue
            pending += data  # "S<signum>" pairs
            while len(pending) >= 2:
                if pending[:1] == SIGNAL and pending[1] in RELAYED:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, pending[1])
                pending = pending[2:]


def _command(
    conn: socket.socket,
    fds: list[int],
    umask: int,
    argv: list[str],
    env: dict[str, str],
    run: Runner,
) -> int:
    """The command's process: the client's descriptors, directory,
    environment and umask; then the command."""
    for s in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    conn.close()
    os.umask(umask & 0o777)
    stdin, stdout, stderr, cwd = fds
    os.fchdir(cwd)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["hpvc", *argv]
    import random

    random.seed()  # not the server's sequence, shared by every child
    return run(argv)


def _close_as(conn: socket.socket, uid: int, gid: int) -> int:
    """Close a turned-away connection as its user: what it carried is released here."""
    _become(uid, gid, [gid])
    conn.close()
    return 0


def _become(uid: int, gid: int, groups: list[int]) -> None:
    """The caller's user and groups (exactly those its process has, however
    many), for good: no way back to root. Root stays root."""
    if uid == 0:
        return
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)

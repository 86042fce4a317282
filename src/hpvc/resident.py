"""A resident hpvc per host: commands run in a fork of a process that has
already imported everything (``hpvc serve``; the server is
``hpvc.resident_server``, this module is the client side and the protocol).

Why: an hpvc command spends most of its wall clock starting, not working
(docs/benchmarks.md: ``hpvc up`` of one node 0.60 s, of which about 0.45 s
is the interpreter and the imports of pydantic, pyroute2 and hpvc itself; a
Slurm step with ``--hpvc`` pays that twice, in ``node check`` and ``node
up``). A site that runs ``hpvc serve`` on each host (systemd, or the test
cluster's scripts) gets those commands started from a warm fork instead.

How: the server listens on a Unix socket (``socket_path``: under /run,
named after the state directory, since that directory is root's alone). A
client (``hpvc.cli.main``, before it imports anything else) sends its argv,
environment, and its stdin, stdout, stderr and working directory as file
descriptors (SCM_RIGHTS). The server forks; the child takes the client's
credentials from the socket (SO_PEERCRED: a user's command runs as that
user, with its groups, exactly as if the user had run hpvc), its
descriptors, directory and environment, runs the command and exits. The
server sends the exit status back; a signal the client gets (Ctrl-C,
SIGTERM, SIGHUP, SIGQUIT) is passed on to the command, and a client that
goes away takes its command with it (SIGTERM: ``up`` rolls back as it does
when killed). Interactive commands (``exec``, ``run``, ``node enter``) and
the benchmarks always run in the client's own process.

A client uses the server only when it answers on the socket and runs the
same hpvc (version and package folder); otherwise, or with
``HPVC_RESIDENT=0``, it runs the command itself. Nothing about a command's
result depends on which way it ran.

This module imports only what the client needs (its whole cost is a
command's start): no json, pathlib, dataclasses or hashlib.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import zlib

TYPE_CHECKING = False  # typing itself is not imported: see above
if TYPE_CHECKING:
    import socket

RUN_DIR = "/run/hpvc"
# Commands that stay in the client's own process: they hand the terminal to
# a program in a node (exec, run, node enter) or run for minutes (bench).
LOCAL = frozenset({"exec", "run", "bench", "serve", "enter"})
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
MAX_REQUEST = 1 << 22  # argv and environment (a spec travels in it: <= 96 KiB)
HEADER = struct.Struct("!I")
EXIT, REFUSED, SIGNAL = b"X", b"R", b"S"


def identity() -> str:
    """Which hpvc this is: a client only uses a server running the same one
    (version, package folder, and when its files were last installed)."""
    import hpvc

    init = os.path.realpath(hpvc.__file__)
    return f"{hpvc.__version__} {os.path.dirname(init)} {os.stat(init).st_mtime_ns}"


def socket_path(state_dir: str | None = None) -> str:
    """The server's socket for a state directory (``$HPVC_STATE_DIR`` or the
    default): ``/run/hpvc/<crc of its real path>.sock``, or
    ``$HPVC_RESIDENT_SOCKET``. (Two state directories with one name would
    only share a server; each command still runs with its caller's
    environment, state directory included.)"""
    given = os.environ.get("HPVC_RESIDENT_SOCKET")
    if given:
        return given
    from hpvc import DEFAULT_STATE_DIR

    root = os.path.realpath(state_dir or os.environ.get("HPVC_STATE_DIR") or DEFAULT_STATE_DIR)
    return f"{RUN_DIR}/{zlib.crc32(root.encode()):08x}.sock"


def encode(argv: list[str], env: dict[str, str], umask: int = 0o022) -> bytes:
    """A request: identity, umask (octal), argc, argv, then KEY=VALUE,
    NUL-separated (none of them can hold a NUL)."""
    head = [identity(), f"{umask:o}", str(len(argv))]
    words = [*head, *argv, *(f"{k}={v}" for k, v in env.items())]
    return "\0".join(words).encode("utf-8", "surrogateescape")


def decode(data: bytes) -> tuple[str, int, list[str], dict[str, str]]:
    """(identity, umask, argv, env) of a request."""
    words = data.decode("utf-8", "surrogateescape").split("\0")
    argc = int(words[2])
    argv = words[3 : 3 + argc]
    env = dict(w.split("=", 1) for w in words[3 + argc :] if "=" in w)
    return words[0], int(words[1], 8), argv, env


def command_words(argv: list[str]) -> set[str]:
    return {a for a in argv[:3] if not a.startswith("-")}


def try_remote(argv: list[str]) -> int | None:
    """Run the command on this host's resident hpvc; its exit status, or None
    when there is none to use (then the caller runs the command itself)."""
    if os.environ.get("HPVC_RESIDENT", "1") == "0" or command_words(argv) & LOCAL:
        return None
    path = socket_path()
    if not os.path.exists(path):  # no server: no socket module either (~2 ms, issue 33)
        return None
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    with sock:
        umask = os.umask(0o022)
        os.umask(umask)
        data = encode(argv, dict(os.environ), umask)
        message = HEADER.pack(len(data)) + data
        cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            socket.send_fds(sock, [message[:1]], [0, 1, 2, cwd])
            sock.sendall(message[1:])
        except OSError:
            return None
        finally:
            os.close(cwd)
        return _wait(sock)


def _wait(sock: socket.socket) -> int | None:
    """Relay signals until the server says how the command ended."""
    previous = {s: signal.signal(s, lambda n, _f: _relay(sock, n)) for s in RELAYED}
    try:
        reply = b""
        while len(reply) < 1 + HEADER.size:
            chunk = sock.recv(1 + HEADER.size - len(reply))
            if not chunk:
                break
            reply += chunk
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if reply[:1] == REFUSED:  # another hpvc: run it here
        return None
    if len(reply) < 1 + HEADER.size or reply[:1] != EXIT:
        print("hpvc: the resident hpvc (hpvc serve) went away; run again", file=sys.stderr)
        return 1
    return int(HEADER.unpack(reply[1:])[0])


def _relay(sock: socket.socket, signum: int) -> None:
    try:
        sock.send(SIGNAL + bytes([signum]))
    except OSError:  # (not contextlib: its import costs this start 4 ms)
        return

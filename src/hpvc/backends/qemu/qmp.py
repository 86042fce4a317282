"""QMP sessions with a QEMU process, and the replies hpvc reads from them.

``qmp`` runs a few commands in one session through ``qemu.qmp``'s asyncio
``QMPClient`` (wrapped here so callers stay synchronous); ``wait_qmp`` waits
until a QEMU that is starting answers, and fails early, quoting its log
(``hpvc.backends.vm.console``), when the process exits first. Every failure
becomes an ``HpvcError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from hpvc.backends.vm.console import with_tail
from hpvc.errors import HpvcError
from hpvc.host.procfs import running
from qemu.qmp import QMPClient, QMPError

QMP_CONNECT_S = 10.0  # the socket appears a little after QEMU starts
QMP_COMMAND_S = 5.0

Command = str | tuple[str, Mapping[str, object]]
T = TypeVar("T")
CANCEL_S = 2.0  # how long an interrupted session may take to close its socket


# --- sessions ------------------------------------------------------------------------


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` in a new event loop; Ctrl-C stays ``KeyboardInterrupt``.

    Not ``asyncio.run``: in Python 3.11 it installs a SIGINT handler that
    turns Ctrl-C into a cancellation of the task, and ``asyncio.wait_for``
    drops that cancellation when the command it awaits ends at the same
    moment; the session then returns as if nothing happened. A migration's
    poll loop is mostly QMP sessions, so a Ctrl-C there was lost now and
    then (CI, 2026-11-27). Here the interpreter's own handler raises
    ``KeyboardInterrupt`` out of the loop, the session is cancelled so its
    ``finally`` closes the socket, and the interrupt goes on to the caller.
    """
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task[T] | None = None
    try:
        loop = asyncio.new_event_loop()
        task = loop.create_task(coro)
        return loop.run_until_complete(task)
    except BaseException:
        if task is None:
            coro.close()  # interrupted before it started
        elif not task.done() and loop is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.wait([task], timeout=CANCEL_S))
        if task is not None and task.done() and not task.cancelled():
            task.exception()  # what we re-raise; asyncio need not log it again
        raise
    finally:
        if loop is not None:
            # Exception, not BaseException: a Ctrl-C that lands here must go on.
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


class _Exited(Exception):
    """The QEMU process went away while we waited for its QMP socket."""


async def _open_unix(path: str, timeout: float, pid: int | None) -> socket.socket:
    """Connect to a unix socket, retrying until it answers or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(QMP_COMMAND_S)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as e:
            sock.close()
            if pid is not None and not running(pid):
                raise _Exited(pid) from e
            if time.monotonic() >= deadline:
                raise HpvcError(f"QMP {path}", f"no answer after {timeout:g} s ({e})") from e
        except OSError as e:  # a timeout (backlog full: another client holds it), EACCES
            sock.close()
            raise HpvcError(f"QMP {path}", str(e) or type(e).__name__) from e
        await asyncio.sleep(0.02)


async def _session(
    path: str, commands: Sequence[Command], connect_s: float, command_s: float, pid: int | None
) -> list[object]:
    start = time.monotonic()
    sock = await _open_unix(path, connect_s, pid)
    client = QMPClient("hpvc")
    try:
        # The greeting comes once QEMU's main loop runs (after memory prealloc).
        greet_s = max(command_s, connect_s - (time.monotonic() - start))
        await asyncio.wait_for(client.connect(sock), greet_s)
        out: list[object] = []
        for cmd in commands:
            name, args = (cmd, None) if isinstance(cmd, str) else cmd
            out.append(await asyncio.wait_for(client.execute(name, args), command_s))
        return out
    except (QMPError, OSError, EOFError, TimeoutError) as e:
        raise HpvcError(f"QMP {path}", str(e) or type(e).__name__) from e
    finally:
        # disconnect() re-raises what ended the session (EOF after `quit`): not an error here.
        with contextlib.suppress(QMPError, OSError, EOFError):
            await client.disconnect()
        sock.close()


def qmp(
    path: str | Path,
    *commands: Command,
    connect_s: float = QMP_CONNECT_S,
    command_s: float = QMP_COMMAND_S,
    pid: int | None = None,
) -> list[object]:
    """Run QMP ``commands`` in one session; their return values in order.

    Connecting retries for ``connect_s`` (stopping early when ``pid`` exits);
    each command may take ``command_s``. Errors become ``HpvcError``.
    """
    try:
        return run(_session(str(path), commands, connect_s, command_s, pid))
    except _Exited as e:
        raise HpvcError(f"QMP {path}", f"QEMU (PID {pid}) exited") from e


def wait_qmp(path: str | Path, pid: int, timeout: float, log: Path) -> float:
    """Wait until QEMU answers on its QMP socket; seconds waited. Fails early if QEMU exits."""
    start = time.monotonic()
    try:
        run(_session(str(path), ["query-status"], timeout, QMP_COMMAND_S, pid))
    except _Exited as e:
        raise HpvcError(f"QEMU (PID {pid})", with_tail("exited while starting", log)) from e
    except HpvcError as e:
        # QEMU may die while the handshake runs (connection reset): say so.
        time.sleep(0.2)
        if not running(pid):
            raise HpvcError(f"QEMU (PID {pid})", with_tail("exited while starting", log)) from e
        raise HpvcError(e.what, with_tail(e.why, log)) from e
    return time.monotonic() - start


# --- replies -------------------------------------------------------------------------


class Memdev(TypedDict):
    """One memory backend as QEMU reports it (``query-memdev``)."""

    id: str
    size: int
    host_nodes: list[int]
    policy: str
    prealloc: bool
    share: bool
    merge: bool


def _as_dicts(value: object, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise HpvcError(f"QMP {what}", f"unexpected reply {value!r:.200}")
    return value


def vcpu_threads(cpus_fast: object) -> dict[int, int]:
    """vCPU index -> host thread ID, from a ``query-cpus-fast`` reply."""
    out: dict[int, int] = {}
    for cpu in _as_dicts(cpus_fast, "query-cpus-fast"):
        index, tid = cpu.get("cpu-index"), cpu.get("thread-id")
        if not isinstance(index, int) or not isinstance(tid, int):
            raise HpvcError("QMP query-cpus-fast", f"no cpu-index/thread-id in {cpu!r:.200}")
        out[index] = tid
    return out


def memdevs(reply: object) -> list[Memdev]:
    """The ``query-memdev`` reply as typed records."""
    return [
        Memdev(
            id=str(m.get("id", "")),
            size=int(m.get("size", 0)),
            host_nodes=[int(n) for n in m.get("host-nodes", [])],
            policy=str(m.get("policy", "")),
            prealloc=bool(m.get("prealloc", False)),
            share=bool(m.get("share", False)),
            merge=bool(m.get("merge", False)),
        )
        for m in _as_dicts(reply, "query-memdev")
    ]

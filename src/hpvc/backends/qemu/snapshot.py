"""A QEMU's whole state to a file and back, over QMP (``hpvc checkpoint``/``restore``).

QEMU's own migration writes the machine (memory, CPU and device state) as a
stream; this module points that stream at a file hpvc opened as root and
hands QEMU by descriptor (``getfd`` over the QMP socket, ``SCM_RIGHTS``):
QEMU runs as the cluster's uid in a seccomp sandbox that forbids ``exec:``
helpers, and cannot open files in hpvc's state. QEMU 7.2 (Debian 12) has no
``file:`` migration yet, so ``fd:`` is the way. The guest is stopped (QMP
``stop``) before any of this: the stream then holds one instant, and its
size is the guest's memory (no dirty pages to send again). Migration's
default bandwidth cap (32 MiB/s) is lifted: it guards a running guest's
network, not a file.

Loading: QEMU started with ``-incoming defer -S`` takes the same stream by
descriptor (``migrate-incoming``) and stays paused until ``cont``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hpvc.backends.qemu.qmp import QMP_COMMAND_S, _open_unix, run
from hpvc.backends.vm.console import with_tail
from hpvc.errors import HpvcError
from hpvc.host.procfs import running
from qemu.qmp import QMPClient, QMPError

FDNAME = "hpvc-checkpoint"
NO_CAP = 1 << 40  # bytes per second: no throttling to a file
POLL_S = 0.05
INCOMING_ARGS = ("-incoming", "defer", "-S")


async def _session(
    path: Path, pid: int, fn: Callable[[QMPClient], Awaitable[Any]], what: str
) -> Any:
    sock = await _open_unix(str(path), QMP_COMMAND_S, pid)
    client = QMPClient("hpvc-checkpoint")
    try:
        await asyncio.wait_for(client.connect(sock), QMP_COMMAND_S)
        return await fn(client)
    except (QMPError, OSError, EOFError, TimeoutError) as e:
        raise HpvcError(what, str(e) or type(e).__name__) from e
    finally:
        with contextlib.suppress(QMPError, OSError, EOFError):
            await client.disconnect()
        sock.close()


async def _hand_fd(client: QMPClient, fd: int) -> None:
    client.send_fd_scm(fd)
    await asyncio.wait_for(client.execute("getfd", {"fdname": FDNAME}), QMP_COMMAND_S)


async def _until_done(client: QMPClient, timeout: float, what: str) -> dict[str, Any]:
    """Poll ``query-migrate`` until it completes; its last reply."""
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.wait_for(client.execute("query-migrate"), QMP_COMMAND_S)
        reply: dict[str, Any] = got if isinstance(got, dict) else {}
        status = str(reply.get("status", ""))
        if status == "completed":
            return reply
        if status in ("failed", "cancelled"):
            raise HpvcError(what, f"QEMU's migration {status}: {reply.get('error-desc', '')}")
        if time.monotonic() > deadline:
            with contextlib.suppress(QMPError, TimeoutError):
                await asyncio.wait_for(client.execute("migrate_cancel"), QMP_COMMAND_S)
            raise HpvcError(what, f"not written after {timeout:g} s (status {status!r})")
        await asyncio.sleep(POLL_S)


def stop_vcpus(qmp_socket: Path, pid: int) -> None:
    """Stop every vCPU of the guest (QMP ``stop``): nothing runs or sends after it."""
    run(_session(qmp_socket, pid, lambda c: c.execute("stop"), f"stop QEMU {pid}"))


def resume(qmp_socket: Path, pid: int) -> None:
    """Let a stopped, saved or loaded guest run (QMP ``cont``)."""
    run(_session(qmp_socket, pid, lambda c: c.execute("cont"), f"resume QEMU {pid}"))


def run_state(qmp_socket: Path, pid: int) -> str:
    reply = run(_session(qmp_socket, pid, lambda c: c.execute("query-status"), f"QEMU {pid}"))
    return str(reply.get("status", "")) if isinstance(reply, dict) else ""


def save_state(qmp_socket: Path, pid: int, dest: Path, timeout: float, log: Path) -> int:
    """Write the stopped guest's machine state to ``dest`` (made here, 0600); its
    size. An error quotes the tail of QEMU's ``log``."""
    what = f"save QEMU {pid} to {dest}"
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    async def go(client: QMPClient) -> None:
        params = {"max-bandwidth": NO_CAP, "downtime-limit": 2000}
        await client.execute("migrate-set-parameters", params)
        await _hand_fd(client, fd)
        await client.execute("migrate", {"uri": f"fd:{FDNAME}"})
        await _until_done(client, timeout, what)

    try:
        run(_session(qmp_socket, pid, go, what))
        os.fsync(fd)
    except HpvcError as e:
        raise HpvcError(what, with_tail(e.why, log)) from e
    finally:
        os.close(fd)
    return dest.stat().st_size


def load_state(qmp_socket: Path, pid: int, src: Path, timeout: float, log: Path) -> None:
    """Feed ``src`` to a QEMU started with ``INCOMING_ARGS``; it stays paused."""
    what = f"restore QEMU {pid} from {src}"
    fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)

    async def go(client: QMPClient) -> None:
        await _hand_fd(client, fd)
        await client.execute("migrate-incoming", {"uri": f"fd:{FDNAME}"})
        # The destination's query-migrate forgets its state once loaded: its
        # run state says it (inmigrate while loading, paused after: -S; a
        # stream QEMU cannot load makes it exit).
        deadline = time.monotonic() + timeout
        while True:
            reply = await asyncio.wait_for(client.execute("query-status"), QMP_COMMAND_S)
            status = str(reply.get("status", "")) if isinstance(reply, dict) else ""
            if status != "inmigrate":
                break
            if time.monotonic() > deadline:
                raise HpvcError(what, f"not loaded after {timeout:g} s")
            await asyncio.sleep(POLL_S)
        if status != "paused":
            raise HpvcError(what, f"QEMU is {status!r} after loading, not paused")

    try:
        run(_session(qmp_socket, pid, go, what))
    except HpvcError as e:
        time.sleep(0.2)
        why = e.why if running(pid) else f"QEMU exited ({e.why})"
        raise HpvcError(what, with_tail(why, log)) from e
    finally:
        os.close(fd)

"""QEMU processes as ``/proc`` shows them: liveness, command line, threads, affinity.

Every reader takes an injectable ``proc`` root (``/proc`` by default), so the
bookkeeping of the VM backends is tested with fake task lists. None
of these raise for a process or thread that is gone: they answer False, an
empty list or an empty name.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import TypedDict

PROC = Path("/proc")


class ThreadAffinity(TypedDict):
    """One host thread of a QEMU process and the CPUs it may run on."""

    tid: int
    name: str
    cpus: list[int]


def running(pid: int, proc: Path = PROC) -> bool:
    """Is ``pid`` a live process (not gone, not a zombie)?"""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (OSError, UnicodeDecodeError):
        return False
    fields = text.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def is_qemu(pid: int, name: str, proc: Path = PROC) -> bool:
    """Does ``pid``'s command line hold ``-name <name>``? (False for zombies and reused PIDs.)"""
    try:
        args = (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return any(a == "-name" and b == name for a, b in itertools.pairwise(args))


def find_qemu(name: str, proc: Path = PROC) -> list[int]:
    """Every process whose command line holds ``-name <name>``."""
    pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())
    return [pid for pid in pids if is_qemu(pid, name, proc)]


def task_ids(pid: int, proc: Path = PROC) -> list[int]:
    """The thread IDs of a process (``/proc/PID/task``); empty when it is gone."""
    try:
        return sorted(int(t.name) for t in (proc / str(pid) / "task").iterdir() if t.name.isdigit())
    except OSError:
        return []


def thread_name(pid: int, tid: int, proc: Path = PROC) -> str:
    """A thread's name (``/proc/PID/task/TID/comm``); empty when it is gone."""
    try:
        return (proc / str(pid) / "task" / str(tid) / "comm").read_text().strip()
    except OSError:
        return ""


def thread_affinity(pid: int, tid: int, proc: Path = PROC) -> ThreadAffinity:
    """A thread's name and the CPUs the kernel lets it run on (none when it is gone)."""
    try:
        cpus = sorted(os.sched_getaffinity(tid))
    except OSError:
        cpus = []
    return ThreadAffinity(tid=tid, name=thread_name(pid, tid, proc), cpus=cpus)


CRUN_ROOT = Path("/run/crun")  # crun's state folder for root: <id>/status


def container_init(cid: str, crun_root: Path = CRUN_ROOT, proc: Path = PROC) -> int | None:
    """The PID of a crun container's init while it still runs (the PID crun
    wrote and the start time it wrote with it), else None. Reads files only."""
    try:
        status = json.loads((crun_root / cid / "status").read_text())
        pid = int(status["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not running(pid, proc):
        return None
    started = status.get("process-start-time")
    if started is not None and start_time(pid, proc) not in (None, str(started)):
        return None  # the PID was reused
    return pid


def root(pid: int, proc: Path = PROC) -> Path:
    """The process's root directory, as the host reaches it (a container's rootfs)."""
    return proc / str(pid) / "root"


def start_time(pid: int, proc: Path = PROC) -> str | None:
    """A process's start time in clock ticks (field 22 of stat): with the PID,
    it names one process even after the PID is reused. None when it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def children(pid: int, proc: Path = PROC) -> list[int]:
    """The direct children of a process's main thread; empty when it is gone."""
    try:
        text = (proc / str(pid) / "task" / str(pid) / "children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def cmdline(pid: int, proc: Path = PROC) -> list[str] | None:
    """A process's arguments; None when it is gone or unreadable."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")


def pids(proc: Path = PROC) -> list[int]:
    """Every process ID, ascending."""
    return sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())


def thread_names(pid: int, proc: Path = PROC) -> dict[int, str]:
    """Thread ID -> name of every thread of a process; empty when it is gone."""
    out: dict[int, str] = {}
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            comm = (task / "comm").read_text().strip()
        except OSError:
            continue
        if task.name.isdigit():
            out[int(task.name)] = comm
    return out


def flock_holders(path: Path, proc: Path = PROC) -> set[int]:
    """The PIDs ``/proc/locks`` says hold a flock on the file ``path`` (empty
    when none, or when the file or the table cannot be read). The device is
    matched by its major and minor numbers, the file by its inode."""
    try:
        st = os.stat(path)
        table = (proc / "locks").read_text()
    except (OSError, UnicodeDecodeError):
        return set()
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    out: set[int] = set()
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue  # a waiter ("->") holds nothing
        try:
            major, minor, inode = fields[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == want:
                out.add(int(fields[4]))
        except ValueError:
            continue
    return out


def read_pidfile(path: Path) -> int | None:
    """The PID a pid file holds; None when it is missing or not a number."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    """A process's environment as it started; empty when gone or unreadable."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (kv.partition("=") for kv in raw.decode(errors="replace").split("\0") if kv)
    return {k: v for k, _, v in pairs}

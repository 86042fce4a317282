"""QEMU processes as ``/proc`` shows them: liveness, command line, threads, affinity.

Every reader takes an injectable ``proc`` root (``/proc`` by default), so the
bookkeeping of ``hpvc.backends.vm_qemu`` is tested with fake task lists. None
of these raise for a process or thread that is gone: they answer False, an
empty list or an empty name.
"""

from __future__ import annotations

import itertools
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

"""What co-resident container nodes share, read from the host: their cluster's
PID and IPC namespaces and /dev/shm (``locality = "shm"``).

Read by the cut of such nodes (``hpvc.backends.crun.shmcut``, docs/checkpoint.md
"Nodes sharing namespaces"): what runs in the shared PID namespace outside every
node's process tree, the SysV IPC objects of the shared IPC namespace, the
deleted /dev/shm files several nodes map, and the highest PID in use; and
written by their restore: where the new namespace's next PID starts.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.host import nodeprocs, procfs

SYSVIPC = ("shm", "sem", "msg")


def ns_path(pid: int, kind: str) -> Path:
    """A process's namespace of ``kind`` (pid, ipc, ...), as /proc names it."""
    return Path(f"/proc/{pid}/ns/{kind}")


def strays(init: int, node_inits: list[int], proc: Path = nodeprocs.PROC) -> list[int]:
    """Live processes of the shared PID namespace of ``init`` (the holder's) in
    no node's tree, the holder's init aside."""
    inside = {init}
    for n in node_inits:
        inside |= nodeprocs.tree(n, proc)
    return sorted(p for p in nodeprocs.namespace(init, proc) - inside if procfs.running(p, proc))


def sysv_objects(init: int) -> list[str]:
    """``shm id 3`` per SysV IPC object of the IPC namespace of ``init``:
    /proc/sysvipc shows the reader's namespace, so a child reads it there."""
    argv = ["nsenter", f"--ipc={ns_path(init, 'ipc')}", "--"]
    each = f'for k in {" ".join(SYSVIPC)}; do sed 1d /proc/sysvipc/$k | sed "s/^/$k /"; done'
    argv += ["sh", "-c", each]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HpvcError("the shared IPC namespace", done.stderr.strip() or "nsenter failed")
    words = [ln.split() for ln in done.stdout.splitlines()]
    return [f"{w[0]} id {w[2]}" for w in words if len(w) > 2]


_DELETED = re.compile(r"^\S+ \S+ \S+ (\S+) (\d+)\s+(/dev/shm/\S.*) \(deleted\)$")


def deleted_shm_maps(pid: int, proc: Path = nodeprocs.PROC) -> dict[tuple[str, int], str]:
    """(device, inode) -> path of every deleted /dev/shm file ``pid`` maps."""
    out: dict[tuple[str, int], str] = {}
    try:
        text = (proc / str(pid) / "maps").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        m = _DELETED.match(line)
        if m:
            out[(m.group(1), int(m.group(2)))] = m.group(3)
    return out


def holds_deleted_shm(pids: set[int], proc: Path = nodeprocs.PROC) -> bool:
    """Does any of ``pids`` map or hold open a deleted /dev/shm file?"""
    for pid in pids:
        if deleted_shm_maps(pid, proc):
            return True
        fds = proc / str(pid) / "fd"
        try:
            links = [os.readlink(fd) for fd in fds.iterdir()]
        except OSError:
            continue  # gone, or a descriptor closed meanwhile
        if any(t.startswith("/dev/shm/") and t.endswith(" (deleted)") for t in links):
            return True
    return False


def shared_deleted(trees: dict[str, set[int]], proc: Path = nodeprocs.PROC) -> list[str]:
    """``path (nodes a, b)`` per deleted /dev/shm file mapped in more than one node."""
    seen: dict[tuple[str, int], tuple[str, set[str]]] = {}
    for name, pids in trees.items():
        for pid in pids:
            for key, path in deleted_shm_maps(pid, proc).items():
                seen.setdefault(key, (path, set()))[1].add(name)
    return sorted(
        f"{path} (nodes {', '.join(sorted(nodes))})"
        for path, nodes in seen.values()
        if len(nodes) > 1
    )


def highest_pid(init: int, proc: Path = nodeprocs.PROC) -> int:
    """The highest PID a process or thread of ``init``'s PID namespace has there."""
    top = 1
    for pid in nodeprocs.namespace(init, proc):
        for status in (proc / str(pid) / "task").glob("*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue  # gone meanwhile
            for line in text.splitlines():
                if line.startswith("NSpid:"):
                    top = max(top, int(line.split()[-1]))
    return top


def set_last_pid(init: int, last: int) -> None:
    """Make ``init``'s PID namespace hand out PIDs above ``last`` from now on
    (its ns_last_pid, which only a process inside it can write: a child there)."""
    write = f"echo {int(last)} > /proc/sys/kernel/ns_last_pid"
    argv = ["nsenter", f"--pid={ns_path(init, 'pid')}", "--", "sh", "-c", write]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HpvcError("the new shared PID namespace", done.stderr.strip() or "nsenter failed")

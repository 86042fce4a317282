"""A container node's processes: its init's tree, its PID namespace, their cgroups.

A task a Slurm step starts in a container node joins the node's namespaces and
the cgroups hpvc limits, and stays in the freezer (and devices, ``name=systemd``)
cgroups Slurm put it in (docs/slurm.md). A job the task leaves running in the
background (``setsid prog &``) is adopted by the node's init when the task
ends: it is then in the node's process tree, but not in the node's freezer
cgroup, so a cut that freezes the node would not stop it and CRIU, dumping
the tree, could not seize it ("Unseizable non-zombie").

``gather`` moves every process of the init's tree into every cgroup of the
init, so the freeze stops it and the dump takes it as one of the node's. It is
not undone (no journal entry): the process is the node's own from then on,
its step having ended; it leaves with the node.

``outside`` lists what runs in the node's PID namespace but would not be
stopped by the node's freeze: a running step's tasks (children of
slurmstepd, outside the node's tree, in Slurm's freezer cgroup). A cut
refuses those (docs/checkpoint.md "Under Slurm"). A running ``hpvc exec``
is not one of them: crun exec puts it in all the node's cgroups.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from hpvc.host import procfs
from hpvc.host.cgroupfs import manager

PROC = Path("/proc")
PASSES = 50  # gather's rounds: a process forked while moving joins in the next


def tree(init: int, proc: Path = PROC) -> set[int]:
    """``init`` and every process below it (empty when it is gone)."""
    if not procfs.running(init, proc):
        return set()
    seen = {init}
    todo = [init]
    while todo:
        for child in procfs.children(todo.pop(), proc):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def _pid_ns(pid: int, proc: Path) -> str | None:
    try:
        return os.readlink(proc / str(pid) / "ns" / "pid")
    except OSError:
        return None


def namespace(init: int, proc: Path = PROC) -> set[int]:
    """Host PIDs of every process in ``init``'s PID namespace (zombies too)."""
    ns = _pid_ns(init, proc)
    if ns is None:
        return set()
    return {p for p in procfs.pids(proc) if _pid_ns(p, proc) == ns}


def outside(init: int, inside: set[int], proc: Path = PROC) -> list[int]:
    """Live processes of ``init``'s PID namespace not in ``inside`` (e.g. the
    members of the node's freezer cgroup: what its freeze would not stop)."""
    return sorted(p for p in namespace(init, proc) - inside if procfs.running(p, proc))


def describe(pids: list[int], proc: Path = PROC, most: int = 3) -> str:
    """``pid 12 (sleep 600), pid 13 (...)`` for a one-line message."""
    words = []
    for pid in pids[:most]:
        argv = [a for a in procfs.cmdline(pid, proc) or [] if a]
        words.append(f"pid {pid} ({' '.join(' '.join(argv).split())[:60] or '?'})")  # one line
    more = f" and {len(pids) - most} more" if len(pids) > most else ""
    return ", ".join(words) + more


def _cgroups(pid: int, proc: Path) -> list[str]:
    try:
        return sorted((proc / str(pid) / "cgroup").read_text().splitlines())
    except OSError:
        return []


def strays(init: int, proc: Path = PROC) -> list[int]:
    """Processes of ``init``'s tree whose cgroups are not the init's."""
    want = _cgroups(init, proc)
    return sorted(
        p
        for p in tree(init, proc) - {init}
        if procfs.running(p, proc) and _cgroups(p, proc) != want
    )


def _move(pid: int, files: tuple[str, ...]) -> bool:
    """Write ``pid`` into each ``cgroup.procs``; False when it is gone."""
    for f in files:
        try:
            Path(f).write_text(str(pid))
        except OSError as e:
            if e.errno == errno.ESRCH:
                return False
            raise
    return True


def gather(init: int, proc: Path = PROC) -> list[int]:
    """Move every process of ``init``'s tree into the init's cgroups (all
    hierarchies); returns the PIDs moved. Into a frozen cgroup a process is
    stopped as it enters, so calling this after the freeze too catches what
    forked meanwhile."""
    files = manager().procs_files(init)
    moved: set[int] = set()
    for _ in range(PASSES):
        now = strays(init, proc)
        if not now:
            break
        for pid in now:
            with contextlib.suppress(ProcessLookupError):
                if _move(pid, files):
                    moved.add(pid)
    return sorted(moved)


CAP_SYS_RESOURCE = 24  # linux/capability.h


def has_capability(bit: int, proc: Path = PROC) -> bool:
    """Does this process hold capability ``bit`` (its effective set)?"""
    try:
        for line in (proc / "self" / "status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _status_ids(pid: int, proc: Path) -> dict[str, list[int]]:
    """The ``Uid`` and ``Gid`` lines of a process's status (real, effective,
    saved, fs); empty when it is gone."""
    out: dict[str, list[int]] = {}
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Uid", "Gid"):
                out[key] = [int(x) for x in rest.split()]
    except (OSError, ValueError):
        return {}
    return out


def _ids(pid: int, proc: Path) -> tuple[set[int], set[int]]:
    """(real, effective and saved uids; the same gids) of a process."""
    ids = _status_ids(pid, proc)
    return set(ids.get("Uid", [])[:3]), set(ids.get("Gid", [])[:3])


def others(init: int, uid: int, gid: int, proc: Path = PROC) -> list[int]:
    """Live processes of ``init``'s tree not wholly ``uid``/``gid`` (real, effective
    and saved): the kernel lets a process without CAP_SYS_RESOURCE read the
    resource limits of those only (``prlimit``), as CRIU's dump does."""
    out = []
    for pid in sorted(tree(init, proc)):
        uids, gids = _ids(pid, proc)
        if procfs.running(pid, proc) and (uids, gids) != ({uid}, {gid}):
            out.append(pid)
    return out


def user_of(pid: int, proc: Path = PROC) -> int:
    """A process's effective uid (-1 when it is gone)."""
    uids = _status_ids(pid, proc).get("Uid", [])
    return uids[1] if len(uids) > 1 else -1

"""A local caller as the kernel describes it, for the resident hpvc
(``hpvc.resident_server``): its supplementary groups, resource limits and
cgroups, read as root from ``/proc/<pid>`` of the process the socket's peer
credentials name, never from anything the caller sends; and joining those
cgroups, so that a user's command through the server runs where and under
the limits that the same command would run without it.

Joining a cgroup moves only the calling process (a fork that runs one
command and ends); nothing is made or changed on the host, so there is
nothing to journal or undo.
"""

from __future__ import annotations

import os
import resource
import select
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
INF = resource.RLIM_INFINITY
# What the fork needs beyond what it already maps, before the command's own use.
ROOM = 64 << 20


@dataclass(frozen=True)
class Caller:
    groups: tuple[int, ...]
    limits: tuple[tuple[int, int, int], ...]  # (resource, soft, hard)
    cgroups: str  # /proc/<pid>/cgroup as the kernel wrote it


def read(pid: int, uid: int, proc: Path = PROC) -> Caller | None:
    """The caller ``pid`` of effective uid ``uid``; None when that process is
    gone or is not that user's (a PID reused since the connection)."""
    try:
        pidfd = os.pidfd_open(pid)  # the PID cannot be reused while this process lives
    except OSError:
        return None
    try:
        status = _fields((proc / str(pid) / "status").read_text())
        if int(status["Uid"].split()[1]) != uid:
            return None
        groups = tuple(int(g) for g in status.get("Groups", "").split())
        limits = _limits((proc / str(pid) / "limits").read_text())  # prlimit needs CAP_SYS_RESOURCE
        cgroups = (proc / str(pid) / "cgroup").read_text()
        if select.select([pidfd], [], [], 0)[0]:  # it ended while we read
            return None
        return Caller(groups, limits, cgroups)
    except (OSError, KeyError, ValueError, IndexError):
        return None
    finally:
        os.close(pidfd)


def _limits(text: str) -> tuple[tuple[int, int, int], ...]:
    """``/proc/<pid>/limits``: one line per resource, in RLIMIT_* order."""
    out = []
    for r, line in enumerate(text.splitlines()[1:]):
        soft, hard = line[26:].split()[:2]
        out.append(
            (
                r,
                INF if soft == "unlimited" else int(soft),
                INF if hard == "unlimited" else int(hard),
            )
        )
    return tuple(out)


def _fields(status: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in status.splitlines() if ":" in line)


def too_small(limits: tuple[tuple[int, int, int], ...], proc: Path = PROC) -> str | None:
    """Why limits this low cannot hold a fork of this process (its address
    space or data already mapped), or None. Such a caller runs its command
    itself, under the same limits."""
    own = _fields((proc / "self" / "status").read_text())
    used = {
        resource.RLIMIT_AS: ("ulimit -v", int(own["VmSize"].split()[0]) << 10),
        resource.RLIMIT_DATA: ("ulimit -d", int(own["VmData"].split()[0]) << 10),
    }
    for r, soft, _hard in limits:
        if r in used and soft != INF and soft < used[r][1] + ROOM:
            name, size = used[r]
            return f"its {name} ({soft >> 10} KiB) is below the server fork's ({size >> 10} KiB)"
    return None


def apply_limits(limits: tuple[tuple[int, int, int], ...]) -> None:
    """Take the caller's limits: exactly, where this process may raise a hard
    limit (CAP_SYS_RESOURCE); otherwise no higher than its own hard limit."""
    for r, soft, hard in limits:
        try:
            resource.setrlimit(r, (soft, hard))
        except (OSError, ValueError):
            own = resource.getrlimit(r)[1]
            resource.setrlimit(r, (_lower(soft, own), _lower(hard, own)))


def _lower(a: int, b: int) -> int:
    return b if a == INF else a if b == INF else min(a, b)


def join(cgroups: str, proc: Path = PROC) -> str | None:
    """Move this process into the cgroups ``cgroups`` lists (the text of a
    ``/proc/<pid>/cgroup``); why not, or None. Afterwards this process's own
    list must read exactly the same, so a cgroup name that fakes a line
    (a newline in a name a user may make) only fails the join."""
    mine = (proc / "self" / "cgroup").read_text()
    if mine == cgroups:
        return None
    have = _memberships(mine)
    mounts = _mounts((proc / "self" / "mountinfo").read_text())
    for controllers, path in _memberships(cgroups).items():
        if have.get(controllers) == path:
            continue
        target = _directory(mounts, controllers, path)
        if target is None:
            return f"its cgroup {path} of {controllers or 'cgroup2'} is not mounted here"
        try:
            (target / "cgroup.procs").write_text("0\n")
        except OSError as e:
            return f"cannot join its cgroup {target}: {e.strerror}"
    if (proc / "self" / "cgroup").read_text() != cgroups:
        return "its cgroups could not be taken exactly"
    return None


def _memberships(text: str) -> dict[str, str]:
    """``controllers -> path`` of a ``/proc/<pid>/cgroup`` ("" for cgroup2)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    return out


def _mounts(mountinfo: str) -> list[tuple[frozenset[str], str, str, str]]:
    """(super options, fstype, root, mount point) of each cgroup mount."""
    out = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if sep and len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            out.append((frozenset(rest[2].split(",")), rest[0], fields[3], fields[4]))
    return out


def _directory(
    mounts: list[tuple[frozenset[str], str, str, str]], controllers: str, path: str
) -> Path | None:
    for options, fstype, root, point in mounts:
        if controllers == "" and fstype != "cgroup2":
            continue
        if controllers and (fstype != "cgroup" or not set(controllers.split(",")) <= options):
            continue
        if root == "/":
            return Path(point + path)
        if path == root or path.startswith(root + "/"):
            return Path(point + path[len(root) :])
    return None

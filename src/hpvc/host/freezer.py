"""Freezing a cgroup's tasks: the v1 freezer (``freezer.state``) or v2's ``cgroup.freeze``.

Checkpoints freeze every container node of a cluster before any is saved
(docs/checkpoint.md), so no node sends or takes a message meanwhile. A freeze
is not a resource to undo: the caller thaws what it froze, also on failure
(``hpvc.cluster.checkpoint``), and a node taken down is gone either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.host.cgroupfs import manager
from hpvc.sysroot import HOST, RootLike

WAIT_S = 30


def cgroup_dir(rel: str, root: RootLike = HOST) -> Path:
    """The folder that freezes cgroup ``rel`` (v1: the freezer hierarchy's)."""
    d = manager(root).dir("freezer", rel)
    if d is None or not d.is_dir():
        raise HpvcError(f"cgroup {rel}", "has no freezer", "is the node running?")
    return d


def _set(d: Path, frozen: bool) -> None:
    v1 = d / "freezer.state"
    if v1.exists():
        v1.write_text("FROZEN" if frozen else "THAWED")
        want = "FROZEN" if frozen else "THAWED"
        deadline = time.monotonic() + WAIT_S
        while v1.read_text().strip() != want:  # FREEZING until every task stopped
            if time.monotonic() > deadline:
                raise HpvcError(f"freezer {d}", f"not {want} after {WAIT_S} s")
            time.sleep(0.005)
        return
    v2 = d / "cgroup.freeze"
    v2.write_text("1" if frozen else "0")
    events = d / "cgroup.events"
    deadline = time.monotonic() + WAIT_S
    while f"frozen {1 if frozen else 0}" not in events.read_text():
        if time.monotonic() > deadline:
            raise HpvcError(f"cgroup {d}", f"not {'frozen' if frozen else 'thawed'} in {WAIT_S} s")
        time.sleep(0.005)


def freeze(rel: str, root: RootLike = HOST) -> None:
    """Stop every task of cgroup ``rel`` (and below); returns once they are stopped."""
    _set(cgroup_dir(rel, root), True)


def thaw(rel: str, root: RootLike = HOST) -> None:
    _set(cgroup_dir(rel, root), False)


def members(rel: str, root: RootLike = HOST) -> set[int]:
    """PIDs in the freezer cgroup ``rel`` and below: what its freeze stops."""
    d = cgroup_dir(rel, root)
    found: set[int] = set()
    for procs in [d / "cgroup.procs", *d.glob("**/cgroup.procs")]:
        with contextlib.suppress(OSError):
            found.update(int(w) for w in procs.read_text().split())
    return found


def is_frozen(rel: str, root: RootLike = HOST) -> bool:
    d = cgroup_dir(rel, root)
    v1 = d / "freezer.state"
    if v1.exists():
        return v1.read_text().strip() == "FROZEN"
    return "frozen 1" in (d / "cgroup.events").read_text()


def kill_frozen(rel: str, root: RootLike = HOST) -> bool:
    """A frozen cgroup's tasks cannot die until thawed: SIGKILL each of them,
    then thaw, so they end without running again (a node taken down frozen,
    ``hpvc checkpoint --stop``, or undone half-restored). True when it was
    frozen; nothing happens to a cgroup that is not."""
    d = manager(root).dir("freezer", rel)
    if d is None or not d.is_dir() or not is_frozen(rel, root):
        return False
    for pid in members(rel, root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _set(d, False)
    return True

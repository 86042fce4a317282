"""Who is on which disk, with which priority and demand: read from the state directory.

A cluster takes part when its NFS server runs in a cgroup of its own
(``hpvc.host.io_coord``): the server node's journal holds that step
(``"io-server-cgroup"``, with the folder the server exports), and the
kernel holds the cgroup. Its demand is its spec's ``[shared] demand``; its
owner, for per-user priorities, is a Slurm job's user, else the owner of its
spec file. An operator's
``hpvc io set`` overrides priority and demand; those overrides live in
``<state>/io/overrides.json``, written atomically under the coordinator's lock
(``coordinator.py``), and outlive the cluster (a cluster of the same name
coming back gets them again) until ``hpvc io set NAME --reset``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc.errors import InputError
from hpvc.host import io_coord
from hpvc.paths import private_dir
from hpvc.spec import parse_spec
from hpvc.store import ClusterRecord, Store

DIRECTIONS = io_coord.DIRECTIONS
GONE = ("deleting",)  # a cluster being taken down gives its share back at once


@dataclass(frozen=True)
class Member:
    """One cluster's storage side, as the state directory and the kernel show it."""

    cluster: str
    owner: str | None
    export: Path
    stable_writes: bool  # the server writes through (its disk I/O is charged to its cgroup)
    demand: dict[str, int | None]  # the spec's, per direction
    cgroup: io_coord.ServerCgroup


def io_dir(store: Store) -> Path:
    return private_dir(store.root / "io")


def _owner(rec: ClusterRecord) -> str | None:
    """Who brought the cluster up: a Slurm share's job user, else the owner of
    its spec file, when it is one."""
    if rec.user is not None and rec.user.get("name"):
        return str(rec.user["name"])
    with contextlib.suppress(OSError, KeyError):
        return pwd.getpwuid(os.stat(rec.spec_path).st_uid).pw_name
    return None


def _server_step(store: Store, rec: ClusterRecord) -> dict[str, Any] | None:
    """The ``io-server-cgroup`` step of the cluster's server node, if any."""
    shared = rec.plan.get("shared") or {}
    node = shared.get("node")
    if shared.get("server") != "nfs" or not node:
        return None
    steps = [
        c.args for c in store.node_journal(rec.name, node).entries() if c.kind == io_coord.KIND
    ]
    return steps[-1] if steps else None


def _demand(rec: ClusterRecord) -> dict[str, int | None]:
    try:
        demand = parse_spec(rec.spec, rec.spec_path).shared.demand
    except InputError:
        demand = None
    return {d: getattr(demand, d, None) for d in DIRECTIONS}


def members(store: Store) -> list[Member]:
    """Every cluster here whose NFS server runs in its own cgroup, by name."""
    out = []
    for name in store.names():
        rec = store.load(name)
        if rec is None or rec.status in GONE:
            continue
        step = _server_step(store, rec)
        cg = io_coord.find(name) if step is not None else None
        if step is None or cg is None:
            continue
        out.append(
            Member(
                cluster=name,
                owner=_owner(rec),
                export=Path(step["export"]),
                stable_writes=bool(step.get("stable_writes")),
                demand=_demand(rec),
                cgroup=cg,
            )
        )
    return out


# --- operator overrides (hpvc io set) ---------------------------------------------------


@dataclass(frozen=True)
class Override:
    priority: int | None = None
    read: int | None = None
    write: int | None = None


def load_overrides(store: Store) -> dict[str, Override]:
    path = store.root / "io" / "overrides.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise InputError(f"coordinator overrides {path}", f"unreadable: {e}", "remove it") from e
    return {name: Override(**v) for name, v in data.get("clusters", {}).items()}


def save_overrides(store: Store, overrides: dict[str, Override]) -> None:
    """Write the overrides atomically (call under the coordinator's lock)."""
    d = io_dir(store)
    doc = {"clusters": {n: vars(o) for n, o in sorted(overrides.items())}}
    tmp = d / "overrides.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / "overrides.json")

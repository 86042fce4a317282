"""hpvc's state on one host: one directory, one lock, one record per cluster.

Layout under the state directory (``$HPVC_STATE_DIR``, default /var/lib/hpvc):

    state.lock                    flock: planning and booking CPUs is serialised
    host-journal.jsonl            host-wide changes shared by clusters (undone with the last)
    clusters/<name>/cluster.json  spec, plan, status, what the cluster holds
    clusters/<name>/journal.jsonl cluster-wide host changes, undone last
    clusters/<name>/nodes/<node>/journal.jsonl   one node's host changes
    locks/<name>.lock             one cluster's lock (up, scale, down)
    run/<name>/<node>/            sockets and pid files of a node (VMs)

Only root may enter it: every folder hpvc makes here is 0700 from the start
(``hpvc.paths.private_dir``), so no other user reaches a node's root, its
shared memory or the state of anyone's cluster, nor lists who runs what
(under Slurm the clusters are other users' jobs). ``clusters``, ``locks`` and
``run`` left open by an older hpvc are closed when next used.

Records are written atomically (temp file + rename), so a crash of the CLI
leaves either the old or the new record, never half of one; the journals
say what to undo. Two commands on one host never book the same CPU: the
planner runs, and the record is written, under the lock.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from hpvc.errors import InputError
from hpvc.host.journal import Journal
from hpvc.locks import file_lock, owned_lock
from hpvc.paths import DEFAULT_STATE_DIR as DEFAULT_STATE_DIR
from hpvc.paths import private_dir
from hpvc.paths import state_dir as state_dir
from hpvc.plan.model import Plan, Reservations, plan_from_json
from hpvc.plan.reservations import Holding, merge


@dataclass
class ClusterRecord:
    """One cluster on this host. ``backend`` names its entry in
    ``hpvc.backends.registry``; ``backend_state`` is that backend's own typed
    ``State`` record as JSON (PIDs, accelerator, shared-memory holder, ...)."""

    name: str
    spec: dict[str, Any]
    spec_path: str
    plan: dict[str, Any]
    status: str  # creating | running | scaling | failed | deleting
    created: float
    updated: float
    holdings: dict[str, Holding] = field(default_factory=dict)
    backend: str = ""
    backend_state: dict[str, Any] = field(default_factory=dict)
    hugetlbfs: dict[str, str] = field(default_factory=dict)  # page KiB -> the cluster's mount
    # Hugepages the cluster holds here, "<NUMA node>:<page KiB>" -> pages (mapped
    # or not; hpvc.cluster.pages); while scaling, the old and new plans' larger.
    pages: dict[str, int] | None = None
    binds: list[str] = field(default_factory=list)  # host directories a site shares (Slurm)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase of `up`
    up_seconds: float | None = None
    overlay: dict[str, Any] | None = None  # hpvc.plan.overlay.Overlay: the network across hosts
    # Run for an ordinary user (a Slurm share), not by root for root: what a user
    # can reach of the nodes is hardened (container roots nosuid,nodev).
    tenant: bool = False

    def the_plan(self) -> Plan:
        return plan_from_json(self.plan)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClusterRecord:
        holdings = {h: Holding(**v) for h, v in d.get("holdings", {}).items()}
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in d.items() if k in known}, "holdings": holdings})


class Store:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state_dir()

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock over planning and record changes on this host."""
        private_dir(self.root)
        with file_lock(self.root / "state.lock"):
            yield

    @contextmanager
    def cluster_lock(self, name: str, what: str, on_wait: Callable[[str], None]) -> Iterator[None]:
        """One cluster's lock, held by up, scale and down (and the Slurm node
        commands) for their whole run: a second caller waits, told who holds it.
        Outside the cluster's folder, which ``down`` removes. Take it before
        ``lock()``, never inside it."""
        private_dir(self.root / "locks", tighten=True)
        with owned_lock(self.cluster_lock_path(name), f"PID {os.getpid()} ({what})", on_wait):
            yield

    def cluster_lock_path(self, name: str) -> Path:
        """The file of ``cluster_lock`` (``status`` asks whether anyone holds it)."""
        return self.root / "locks" / f"{name}.lock"

    def cluster_dir(self, name: str) -> Path:
        return self.root / "clusters" / name

    def node_dir(self, name: str, node: str) -> Path:
        return self.cluster_dir(name) / "nodes" / node

    def run_dir(self, name: str) -> Path:
        """The cluster's folder of sockets and pid files, made (privately) if missing."""
        return private_dir(private_dir(self.root / "run", tighten=True) / name)

    def journal(self, name: str) -> Journal:
        return Journal(self.cluster_dir(name) / "journal.jsonl")

    def node_journal(self, name: str, node: str) -> Journal:
        return Journal(self.node_dir(name, node) / "journal.jsonl")

    def host_journal(self) -> Journal:
        return Journal(self.root / "host-journal.jsonl")

    def names(self) -> list[str]:
        base = self.root / "clusters"
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if (p / "cluster.json").exists())

    def load(self, name: str) -> ClusterRecord | None:
        try:
            data = json.loads((self.cluster_dir(name) / "cluster.json").read_text())
        except FileNotFoundError:
            return None
        return ClusterRecord.from_json(data)

    def get(self, name: str) -> ClusterRecord:
        rec = self.load(name)
        if rec is None:
            raise InputError(f"cluster {name!r}", "no such cluster", "see hpvc ls")
        return rec

    def save(self, rec: ClusterRecord) -> None:
        rec.updated = time.time()
        private_dir(self.root / "clusters", tighten=True)
        d = private_dir(self.cluster_dir(rec.name))
        tmp = d / "cluster.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(rec.to_json(), indent=1) + "\n")
        os.replace(tmp, d / "cluster.json")

    def remove(self, name: str) -> None:
        """Delete the cluster's state directory and its run directory (sockets,
        pid files, consoles of its nodes), after its journals are undone."""
        shutil.rmtree(self.cluster_dir(name), ignore_errors=True)
        shutil.rmtree(self.root / "run" / name, ignore_errors=True)

    def reservations(self, exclude: str | None = None) -> Reservations:
        """What every other cluster on this host holds, for the planner."""
        records = (self.load(n) for n in self.names() if n != exclude)
        return merge(r.holdings for r in records if r is not None)

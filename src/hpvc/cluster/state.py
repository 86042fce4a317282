"""hpvc's state on one host: one directory, one lock, one record per cluster.

Layout under the state directory (``$HPVC_STATE_DIR``, default /var/lib/hpvc):

    state.lock                    flock: planning and booking CPUs is serialised
    host-journal.jsonl            host-wide changes shared by clusters (undone with the last)
    clusters/<name>/cluster.json  spec, plan, status, what the cluster holds
    clusters/<name>/journal.jsonl cluster-wide host changes, undone last
    clusters/<name>/nodes/<node>/journal.jsonl   one node's host changes

Records are written atomically (temp file + rename), so a crash of the CLI
leaves either the old or the new record, never half of one; the journals
say what to undo. Two commands on one host never book the same CPU: the
planner runs, and the record is written, under the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpvc.errors import InputError
from hpvc.host.journal import Journal
from hpvc.plan.model import HostReservation, Plan, Reservations, plan_from_json

DEFAULT_STATE_DIR = "/var/lib/hpvc"


def state_dir() -> Path:
    return Path(os.environ.get("HPVC_STATE_DIR", DEFAULT_STATE_DIR))


@dataclass
class Holding:
    """What a cluster holds on one host (other clusters' planner input)."""

    dedicated_cpus: list[int] = field(default_factory=list)
    shared_cpus: list[int] = field(default_factory=list)
    hpc_packages: list[int] = field(default_factory=list)
    commodity_packages: list[int] = field(default_factory=list)


@dataclass
class ClusterRecord:
    name: str
    spec: dict[str, Any]
    spec_path: str
    plan: dict[str, Any]
    status: str  # creating | running | scaling | failed | deleting
    created: float
    updated: float
    holdings: dict[str, Holding] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def the_plan(self) -> Plan:
        return plan_from_json(self.plan)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClusterRecord:
        holdings = {h: Holding(**v) for h, v in d.get("holdings", {}).items()}
        return cls(**{**d, "holdings": holdings})


def holdings_of(plan: Plan, cpu_package: dict[str, dict[int, int]]) -> dict[str, Holding]:
    """Per host: pinned CPUs, floated-over CPUs and sockets the plan holds."""
    out: dict[str, Holding] = {}
    hpc = {h.name: list(h.hpc_packages) for h in plan.hosts}
    for n in plan.nodes:
        h = out.setdefault(n.host, Holding())
        target = h.dedicated_cpus if n.pinning == "dedicated" else h.shared_cpus
        target.extend(c for c in n.cpuset if c not in target)
        if n.partition == "hpc":
            h.hpc_packages = hpc.get(n.host, [])
        else:
            pkgs = cpu_package.get(n.host, {})
            h.commodity_packages = sorted(
                set(h.commodity_packages) | {pkgs[c] for c in n.cpuset if c in pkgs}
            )
    return out


class Store:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state_dir()

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock over planning and record changes on this host."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "state.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def cluster_dir(self, name: str) -> Path:
        return self.root / "clusters" / name

    def node_dir(self, name: str, node: str) -> Path:
        return self.cluster_dir(name) / "nodes" / node

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
        d = self.cluster_dir(rec.name)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "cluster.json.tmp"
        tmp.write_text(json.dumps(rec.to_json(), indent=1) + "\n")
        os.replace(tmp, d / "cluster.json")

    def remove(self, name: str) -> None:
        """Delete the cluster's state directory (after its journals are undone)."""
        shutil.rmtree(self.cluster_dir(name), ignore_errors=True)

    def reservations(self, exclude: str | None = None) -> Reservations:
        """What every other cluster on this host holds, for the planner."""
        hosts: dict[str, dict[str, set[int]]] = {}
        for name in self.names():
            if name == exclude:
                continue
            rec = self.load(name)
            if rec is None:
                continue
            for host, h in rec.holdings.items():
                acc = hosts.setdefault(host, {k: set() for k in asdict(Holding())})
                for k, v in asdict(h).items():
                    acc[k].update(v)
        return Reservations(
            hosts=tuple(
                HostReservation(
                    host=host,
                    dedicated_cpus=frozenset(a["dedicated_cpus"]),
                    shared_cpus=frozenset(a["shared_cpus"]),
                    hpc_packages=frozenset(a["hpc_packages"]),
                    commodity_packages=frozenset(a["commodity_packages"]),
                )
                for host, a in sorted(hosts.items())
            )
        )

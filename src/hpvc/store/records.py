"""hpvc's state on one host: one directory, one lock, one record per cluster.

The state directory (``$HPVC_STATE_DIR``, default /var/lib/hpvc) is laid out
as ``hpvc.paths`` says (``Layout``): the state lock, the host journal, each
cluster's folder with its record and journals, the clusters' locks, their
nodes' sockets, the space reserve.

Only root may enter it: every folder hpvc makes here is 0700 from the start
(``hpvc.paths.private_dir``), so no other user reaches a node's root, its
shared memory or the state of anyone's cluster, nor lists who runs what
(under Slurm the clusters are other users' jobs). ``clusters``, ``locks`` and
``run`` left open by an older hpvc are closed when next used.

Records are written atomically (temp file + rename), so a crash of the CLI
leaves either the old or the new record, never half of one; the journals
say what to undo. Two commands on one host never book the same CPU: the
planner runs, and the record is written, under the lock.

A full state disk must not stop ``down`` or ``scale`` (a job inside a node
can fill it: each node's writable layer lives here). The journals are undone
without writing (``hpvc.host.journal``); the record is the one thing they
write, and ``save`` keeps a reserve for it: ``space-reserve``, made (or
topped up) after each save while there is room. A save that meets ENOSPC
takes the reserve's blocks over: the reserve is renamed to the temporary
record and overwritten in place, so no job that keeps writing can win the
space in between; the next save with room makes a new reserve.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpvc.errors import InputError
from hpvc.host.journal import Journal
from hpvc.locks import file_lock, owned_lock
from hpvc.paths import DEFAULT_STATE_DIR as DEFAULT_STATE_DIR
from hpvc.paths import RECORD, Layout, private_dir
from hpvc.paths import state_dir as state_dir
from hpvc.plan.reservations import Holding, merge

if TYPE_CHECKING:
    from hpvc.plan.model import Plan, Reservations

# The plan's classes and the site's limits are imported where used: `hpvc ls`
# reads records without them (issue 33 item 4, hpvc.cluster.listing).

RESERVE_BYTES = 1 << 20  # far more than a record (tens of KiB for a large cluster)
FULL = (errno.ENOSPC, errno.EDQUOT)


def full(e: BaseException) -> bool:
    """Is ``e`` a write refused because the disk (or a quota) is full?"""
    return isinstance(e, OSError) and e.errno in FULL


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
    # What the host keeps of each node's console log, in MiB, twice that with
    # the rotated file (hpvc.host.console_ring): a Slurm share's is the plugin's
    # max_console; None: the site's (/etc/hpvc/limits.toml) when a node starts.
    console_mib: int | None = None
    # Which image each node runs: node -> the image store's digest its spec's
    # image name pointed to when the node was made (hpvc.cluster.images.record):
    # an imported image's config digest, a built image's recipe digest. Empty in
    # records written before it was kept, and for nodes whose image was not found.
    images: dict[str, str] = field(default_factory=dict)
    # A Slurm share's job user ({"uid", "gid", "name"}; hpvc.slurm.node): what the
    # cluster runs for the job in its nodes (Spark's daemons) runs as that user,
    # and the storage coordinator takes the user as the share's owner (docs/io.md).
    user: dict[str, Any] | None = None

    def image_name(self) -> str:
        """The image the spec names (``hpc`` when it names none)."""
        return str(self.spec.get("image", "hpc"))

    def image_digests(self) -> dict[str, list[str]]:
        """Digest -> the nodes running it, sorted by digest (one entry when all
        nodes run one; empty when the record does not say)."""
        out: dict[str, list[str]] = {}
        for node, digest in sorted(self.images.items()):
            if digest:
                out.setdefault(digest, []).append(node)
        return dict(sorted(out.items()))

    def console_bytes(self) -> int:
        """What the host keeps of each node's console log, in bytes."""
        from hpvc.spec.limits import read_site

        return (self.console_mib or read_site().max_console_mib) << 20

    def the_plan(self) -> Plan:
        from hpvc.plan.model import plan_from_json

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

    @property
    def layout(self) -> Layout:
        """Where each thing is in this state directory."""
        return Layout(self.root)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock over planning and record changes on this host."""
        private_dir(self.root)
        with file_lock(self.layout.state_lock()):
            yield

    @contextmanager
    def cluster_lock(self, name: str, what: str, on_wait: Callable[[str], None]) -> Iterator[None]:
        """One cluster's lock, held by up, scale and down (and the Slurm node
        commands) for their whole run: a second caller waits, told who holds it.
        Outside the cluster's folder, which ``down`` removes. Take it before
        ``lock()``, never inside it."""
        private_dir(self.layout.locks(), tighten=True)
        with owned_lock(self.cluster_lock_path(name), f"PID {os.getpid()} ({what})", on_wait):
            yield

    def cluster_lock_path(self, name: str) -> Path:
        """The file of ``cluster_lock`` (``status`` asks whether anyone holds it)."""
        return self.layout.cluster_lock(name)

    def cluster_dir(self, name: str) -> Path:
        return self.layout.cluster_dir(name)

    def node_dir(self, name: str, node: str) -> Path:
        return self.layout.node_dir(name, node)

    def run_dir(self, name: str) -> Path:
        """The cluster's folder of sockets and pid files, made (privately) if missing."""
        private_dir(self.layout.runs(), tighten=True)
        return private_dir(self.layout.run_dir(name))

    def journal(self, name: str) -> Journal:
        return Journal(self.layout.journal(name))

    def node_journal(self, name: str, node: str) -> Journal:
        return Journal(self.layout.node_journal(name, node))

    def host_journal(self) -> Journal:
        return Journal(self.layout.host_journal())

    def vxlan_port_journal(self) -> Journal:
        """The VXLAN port holder's (``hpvc.host.vxlan.hold_port``): no cluster undoes it."""
        return Journal(self.layout.vxlan_port_journal())

    def names(self) -> list[str]:
        base = self.layout.clusters()
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if (p / RECORD).exists())

    def load(self, name: str) -> ClusterRecord | None:
        try:
            data = json.loads(self.layout.record(name).read_text())
        except FileNotFoundError:
            return None
        return ClusterRecord.from_json(data)

    def get(self, name: str) -> ClusterRecord:
        rec = self.load(name)
        if rec is None:
            raise InputError(f"cluster {name!r}", "no such cluster", "see hpvc ls")
        return rec

    def save(self, rec: ClusterRecord) -> None:
        """Write the record atomically; on a full disk into the reserve's blocks."""
        rec.updated = time.time()
        private_dir(self.layout.clusters(), tighten=True)
        private_dir(self.cluster_dir(rec.name))
        final = self.layout.record(rec.name)
        tmp = final.with_name(final.name + ".tmp")
        data = (json.dumps(rec.to_json(), indent=1) + "\n").encode()
        try:
            _write_new(tmp, data)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if not full(e) or not self._write_in_reserve(tmp, data):
                raise
        os.replace(tmp, final)
        self._refill_reserve()

    def _write_in_reserve(self, tmp: Path, data: bytes) -> bool:
        """``data`` into ``tmp`` over the reserve's blocks (no allocation); False
        when there is no reserve, or one too small."""
        reserve = self.layout.reserve()
        try:
            if reserve.stat().st_size < len(data):
                return False
            os.replace(reserve, tmp)
        except OSError:  # none (FileNotFoundError), or another file system
            return False
        fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _refill_reserve(self) -> None:
        """Top the reserve up to ``RESERVE_BYTES`` with what free space there is
        (real zeros, not a sparse file: the blocks must be allocated)."""
        path = self.layout.reserve()
        with contextlib.suppress(OSError):
            if path.stat().st_size >= RESERVE_BYTES:
                return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return
        try:
            size = os.fstat(fd).st_size
            zeros = bytes(64 << 10)
            while size < RESERVE_BYTES:
                size += os.write(fd, zeros[: RESERVE_BYTES - size])
        except OSError:
            pass  # the disk is full: the reserve grows on a later save
        finally:
            os.close(fd)

    def remove(self, name: str) -> None:
        """Delete the cluster's state directory and its run directory (sockets,
        pid files, consoles of its nodes), after its journals are undone."""
        shutil.rmtree(self.cluster_dir(name), ignore_errors=True)
        shutil.rmtree(self.layout.run_dir(name), ignore_errors=True)

    def reservations(self, exclude: str | None = None) -> Reservations:
        """What every other cluster on this host holds, for the planner."""
        records = (self.load(n) for n in self.names() if n != exclude)
        return merge(r.holdings for r in records if r is not None)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)

"""The multi-user storage bandwidth coordinator: who gets how much of each shared disk.

The seed's "multi-user coordinator" with its "VNode Sync": the site file
(``site.py``) declares each shared disk's read and write bandwidth and the
priorities; each cluster declares its demand (spec ``[shared] demand``); the
coordinator shares every disk out by weighted max-min fairness (``alloc.py``)
among the clusters whose data is on it (``state.py``) and writes the result
as throttles into the cgroup of each cluster's NFS server, the processes
doing that cluster's I/O on the storage side (``hpvc.host.io_coord``).

``rebalance`` runs under a file lock (``<state>/io/io.lock``), so two changes
never race: each reads the whole state afresh and writes every cluster's
throttles. It is called when a cluster comes or goes (``after_change``, from
``hpvc.cluster.lifecycle``) and by ``hpvc io set``; nothing is restarted, a
throttle file takes effect at once. A cluster is never throttled below
``MIN_RATE``: its nodes' NFS client gives up a request after 10 s, and one
1 MiB WRITE must fit in that.

A limit is written only where it is needed: in a direction where a cluster's
allocation is below the disk's capacity (others compete, or its demand caps
it). A cluster alone on its disk with no demand runs as if unmanaged: no
throttle, its writes buffered, nothing lost (``hpvc bench coordinator``).

Enforcing a write limit needs the server's disk I/O in its own context (the
kernel's flusher is charged to the root cgroup under cgroup v1). A share on a
loop file system (spec ``[shared] size``) is switched live to synchronous
writes while its write limit is in force, and back to buffered when it is
lifted (``nfs_backing.set_sync``, a remount). A share on a plain folder of a
managed disk cannot be switched without restarting its server, so a server
started while the site file declares that disk writes every WRITE through
for its whole life (``ServerIO.stable_writes``, Ganesha's ``NFS_Commit``).
See docs/io.md for what the kernel charges and what is not covered.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpvc.coordinator import alloc
from hpvc.coordinator.site import FIX, Priorities, Site, load_site, site_path
from hpvc.coordinator.state import (
    DIRECTIONS,
    Member,
    Override,
    io_dir,
    load_overrides,
    members,
    save_overrides,
)
from hpvc.errors import HpvcError, InputError
from hpvc.host import io_coord, nfs_backing
from hpvc.host.blkio import block_device
from hpvc.host.journal import Journal
from hpvc.locks import file_lock
from hpvc.store import Store

MIN_RATE = 1_000_000  # bytes/s: a 1 MiB NFS WRITE within the client's 10 s timeout
APPLIED = "applied"  # <state>/io/applied: throttles were written (removed when none are)
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SiteDevice:
    name: str
    numbers: io_coord.Device
    capacity: dict[str, int | None]


def resolve(site: Site, path: Path) -> list[SiteDevice]:
    """The site's disks as device numbers (a ``path`` is looked up here)."""
    out: list[SiteDevice] = []
    for name, d in site.devices.items():
        numbers = d.numbers()
        if numbers is None:
            where = f"site file {path}: devices.{name}.path"
            if not Path(d.path or "").exists():
                raise InputError(where, f"{d.path} does not exist", FIX)
            numbers = block_device(Path(d.path or ""))
            if numbers is None:
                raise InputError(where, f"no block device under {d.path} (tmpfs, overlay?)", FIX)
        clash = [o.name for o in out if o.numbers == numbers]
        if clash:
            raise InputError(
                f"site file {path}: devices.{name}",
                f"the same disk ({io_coord.key(numbers)}) as devices.{clash[0]}",
                "declare each disk once",
            )
        out.append(SiteDevice(name, numbers, {"read": d.read, "write": d.write}))
    return out


@dataclass(frozen=True)
class Target:
    """What one cluster gets: its priority, demand and allocation, and why."""

    member: Member
    storage: io_coord.Storage | None
    device: SiteDevice | None
    priority: int
    priority_from: str
    demand: dict[str, int | None]
    demand_from: dict[str, str]
    allocation: dict[str, int | None]  # bytes/s per direction; None: not limited

    @property
    def cluster(self) -> str:
        return self.member.cluster


def _target(
    m: Member, devices: list[SiteDevice], prio: Priorities, over: Override | None
) -> Target:
    storage = io_coord.storage(m.export)
    device = next((d for d in devices if storage and d.numbers == storage.disk), None)
    priority, source = prio.of(m.cluster, m.owner)
    if over is not None and over.priority is not None:
        priority, source = over.priority, "hpvc io set"
    demand, demand_from = dict(m.demand), {d: "spec" if m.demand[d] else "none" for d in DIRECTIONS}
    for d in DIRECTIONS:
        value = getattr(over, d, None) if over is not None else None
        if value is not None:
            demand[d], demand_from[d] = value, "hpvc io set"
    none: dict[str, int | None] = {d: None for d in DIRECTIONS}
    return Target(m, storage, device, priority, source, demand, demand_from, none)


def plan(
    site: Site | None,
    devices: list[SiteDevice],
    found: list[Member],
    overrides: dict[str, Override],
) -> list[Target]:
    """Every member's target: weighted max-min fair shares per disk and direction."""
    prio = site.priority if site is not None else Priorities()
    targets = [_target(m, devices, prio, overrides.get(m.cluster)) for m in found]
    for dev in devices:
        on = [t for t in targets if t.device is dev]
        for direction in DIRECTIONS:
            capacity = dev.capacity[direction]
            if capacity is None or not on:
                continue
            claims = [alloc.Claim(t.cluster, t.priority, t.demand[direction]) for t in on]
            shares = alloc.allocate(capacity, claims)
            for t in on:  # Target is frozen; allocation is its own dict
                t.allocation[direction] = max(MIN_RATE, shares[t.cluster])
    return targets


def limited(t: Target) -> dict[str, bool]:
    """Per direction: must the kernel hold ``t`` to its allocation? Only where the
    allocation is below the disk's capacity; a cluster that may take all of it
    needs no throttle (and no synchronous writes)."""
    out = {}
    for d in DIRECTIONS:
        cap = t.device.capacity[d] if t.device is not None else None
        share = t.allocation[d]
        out[d] = cap is not None and share is not None and share < cap
    return out


def write_mode(t: Target) -> str:
    """How ``t``'s server writes now: ``through`` (Ganesha's NFS_Commit, for its
    life), ``sync`` (its loop file system switched to synchronous writes), or
    ``buffered``."""
    if t.member.stable_writes:
        return "through"
    loop = t.storage is not None and t.storage.loop is not None
    return "sync" if loop and limited(t)["write"] else "buffered"


def _apply(t: Target) -> list[str]:
    """Write ``t``'s throttles (and its file system's write mode); drop any the
    cgroup holds on other devices."""
    cg = t.member.cgroup
    wanted = t.storage.devices() if t.storage is not None and t.device is not None else ()
    need = limited(t)
    rates = {d: t.allocation[d] if need[d] else None for d in DIRECTIONS}
    if t.storage is not None and t.storage.loop is not None and not t.member.stable_writes:
        # Synchronous first, then the limit: no buffered burst escapes it.
        with contextlib.suppress(HpvcError):  # its file system gone: the cluster is going
            if nfs_backing.set_sync(t.member.export, write_mode(t) == "sync"):
                _log.info("storage coordinator: %s writes %s", t.cluster, write_mode(t))
    for dev in wanted:
        io_coord.set_limits(cg, dev, rates)
    stale = [k for k, v in io_coord.limits(cg).items() if any(v.values())]
    for k in stale:
        if k not in {io_coord.key(d) for d in wanted}:
            major, minor = (int(x) for x in k.split(":"))
            io_coord.set_limits(cg, (major, minor), {d: None for d in DIRECTIONS})
    return [io_coord.key(d) for d in wanted]


@contextlib.contextmanager
def _locked(store: Store) -> Iterator[None]:
    with file_lock(io_dir(store) / "io.lock"):
        yield


def load_devices(site_file: Path | None) -> tuple[Path, Site | None, list[SiteDevice]]:
    """(site file, site, its disks resolved); InputError for a bad file."""
    path, site = load_site(site_file)
    return path, site, resolve(site, path) if site is not None else []


def rebalance(store: Store, site_file: Path | None = None) -> dict[str, Any]:
    """Compute every cluster's share and write the throttles, under the lock.
    A bad site file raises InputError before anything is written."""
    t0 = time.perf_counter()
    with _locked(store):
        path, site, devices = load_devices(site_file)
        targets = plan(site, devices, members(store), load_overrides(store))
        applied = {t.cluster: _apply(t) for t in targets}
        marker = io_dir(store) / APPLIED
        if any(applied.values()):
            marker.touch()
        else:
            marker.unlink(missing_ok=True)
    return {
        "site": str(path) if site is not None else None,
        "seconds": time.perf_counter() - t0,
        "clusters": {t.cluster: _row(t) for t in targets},
    }


def needed(store: Store, site_file: Path | None = None) -> bool:
    """Is there anything for ``rebalance`` to do: a site file, or throttles written before."""
    path, _named = site_path(site_file)
    return path.exists() or (store.root / "io" / APPLIED).exists()


def _row(t: Target) -> dict[str, Any]:
    return {
        "device": t.device.name if t.device is not None else None,
        "priority": t.priority,
        "priority_from": t.priority_from,
        "demand": t.demand,
        "demand_from": t.demand_from,
        "allocation": t.allocation,
        "stable_writes": t.member.stable_writes,
        "limited": limited(t),
        "writes": write_mode(t),
    }


def set_cluster(
    store: Store,
    cluster: str,
    *,
    priority: int | None = None,
    read: int | None = None,
    write: int | None = None,
    reset: bool = False,
    site_file: Path | None = None,
) -> dict[str, Any]:
    """An operator's priority or demand for ``cluster`` (``hpvc io set``), then
    a rebalance; the site file is checked first, so a bad one changes nothing."""
    if priority is not None and not 1 <= priority <= 1000:
        raise InputError(f"--priority {priority}", "want 1 to 1000")
    for what, value in (("read", read), ("write", write)):
        if value is not None and value < 1:
            raise InputError(f"--demand-{what} {value}", "want a positive rate such as 20MB/s")
    load_devices(site_file)
    with _locked(store):
        overrides = load_overrides(store)
        old = Override() if reset else overrides.get(cluster, Override())
        new = replace(
            old,
            **{k: v for k, v in (("priority", priority), ("read", read), ("write", write)) if v},
        )
        if new == Override():
            overrides.pop(cluster, None)
        else:
            overrides[cluster] = new
        save_overrides(store, overrides)
    return rebalance(store, site_file)


# --- the storage side of a starting server ---------------------------------------------


@dataclass(frozen=True)
class ServerIO:
    procs: Path  # the cgroup.procs its launcher joins
    stable_writes: bool  # write every WRITE through: its disk I/O is charged to it


def managed(export_dir: Path, site_file: Path | None = None) -> bool:
    """Does the site file declare the disk under ``export_dir``? A bad or absent
    site file manages nothing (a cluster's ``up`` does not fail on it)."""
    try:
        _path, _site, devices = load_devices(site_file)
    except HpvcError as e:
        _log.warning("storage coordinator: %s", e.line())
        return False
    storage = io_coord.storage(export_dir)
    return storage is not None and any(d.numbers == storage.disk for d in devices)


def server_io(journal: Journal, cluster: str, export_dir: Path) -> ServerIO:
    """The cgroup a cluster's NFS server starts in, and whether it writes through
    for its life: only a plain folder on a managed disk (a loop file system is
    switched to synchronous writes live, when a limit needs it)."""
    storage = io_coord.storage(export_dir)
    stable = managed(export_dir) and storage is not None and storage.loop is None
    procs = io_coord.server_cgroup(journal, cluster, export_dir=export_dir, stable_writes=stable)
    return ServerIO(procs, stable)

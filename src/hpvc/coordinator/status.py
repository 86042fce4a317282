"""``hpvc io status``: per disk and cluster, priority, demand, allocation, measured use.

The allocation is computed afresh from the site file and the state (what a
rebalance would write); ``limit`` is what the kernel holds now, read back
from the server's cgroup; ``use`` is measured from the cgroup's own counters
over ``interval`` seconds (bytes/s), on the device every byte of the server
passes: its loop device when the export is a loop file system, else the disk.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hpvc.coordinator.coordinator import (
    APPLIED,
    Target,
    limited,
    load_devices,
    plan,
    write_mode,
)
from hpvc.coordinator.state import DIRECTIONS, load_overrides, members
from hpvc.host import io_coord
from hpvc.store import Store


def _counted(t: Target) -> str | None:
    """The device key whose counters hold all of the server's I/O."""
    if t.storage is None:
        return None
    return io_coord.key(t.storage.loop or t.storage.disk)


def _sample(targets: list[Target]) -> dict[str, dict[str, int]]:
    out = {}
    for t in targets:
        key = _counted(t)
        counters = io_coord.io_bytes(t.member.cgroup).get(key or "", {})
        out[t.cluster] = {d: counters.get(d, 0) for d in DIRECTIONS}
    return out


def _notes(t: Target, site: bool) -> list[str]:
    notes = []
    if t.device is None:
        where = io_coord.key(t.storage.disk) if t.storage is not None else "no block device"
        why = "no site file" if not site else f"its data's disk ({where}) is not in the site file"
        notes.append(f"not managed: {why}")
    elif not t.member.stable_writes and (t.storage is None or t.storage.loop is None):
        notes.append(
            "its NFS server was started before the site file named this disk: its buffered"
            " writes are not charged to it (restart the server node to enforce)"
        )
    return notes


def status(store: Store, site_file: Path | None = None, interval: float = 1.0) -> dict[str, Any]:
    """The coordinator's view of this host (see the module docstring)."""
    path, site, devices = load_devices(site_file)
    targets = plan(site, devices, members(store), load_overrides(store))
    before = _sample(targets)
    t0 = time.perf_counter()
    if interval > 0 and targets:
        time.sleep(interval)
    after = _sample(targets)
    seconds = time.perf_counter() - t0
    rows = []
    for t in targets:
        key = _counted(t)
        limits = io_coord.limits(t.member.cgroup).get(key or "", {})
        use = (
            {d: (after[t.cluster][d] - before[t.cluster][d]) / seconds for d in DIRECTIONS}
            if interval > 0 and targets
            else None
        )
        rows.append(
            {
                "cluster": t.cluster,
                "device": t.device.name if t.device is not None else None,
                "owner": t.member.owner,
                "priority": t.priority,
                "priority_from": t.priority_from,
                "demand": t.demand,
                "demand_from": t.demand_from,
                "allocation": t.allocation,
                "limit": {d: limits.get(d) for d in DIRECTIONS},
                "use": use,
                "bytes": after[t.cluster],
                "counted_on": key,
                "stable_writes": t.member.stable_writes,
                "limited": limited(t),
                "writes": write_mode(t),
                "notes": _notes(t, site is not None),
            }
        )
    return {
        "site": str(path) if site is not None else None,
        "devices": [
            {
                "name": d.name,
                "device": io_coord.key(d.numbers),
                "capacity": d.capacity,
                "clusters": [r["cluster"] for r in rows if r["device"] == d.name],
            }
            for d in devices
        ],
        "clusters": rows,
        "interval_s": seconds if interval > 0 else 0.0,
        "throttles_written": (store.root / "io" / APPLIED).exists(),
    }


def counters(store: Store) -> dict[str, dict[str, int]]:
    """Bytes each cluster's NFS server has read and written so far (its cgroup's
    counters, on the device every byte of it passes); for benchmarks and tests."""
    out = {}
    for m in members(store):
        storage = io_coord.storage(m.export)
        key = io_coord.key(storage.loop or storage.disk) if storage is not None else ""
        got = io_coord.io_bytes(m.cgroup).get(key, {})
        out[m.cluster] = {d: got.get(d, 0) for d in DIRECTIONS}
    return out


def held(store: Store) -> dict[str, dict[str, dict[str, int | None]]]:
    """The throttles the kernel holds for each cluster's NFS server, per device."""
    return {m.cluster: io_coord.limits(m.cgroup) for m in members(store)}

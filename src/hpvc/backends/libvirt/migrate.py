"""A libvirt node moved to a new place on its host by save and restore (issue 27).

libvirt's own migration (``virDomainMigrate``) refuses a destination whose
host UUID is the source's ("Attempt to migrate guest to the same host"), and
one libvirtd cannot hold two running domains of one name or UUID, which a
live move on one host needs while it copies. So a libvirt node moves the way
QEMU moves a TCG guest here anyway (``hpvc.backends.vm.migration``): stopped
for the whole copy. ``virDomainSave`` stops the guest and writes its state
into a file in the node's folder (its QEMU ends), and ``virDomainRestoreFlags``
starts a new QEMU from that file with the image's own XML given the new place
(``hpvc.render.libvirt.placed_domain_xml``: vCPU pins, emulator CPUs, guest
cells' host nodes). Name, UUID, MAC, address, devices and disk stay. If the
restore at the new place fails, the node is restored where it was (the same
file and XML) and the move fails (``MigrationFailed``); the file is removed
either way. The guest's pause is the save plus the restore.

Not moved: a node with the ivshmem region (its saved pages would be written
back over what its peers wrote meanwhile), and none across hosts.
Found by ``hpvc.cluster.migrate.mover`` by the backend's registry name.
docs/libvirt.md "Moving a node"; architecture: docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from hpvc.backends.base import ClusterEnv
from hpvc.backends.libvirt import domain as vm_libvirt
from hpvc.backends.qemu.region import region_of
from hpvc.backends.vm.migration import MigrationFailed, MigrationSettings, MigrationStats
from hpvc.host import procfs
from hpvc.plan import Plan, PlannedNode
from hpvc.progress import Progress
from hpvc.render.libvirt import domain_name, placed_domain_xml

SAVE_FILE = "move.save"


def refusal(backend: Any, env: ClusterEnv, plan: Plan, node: PlannedNode) -> str | None:
    """Why this node cannot move here (one line), or None."""
    pid = backend.live_pid(env, plan, node)
    if pid is None:
        return f"node {node.name} is not running"
    if region_of(procfs.cmdline(pid) or []) is not None:
        return (
            "it shares an ivshmem region with the guests beside it, and a libvirt node"
            " moves by save and restore, which would write its saved region back"
        )
    return None


def postcopy_refusal(
    backend: Any, env: ClusterEnv, plan: Plan, node: PlannedNode
) -> tuple[str, str] | None:
    return (
        "a libvirt node moves by save and restore, with the guest stopped: there is"
        " no postcopy phase",
        "move it without --postcopy (docs/libvirt.md, Moving a node)",
    )


def migrate_node(
    backend: Any,
    env: ClusterEnv,
    old: Plan,
    new: Plan,
    name: str,
    settings: MigrationSettings,
    progress: Progress,
) -> MigrationStats:
    """Save node ``name``'s domain and restore it at its place in ``new``."""
    dom_name = domain_name(old, old.node(name))
    path = env.node_dir(name) / SAVE_FILE
    conn = vm_libvirt.connect(backend.uri_for(env))
    try:
        dom = conn.lookupByName(dom_name)
        progress(f"node {name}: saving its domain (the guest stops)")
        t0 = time.monotonic()
        with vm_libvirt.errors(f"saving libvirt domain {dom_name}"):
            dom.save(str(path))
        try:
            with vm_libvirt.errors(f"libvirt save image {path}"):
                xml = conn.saveImageGetXMLDesc(str(path), 0)
            progress(f"node {name}: restoring it at its new place")
            try:
                with vm_libvirt.errors(f"restoring libvirt domain {dom_name}"):
                    conn.restoreFlags(str(path), placed_domain_xml(xml, new.node(name)), 0)
            except Exception as e:
                progress(f"node {name}: restoring it where it was")
                with vm_libvirt.errors(f"restoring libvirt domain {dom_name} where it was"):
                    conn.restoreFlags(str(path), xml, 0)
                raise MigrationFailed("failed", str(e)) from e
            total = time.monotonic() - t0
            size = _size(path)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
    finally:
        conn.close()
    ms = round(total * 1000)
    return MigrationStats(
        total_ms=ms,
        downtime_ms=ms,
        setup_ms=0,
        bytes_sent=size,
        passes=1,
        throttle_pct=0,
        mbps=size * 8 / 1e6 / total if total > 0 else 0.0,
        stop_and_copy=True,
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0

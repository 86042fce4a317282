"""libvirt nodes are not live-migrated on one host (issue 27): refused in one line.

libvirt's own migration (``virDomainMigrate``) refuses a destination whose
host UUID is the source's ("Attempt to migrate guest to the same host"), and
one libvirtd cannot hold two running domains of one name or UUID, which a
same-host move needs for as long as it copies. The routes around it, a second
libvirtd with its own host UUID, sockets and state folders, or a second domain
started paused with ``-incoming`` through ``<qemu:commandline>`` and driven
over QMP behind libvirt's back, were not built: the first is a second daemon
per host to keep, the second leaves libvirt's view of the domain wrong after the
switch. docs/libvirt.md "Live migration"; the qemu backend moves nodes.
Found by ``hpvc.cluster.migrate.mover`` by the backend's registry name.
"""

from __future__ import annotations

from typing import Any

WHY = (
    "libvirt refuses a live migration to the same host (one host UUID, one domain"
    " name); VM nodes of the qemu backend move"
)


def refusal(backend: Any, env: Any, plan: Any, node: Any) -> str | None:
    return WHY


def migrate_node(*_: Any) -> Any:
    raise AssertionError("refusal() refuses every libvirt node first")

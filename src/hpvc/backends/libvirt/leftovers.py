"""What libvirt keeps for VM clusters whose record is lost, for ``hpvc gc``.

Domains hpvc defined (named ``hpvc-<cluster>-<node>`` with the UUID its
renderer gives that node: ``hpvc.render.libvirt.owner_of``) for a cluster
without a record, asked of the libvirtd at the backend's URI; with none
reachable there is nothing to find, and nothing is said. A domain is removed
as its journal's undo removes it (``hpvc.backends.libvirt.domain.remove_domain``:
destroyed if it runs, undefined with its metadata, only the one with that
UUID). Its QEMU process, when libvirt runs one, is the QEMU backend's kind of
leftover (``hpvc.backends.qemu.leftovers``).
"""

from __future__ import annotations

import contextlib

from hpvc.backends.libvirt import domain
from hpvc.errors import MissingDependency
from hpvc.host.orphans import Keep, Orphan
from hpvc.render.libvirt import owner_of

DOMAIN = "libvirt-domain"


def find(keep: Keep, prefix: str, uri: str) -> list[Orphan]:
    """Domains at ``uri`` of clusters starting with ``prefix`` that ``keep`` lacks."""
    try:
        conn = domain.connect(uri)
    except MissingDependency:  # no libvirtd there (or no libvirt-python): no domain
        return []
    try:
        defined = domain.domains(conn)
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    out: list[Orphan] = []
    for name, uuid in defined:
        owner = owner_of(name, uuid)
        if owner is not None and owner[0].startswith(prefix) and owner[0] not in keep.clusters:
            out.append(Orphan(DOMAIN, name, uuid))
    return out


def remove(o: Orphan, uri: str) -> None:
    """Remove one of ``find``'s domains (HpvcError when libvirtd refuses or is gone)."""
    if o.kind != DOMAIN:
        raise ValueError(f"not an orphan of {__name__}: {o.kind} {o.name}")
    conn = domain.connect(uri)
    try:
        domain.remove_domain(conn, o.name, o.detail)
    finally:
        with contextlib.suppress(Exception):
            conn.close()

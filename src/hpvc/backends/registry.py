"""Which backend runs a cluster: one table, one line per backend (architecture rule 3).

A backend is named by ``module:Class`` and imported on first use, so a
command that never starts a node never pays for libvirt or QEMU code. To add
a backend: write ``hpvc/backends/<name>.py`` with a class implementing
``hpvc.backends.base.Backend``, and add its line here (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

from hpvc.backends.base import Backend
from hpvc.errors import HpvcError, SpecError

if TYPE_CHECKING:  # the schema (pydantic): not on status's path (issue 33 item 4)
    from hpvc.spec import Spec

# name -> "module:Class". The name is stored in each cluster's record.
BACKENDS: dict[str, str] = {
    "crun": "hpvc.backends.crun.backend:CrunBackend",
    "qemu": "hpvc.backends.qemu.backend:QemuBackend",
    "libvirt": "hpvc.backends.libvirt.backend:LibvirtBackend",
}
# What a spec without ``backend`` runs on, by its ``kind``.
DEFAULT_FOR_KIND: dict[str, str] = {"container": "crun", "vm": "qemu"}


def name_for(spec: Spec) -> str:
    """The backend a spec asks for (its ``backend`` key, else its kind's default)."""
    return spec.backend or DEFAULT_FOR_KIND[spec.kind]


@cache
def get(name: str) -> Backend:
    """The backend registered as ``name``."""
    where = BACKENDS.get(name)
    if where is None:
        known = ", ".join(sorted(BACKENDS))
        raise HpvcError(f"backend {name!r}", "not known to this hpvc", f"one of: {known}")
    module, _, cls = where.partition(":")
    backend: Backend = getattr(importlib.import_module(module), cls)()
    return backend


def every() -> list[Backend]:
    """Every registered backend, in the table's order."""
    return [get(name) for name in BACKENDS]


def import_all() -> None:
    """Import every registered backend's module (what ``hpvc serve`` loads ahead)."""
    for where in BACKENDS.values():
        importlib.import_module(where.partition(":")[0])


def for_spec(spec: Spec, origin: str = "<spec>") -> Backend:
    """The backend of a spec read from ``origin``; a name this hpvc does not know, or
    a backend of another kind, is a ``SpecError`` there (the spec itself cannot
    tell: the names are this table's)."""
    name = name_for(spec)
    if name not in BACKENDS:
        known = ", ".join(sorted(BACKENDS))
        raise SpecError(
            origin, "backend", f"got {name!r}, not a backend of this hpvc", f"one of: {known}"
        )
    backend = get(name)
    if backend.kind != spec.kind:
        ours = ", ".join(sorted(n for n in BACKENDS if get(n).kind == spec.kind))
        raise SpecError(
            origin,
            "backend",
            f"{name!r} runs kind = {backend.kind!r} nodes, the spec's kind is {spec.kind!r}",
            f"remove it, or give one of: {ours}",
        )
    return backend

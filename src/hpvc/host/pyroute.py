"""pyroute2 without running its package's ``__init__`` (issue 33 item 4).

pyroute2's ``__init__`` imports every family it has (IPDB, NDB, conntrack,
nftables, ethtool, devlink, wireguard, plan9, ...) to export them by name:
~0.05 s on the 2-CPU machines of docs/benchmarks.md, paid by every command
that touches the network (``up``, ``down``, ``status``, ``node up`` under
Slurm), while hpvc uses ``IPRoute``, ``NetlinkError`` and ``netns``.

``install`` (run by ``hpvc.host``) puts a finder first on ``sys.meta_path``
that answers for the name ``pyroute2`` alone: the package module is made
from pyroute2's own spec (its ``__path__``, ``__file__``), but its
``__init__`` is not run. Submodules load as usual (``from pyroute2 import
netns``); a name pyroute2 exports from its top comes from the submodule
that defines it (``HOMES``); any other name first runs the real
``__init__`` in that module, so code that wants the whole package gets it
unchanged. Nothing happens until something imports pyroute2.

Why hand-made: importlib's ``LazyLoader`` runs a package's ``__init__`` as
soon as a submodule is imported (the import reads ``__path__``), which is
every use here; pyroute2 offers no lighter entry point.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import types
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec

# importlib is imported when pyroute2 is, and no importlib.abc base classes:
# that loads importlib.resources and tempfile, more than this module saves,
# on the start of every command that imports hpvc.host and never netlink.
PACKAGE = "pyroute2"
# Names hpvc takes from pyroute2's top, and the submodule that defines each
# (pyroute2 0.9). A name missing there falls back to the whole __init__.
HOMES = {
    "IPRoute": "pyroute2.iproute",
    "NetNS": "pyroute2.iproute",
    "NetlinkError": "pyroute2.netlink.exceptions",
}


class _Loader:
    def __init__(self, real: ModuleSpec) -> None:
        self.real = real

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default: a module with this spec's file and __path__

    def exec_module(self, module: types.ModuleType) -> None:
        import importlib
        import importlib.util

        real = self.real

        def whole(name: str) -> Any:
            del module.__dict__["__getattr__"]
            assert real.loader is not None
            real.loader.exec_module(module)
            return getattr(module, name)

        def __getattr__(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
            home = HOMES.get(name)
            if home is not None:
                found = getattr(importlib.import_module(home), name, None)
                if found is not None:
                    return found
            elif importlib.util.find_spec(f"{PACKAGE}.{name}") is not None:
                return importlib.import_module(f"{PACKAGE}.{name}")
            return whole(name)

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


class _Finder:
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != PACKAGE:
            return None
        import importlib.util

        sys.meta_path.remove(self)  # once: the real spec, then this finder is gone
        real = importlib.util.find_spec(PACKAGE)
        if real is None or real.loader is None or real.submodule_search_locations is None:
            return real
        loader: Any = _Loader(real)  # a loader as importlib asks (create_/exec_module)
        spec = importlib.util.spec_from_file_location(
            PACKAGE,
            real.origin,
            loader=loader,
            submodule_search_locations=list(real.submodule_search_locations),
        )
        return spec


def install() -> None:
    """Put the finder in place, once, unless pyroute2 is imported already."""
    if PACKAGE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())

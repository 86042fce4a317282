"""Package exports loaded on first use (PEP 562).

A package whose ``__init__`` imported all of its modules made every reader of
one small module (``hpvc.plan.model``, plain dataclasses) pay for the rest
(the planner, the spec schema, pydantic). ``hpvc ls`` and the Slurm plugin's
commands start in a fraction of that (issue 16).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def exports(package: str, where: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name in ``where[module]``
    is imported from that module when first asked for."""
    home = {name: module for module, names in where.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__

"""The one progress-callback type: long work reports each step as one line."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """A Progress that says nothing (the default for library callers)."""

"""Every change hpvc makes to a host, written down before it is made.

DESIGN rule 3: each host change has its undo, registered before the next step.
A ``Journal`` is an append-only JSON-lines file (one per cluster and host). A
module that changes the host calls ``journal.record(kind, **args)`` *before*
the change, and registers how to undo that kind with ``@undoer(kind)``. Undo
functions must be idempotent and must not fail when the thing is already gone,
so a crash at any point, even between the record and the change, is undone by
``undo_all`` (what ``hpvc down`` runs), in reverse order.

Each line is fsync'ed: a record that was written survives a crash of the CLI.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc.paths import private_dir
from hpvc.progress import Progress, quiet

Args = dict[str, Any]
_UNDO: dict[str, Callable[[Args], None]] = {}


def undoer(kind: str) -> Callable[[Callable[[Args], None]], Callable[[Args], None]]:
    """Register the undo function for changes of ``kind``."""

    def wrap(fn: Callable[[Args], None]) -> Callable[[Args], None]:
        if kind in _UNDO and _UNDO[kind] is not fn:
            raise RuntimeError(f"two undo functions for {kind!r}")
        _UNDO[kind] = fn
        return fn

    return wrap


@dataclass(frozen=True)
class Change:
    kind: str
    args: Args
    module: str | None = None  # where the undo function of ``kind`` is registered


def _undo_for(change: Change) -> Callable[[Args], None] | None:
    fn = _UNDO.get(change.kind)
    if fn is None and change.module and change.module.startswith("hpvc."):
        with contextlib.suppress(ImportError):
            importlib.import_module(change.module)  # registers its undoers
        fn = _UNDO.get(change.kind)
    return fn


class Journal:
    """Append-only record of host changes, in the order they were made."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def record(self, kind: str, **args: Any) -> None:
        """Write down a change that is about to be made (call before making it).

        The line names the module whose ``@undoer`` undoes ``kind``, so a later
        ``undo_all`` in a process that never imported it (``hpvc down`` loads
        no backend) still finds it.
        """
        fn = _UNDO.get(kind)
        if fn is None:  # a change nobody could undo must never be made
            raise RuntimeError(f"journal: no @undoer registered for {kind!r}")
        private_dir(self.path.parent)  # journals live in hpvc's (root-only) state
        entry: dict[str, Any] = {"kind": kind, "args": args, "module": fn.__module__}
        line = json.dumps(entry, sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def entries(self) -> list[Change]:
        """Every recorded change; a torn last line (crash mid-write) is ignored."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            out.append(Change(d["kind"], d["args"], d.get("module")))
        return out

    def undo_all(self, log: Progress = quiet) -> list[str]:
        """Undo every change, newest first; return the errors (empty when clean).

        A change whose undo succeeded is dropped from the journal, so a second
        run after a partial failure retries only what is left.
        """
        entries = self.entries()
        errors: list[str] = []
        left: list[Change] = []
        for change in reversed(entries):
            fn = _undo_for(change)
            if fn is None:
                errors.append(f"no undo for {change.kind!r} (hpvc too old for this state?)")
                left.append(change)
                continue
            try:
                log(f"undo {change.kind} {change.args}")
                fn(change.args)
            except Exception as e:  # keep undoing the rest, report all
                errors.append(f"{change.kind} {change.args}: {e}")
                left.append(change)
        self._rewrite(list(reversed(left)))
        return errors

    def _rewrite(self, changes: list[Change]) -> None:
        if not changes:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            "".join(
                json.dumps(
                    {"kind": c.kind, "args": c.args, **({"module": c.module} if c.module else {})},
                    sort_keys=True,
                )
                + "\n"
                for c in changes
            )
        )
        os.replace(tmp, self.path)

"""Every change hpvc makes to a host, written down before it is made.

architecture rule 5: each host change has its undo, registered before the next step.
A ``Journal`` is an append-only JSON-lines file (one per cluster and host). A
module that changes the host calls ``journal.record(kind, **args)`` *before*
the change, and registers how to undo that kind with ``@undoer(kind)``. Undo
functions must be idempotent and must not fail when the thing is already gone,
so a crash at any point, even between the record and the change, is undone by
``undo_all`` (what ``hpvc down`` runs), in reverse order.

Each line is fsync'ed: a record that was written survives a crash of the CLI.

Undoing stops at the first step that fails. A change may depend on any
change made before it (a libvirt domain runs from a disk in the node's
folder, recorded earlier; a veth hangs on the cluster's bridge), so once one
undo fails nothing older is touched: the failed step and everything before
it stay in the journal for the next ``undo_all``. What stays is always the
file's first lines, so dropping an undone step is a truncation of the file
in place: undoing never writes a byte, needs no free space (a full state
disk still tears down), and never recreates a journal whose folder an undo
step removed (a node's folder holds its own journal).
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

from hpvc.errors import HpvcError
from hpvc.paths import private_dir
from hpvc.progress import Progress, quiet

Args = dict[str, Any]
Describe = Callable[[Args], str]
_UNDO: dict[str, Callable[[Args], None]] = {}
_WHAT: dict[str, Describe] = {}
_NAMING = ("name", "id", "ifname", "path")  # args that name what a change made


def undoer(
    kind: str, what: Describe | None = None
) -> Callable[[Callable[[Args], None]], Callable[[Args], None]]:
    """Register the undo function for changes of ``kind``; ``what`` names one
    such change for a user (``libvirt domain X``) when its undo fails."""

    def wrap(fn: Callable[[Args], None]) -> Callable[[Args], None]:
        if kind in _UNDO and _UNDO[kind] is not fn:
            raise RuntimeError(f"two undo functions for {kind!r}")
        _UNDO[kind] = fn
        if what is not None:
            _WHAT[kind] = what
        return fn

    return wrap


@dataclass(frozen=True)
class Change:
    kind: str
    args: Args
    module: str | None = None  # where the undo function of ``kind`` is registered

    def what(self) -> str:
        """The change as a user reads it: its ``undoer``'s ``what``, else its kind
        and the first of its args that names it (``container hpvc-c-n0``)."""
        describe = _WHAT.get(self.kind)
        if describe is not None:
            with contextlib.suppress(Exception):
                return describe(self.args)
        key = next((k for k in _NAMING if isinstance(self.args.get(k), str)), None)
        if key:
            return f"{self.kind} {self.args[key]}"
        named = " ".join(f"{k} {v}" for k, v in self.args.items() if isinstance(v, str | int))
        return f"{self.kind} {named}".rstrip()


# Modules that registered undoers under another name in an older hpvc: a
# journal written then names the old module, and must still be undone.
MOVED = {
    "hpvc.backends.container": "hpvc.backends.crun.container",
    "hpvc.backends.crun": "hpvc.backends.crun.backend",
    "hpvc.backends.guest": "hpvc.backends.vm.guest",
    "hpvc.backends.guest_shared": "hpvc.backends.vm.guest_shared",
    "hpvc.backends.libvirt": "hpvc.backends.libvirt.backend",
    "hpvc.backends.qemu": "hpvc.backends.qemu.backend",
    "hpvc.backends.vm_libvirt": "hpvc.backends.libvirt.domain",
    "hpvc.backends.vm_qemu": "hpvc.backends.qemu.process",
}


def _undo_for(change: Change) -> Callable[[Args], None] | None:
    fn = _UNDO.get(change.kind)
    if fn is None and change.module and change.module.startswith("hpvc."):
        with contextlib.suppress(ImportError):
            # registers its undoers
            importlib.import_module(MOVED.get(change.module, change.module))
        fn = _UNDO.get(change.kind)
    return fn


def _why(e: BaseException, what: str) -> str:
    """Why the undo of ``what`` failed; an ``HpvcError`` naming ``what`` again
    keeps only what it adds (``destroy: ...``), its fix after a semicolon."""
    if not isinstance(e, HpvcError):
        return str(e) or type(e).__name__
    text = f"{e.why}; {e.fix}" if e.fix else e.why
    where = e.what
    if where == what or where.startswith(f"{what}: "):
        where = where[len(what) + 2 :]
    return f"{where}: {text}" if where else text


def _parse(line: bytes) -> Change | None:
    """One journal line; None for a torn or unreadable one (a crash mid-write)."""
    try:
        d = json.loads(line)
        return Change(d["kind"], d["args"], d.get("module"))
    except (ValueError, KeyError, TypeError):
        return None


def _lines(data: bytes) -> list[tuple[int, Change | None]]:
    """(offset of the line, its change) for every line; a last line without its
    newline was torn by a crash and counts as unreadable."""
    out: list[tuple[int, Change | None]] = []
    offset = 0
    while offset < len(data):
        end = data.find(b"\n", offset)
        if end < 0:
            out.append((offset, None))
            break
        out.append((offset, _parse(data[offset:end])))
        offset = end + 1
    return out


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


class Journal:
    """Append-only record of host changes, in the order they were made."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def record(self, kind: str, **args: Any) -> None:
        """Write down a change that is about to be made (call before making it).

        The line names the module whose ``@undoer`` undoes ``kind``, so a later
        ``undo_all`` in a process that never imported it (``hpvc down`` loads
        no backend) still finds it. A line torn by an earlier crash is ended
        first, so it cannot swallow this one.
        """
        fn = _UNDO.get(kind)
        if fn is None:  # a change nobody could undo must never be made
            raise RuntimeError(f"journal: no @undoer registered for {kind!r}")
        private_dir(self.path.parent)  # journals live in hpvc's (root-only) state
        entry: dict[str, Any] = {"kind": kind, "args": args, "module": fn.__module__}
        line = json.dumps(entry, sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = "\n" + line
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def entries(self) -> list[Change]:
        """Every recorded change; a torn last line (crash mid-write) is ignored."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        return [c for _, c in _lines(data) if c is not None]

    def replace_with(self, changes: list[Change]) -> None:
        """Make the journal hold exactly ``changes`` (atomically: a new file renamed
        over the old one), as when a migrated node's changes are now another
        process's. Each keeps the module its undo is registered in."""
        private_dir(self.path.parent)
        tmp = self.path.with_name(self.path.name + ".new")
        lines = [
            json.dumps({"kind": c.kind, "args": c.args, "module": c.module}, sort_keys=True)
            for c in changes
        ]
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, "".join(f"{line}\n" for line in lines).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def undo_all(self, log: Progress = quiet) -> list[str]:
        """Undo the changes newest first, up to the first that fails; return
        what failed as ``["<what> (<why>)"]``, empty when all are undone.

        Each undone change is dropped at once (the file is cut before its
        line), so a crash or a later run retries exactly what is left; the
        failed change and all older ones stay (see the module's docstring).
        A journal with nothing left is removed. When an undo step removed the
        journal itself (its folder), the older steps are still undone, but
        one that fails then cannot be kept, and says so.
        """
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        try:
            for offset, change in reversed(_lines(_read_all(fd))):
                error = None if change is None else _undo_one(change, log)
                gone = os.fstat(fd).st_nlink == 0  # removed with its folder by that step
                if error is not None:
                    return [f"{error}; the journal went with its folder" if gone else error]
                if not gone:
                    os.ftruncate(fd, offset)  # frees blocks, never needs one
                    os.fsync(fd)
            if os.fstat(fd).st_nlink:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            return []
        finally:
            os.close(fd)


def undo_one(change: Change, log: Progress = quiet) -> str | None:
    """Undo one recorded change out of order; None when done, else what failed.
    A live migration gives back the old process's part of a node's journal
    (its tap, console reader, QEMU) and keeps the rest (hpvc.backends.qemu.migrate)."""
    return _undo_one(change, log)


def _undo_one(change: Change, log: Progress) -> str | None:
    """Undo one change; None when done, else ``"<what> (<why>)"``."""
    fn = _undo_for(change)
    if fn is None:
        return f"{change.what()} (no undo for {change.kind!r}: hpvc too old for this state?)"
    try:
        log(f"undo {change.what()}")
        fn(change.args)
    except Exception as e:  # reported, kept for the next run
        what = change.what()
        return f"{what} ({_why(e, what)})"
    return None

"""A checkpoint on disk: its folder's layout and ``manifest.json`` (docs/checkpoint.md).

A checkpoint is a folder a user can copy, list, inspect and remove::

    DIR/manifest.json          what is below, with sizes and sha256 of every file
    DIR/nodes/<node>/...       each node's state, written by its backend's ``save``
    DIR/shared/...             the cluster's shared directory, where it lives on the host

This module only reads, checks and writes that folder (no cluster, no backend,
no host state): ``write_manifest`` last (so a folder without one is a
checkpoint that never finished), ``read_manifest`` with its one-line refusals
(not a checkpoint, truncated or unreadable manifest, another schema, hpvc
version or architecture), ``verify`` for every file (missing, truncated,
corrupted: sha256). All of them are ``InputError`` (exit 2): a checkpoint is
the user's input to ``hpvc restore``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpvc import __version__
from hpvc.errors import InputError

SCHEMA = 1
MANIFEST = "manifest.json"
NODES = "nodes"
SHARED = "shared"
_CHUNK = 1 << 20


def machine() -> str:
    """This host's architecture as a checkpoint records it (``uname -m``)."""
    return platform.machine() or "unknown"


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint, relative to the checkpoint's folder."""

    path: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class NodeEntry:
    """One node: what restore starts it from."""

    name: str
    kind: str  # container | vm
    backend: str  # the registry name that saved it (and restores it)
    image_digest: str  # the image store's digest the node was made from ("" unknown)
    ip: str
    mac: str
    files: tuple[FileEntry, ...]
    extra: dict[str, Any] = field(default_factory=dict)  # the backend's own fields

    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "backend": self.backend,
            "image_digest": self.image_digest,
            "ip": self.ip,
            "mac": self.mac,
            "files": [f.to_json() for f in self.files],
            "extra": self.extra,
        }


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` holds."""

    cluster: str
    created: float  # seconds since the epoch, when every node was frozen
    spec: dict[str, Any]  # the spec as the record keeps it (TOML document)
    spec_text: str  # the spec file's text when it was still readable ("" otherwise)
    plan: dict[str, Any]  # the plan the nodes ran with (Plan.to_json)
    subnet: str
    nodes: tuple[NodeEntry, ...]
    shared: tuple[FileEntry, ...] = ()
    frozen_s: float = 0.0  # how long the nodes stood still for the cut
    stopped: bool = False  # --stop: the cluster was taken down after the cut
    schema: int = SCHEMA
    hpvc_version: str = __version__
    arch: str = field(default_factory=machine)

    def size(self) -> int:
        return sum(n.size() for n in self.nodes) + sum(f.size for f in self.shared)

    def node(self, name: str) -> NodeEntry:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "hpvc_version": self.hpvc_version,
            "arch": self.arch,
            "created": self.created,
            "cluster": self.cluster,
            "subnet": self.subnet,
            "frozen_s": self.frozen_s,
            "stopped": self.stopped,
            "nodes": [n.to_json() for n in self.nodes],
            "shared": [f.to_json() for f in self.shared],
            "spec": self.spec,
            "spec_text": self.spec_text,
            "plan": self.plan,
        }


# --- files ----------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def sha256_all(paths: Sequence[Path]) -> list[str]:
    """``sha256_of`` each of ``paths`` (in their order), side by side on every
    CPU this process may use: hashlib lets go of the GIL while it hashes a large
    buffer, so threads scale, and a checkpoint is mostly a few large files (the
    nodes' memory). One thread hashed 1.6 GB/s here, the disk reads faster:
    one at a time, the hashes were the longest part of a 4 x 4 GiB restore
    (docs/benchmarks.md, Checkpoint and restore)."""
    workers = min(len(paths), len(os.sched_getaffinity(0)))
    if workers <= 1:
        return [sha256_of(p) for p in paths]
    # The largest first, so the last to finish is a small one.
    order = sorted(range(len(paths)), key=lambda i: -paths[i].stat().st_size)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hpvc-sha256") as pool:
        futures = {i: pool.submit(sha256_of, paths[i]) for i in order}
        return [futures[i].result() for i in range(len(paths))]


def describe(root: Path, paths: Iterable[str]) -> tuple[FileEntry, ...]:
    """Size and sha256 of each of ``paths`` (relative to ``root``)."""
    rels = list(paths)
    full = [root / _relative(rel) for rel in rels]
    sums = sha256_all(full)
    return tuple(
        FileEntry(r, p.stat().st_size, h) for r, p, h in zip(rels, full, sums, strict=True)
    )


def files_under(root: Path, sub: str) -> list[str]:
    """Every regular file under ``root/sub``, relative to ``root``, sorted."""
    base = root / sub
    found = []
    for dirpath, _dirs, names in os.walk(base):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink():
                found.append(str(p.relative_to(root)))
    return sorted(found)


def _relative(rel: str) -> str:
    """A manifest's path, refused when it would leave the checkpoint's folder."""
    parts = Path(rel).parts
    if not rel or Path(rel).is_absolute() or ".." in parts:
        raise InputError("checkpoint manifest", f"file path {rel!r} leaves the checkpoint")
    return rel


# --- manifest -------------------------------------------------------------------------


def write_manifest(root: Path, m: Manifest) -> Path:
    """Write ``manifest.json`` atomically (the checkpoint is complete once it exists)."""
    path = root / MANIFEST
    tmp = root / f".{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump(m.to_json(), f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _bad(root: Path, why: str, fix: str = "take a new checkpoint") -> InputError:
    return InputError(f"checkpoint {root}", why, fix)


def read_manifest(root: Path, *, check_version: bool = True) -> Manifest:
    """The manifest of the checkpoint in ``root``; a one-line InputError when it is
    not one, is truncated or malformed, or comes from another schema, hpvc
    version or architecture (``check_version`` False: ``ls``/``show`` still read
    another version's checkpoint, restore does not)."""
    path = root / MANIFEST
    if not root.is_dir():
        raise _bad(root, "no such folder", "give a checkpoint's folder (hpvc checkpoint ls)")
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise _bad(root, f"has no {MANIFEST}: not a checkpoint, or one that never finished",
                   "give a checkpoint's folder (hpvc checkpoint ls)") from None  # fmt: skip
    except OSError as e:
        raise _bad(root, f"{MANIFEST}: {e.strerror or e}", "check its permissions") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _bad(root, f"{MANIFEST} is truncated or corrupted ({e.msg} at byte {e.pos})") from e
    except UnicodeDecodeError as e:
        raise _bad(root, f"{MANIFEST} is corrupted (not UTF-8 at byte {e.start})") from e
    m = from_json(root, data)
    if check_version:
        check_compatible(root, m)
    return m


def check_compatible(root: Path, m: Manifest) -> None:
    """Refuse a checkpoint this hpvc on this architecture cannot restore."""
    if m.arch != machine():
        raise _bad(root, f"was taken on {m.arch}, this host is {machine()}",
                   f"restore it on a {m.arch} host")  # fmt: skip
    if m.hpvc_version != __version__:
        raise _bad(root, f"was taken by hpvc {m.hpvc_version}, this is hpvc {__version__}",
                   f"restore it with hpvc {m.hpvc_version}")  # fmt: skip


def _get(root: Path, d: Any, key: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    if not isinstance(d, dict) or key not in d or not isinstance(d[key], kind):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise _bad(root, f"{MANIFEST}: {where}{key} is missing or not a {want}")
    return d[key]


def _files(root: Path, items: Any, where: str) -> tuple[FileEntry, ...]:
    if not isinstance(items, list):
        raise _bad(root, f"{MANIFEST}: {where}files is not a list")
    out = []
    for i, f in enumerate(items):
        at = f"{where}files[{i}]."
        rel = _relative(_get(root, f, "path", str, at))
        out.append(FileEntry(rel, _get(root, f, "size", int, at), _get(root, f, "sha256", str, at)))
    return tuple(out)


def from_json(root: Path, d: Any) -> Manifest:
    """The manifest from its JSON; a missing or mistyped key is a one-line error."""
    schema = _get(root, d, "schema", int)
    if schema != SCHEMA:
        raise _bad(root, f"has manifest schema {schema}, this hpvc reads schema {SCHEMA}",
                   "restore it with the hpvc that took it")  # fmt: skip
    nodes = []
    for i, n in enumerate(_get(root, d, "nodes", list)):
        at = f"nodes[{i}]."
        nodes.append(
            NodeEntry(
                name=_get(root, n, "name", str, at),
                kind=_get(root, n, "kind", str, at),
                backend=_get(root, n, "backend", str, at),
                image_digest=_get(root, n, "image_digest", str, at),
                ip=_get(root, n, "ip", str, at),
                mac=_get(root, n, "mac", str, at),
                files=_files(root, _get(root, n, "files", list, at), at),
                extra=_get(root, n, "extra", dict, at),
            )
        )
    if not nodes:
        raise _bad(root, f"{MANIFEST}: lists no node")
    return Manifest(
        cluster=_get(root, d, "cluster", str),
        created=float(_get(root, d, "created", (int, float))),
        spec=_get(root, d, "spec", dict),
        spec_text=_get(root, d, "spec_text", str),
        plan=_get(root, d, "plan", dict),
        subnet=_get(root, d, "subnet", str),
        nodes=tuple(nodes),
        shared=_files(root, d.get("shared", []), "shared."),
        frozen_s=float(_get(root, d, "frozen_s", (int, float))),
        stopped=bool(d.get("stopped", False)),
        schema=schema,
        hpvc_version=_get(root, d, "hpvc_version", str),
        arch=_get(root, d, "arch", str),
    )


def verify(root: Path, m: Manifest, *, hashes: bool = True) -> None:
    """Every file the manifest lists is there with its size and (``hashes``) its
    sha256; the first that is not is a one-line InputError."""
    files = [*(f for n in m.nodes for f in n.files), *m.shared]
    for f in files:
        p = root / f.path
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise _bad(root, f"{f.path} is missing") from None
        if size != f.size:
            raise _bad(root, f"{f.path} is truncated or changed: {size} bytes, "
                             f"the manifest says {f.size}")  # fmt: skip
    if not hashes:
        return
    for f, got in zip(files, sha256_all([root / f.path for f in files]), strict=True):
        if got != f.sha256:
            raise _bad(root, f"{f.path} is corrupted: its sha256 differs from the manifest's")

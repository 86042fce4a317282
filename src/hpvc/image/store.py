"""The image store on disk: content-addressed rootfs directories and names.

Layout under the store root (default ``$HPVC_IMAGE_DIR``, else
``$HPVC_STATE_DIR/images``, else ``/var/lib/hpvc/images``)::

    by-digest/<digest>/rootfs/        the root filesystem (read-only lower dir)
    by-digest/<digest>/image.json     names, digest, suite, packages, created, ...
    by-digest/<digest>/build.log      debootstrap's output
    by-digest/<digest>.lock           held while <digest> is built (fcntl)
    by-digest/<digest>.tmp-<pid>/     a build in progress; renamed into place when done
    by-digest/<digest>/oci/           an imported image's OCI layout (index.json; its
                                      blobs/ is a link to the shared blobs/ below)
    by-digest/import.tmp-<pid>/       an import in progress (hpvc.image.importer)
    blobs/sha256/<hex>                imported images' manifests, configs and layers,
                                      each stored once however many images share it
    import.lock                       held for a whole import; blobs change under it
    names/<name>                      one line: the digest the name points to
    logs/<digest12>-<time>.log        what a failed build printed, kept for the user
    store.lock                        held while names or digest dirs change

``names/`` is the truth about names; the ``names`` list in ``image.json`` is
rewritten from it whenever it changes. A digest directory lives while a name
points to it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpvc.errors import HpvcError, InputError
from hpvc.host import procfs
from hpvc.host.probe import mounts_under
from hpvc.image.model import Image, check_name
from hpvc.locks import file_lock
from hpvc.paths import image_dir
from hpvc.sysroot import HOST, RootLike

# in_use(digest): the clusters using an image's digest (hpvc.cluster.images), or
# a bool; falsy when none does.
InUse = Callable[[str], "Collection[str] | bool"]


def default_store() -> Path:
    """``$HPVC_IMAGE_DIR``, else ``$HPVC_STATE_DIR/images``, else ``/var/lib/hpvc/images``."""
    return image_dir()


_flock = file_lock  # the store's locks: state, names, digests


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling, fsync it, rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


class Store:
    """Paths and the small, locked metadata operations of one image store."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_store()
        self.names_dir = self.root / "names"
        self.digests_dir = self.root / "by-digest"
        self.logs_dir = self.root / "logs"
        self.blobs_dir = self.root / "blobs"

    def ensure(self) -> None:
        """Create the store's directories (the store may not exist yet)."""
        try:
            for d in (self.names_dir, self.digests_dir, self.logs_dir):
                d.mkdir(parents=True, exist_ok=True)
        except PermissionError as e:
            raise InputError(
                f"image store {self.root}", f"cannot create it: {e.strerror}", "run as root"
            ) from None

    def digest_dir(self, digest: str) -> Path:
        return self.digests_dir / digest

    def tmp_dir(self, digest: str) -> Path:
        return self.digests_dir / f"{digest}.tmp-{os.getpid()}"

    def lock(self) -> Any:
        """The store-wide lock, held while names or digest directories change (short)."""
        return _flock(self.root / "store.lock")

    def digest_lock(self, digest: str) -> Any:
        """Held for the whole build of ``digest``: a second builder waits, then reuses."""
        return _flock(self.digests_dir / f"{digest}.lock")

    def import_lock(self) -> Any:
        """Held for a whole import (imports run one at a time: they share blobs/)."""
        return _flock(self.root / "import.lock")

    @contextmanager
    def import_lock_if_free(self) -> Iterator[bool]:
        """The import lock if nobody holds it (yields True), else yields False at once."""
        fd = os.open(self.root / "import.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def blob(self, digest: str) -> Path:
        """The shared blob of ``sha256:<hex>`` (or of a bare hex digest)."""
        return self.blobs_dir / "sha256" / digest.removeprefix("sha256:")

    def blob_users(self) -> dict[str, list[str]]:
        """Blob hex digest -> names of the imported images using it (manifest,
        config, layers); an image without a name counts under its digest."""
        users: dict[str, list[str]] = {}
        if not self.digests_dir.is_dir():
            return users
        for entry in sorted(self.digests_dir.iterdir()):
            if "." in entry.name or not self.is_complete(entry.name):
                continue
            try:
                doc = self.metadata(entry.name)
            except (OSError, ValueError):
                continue
            if not doc.get("source"):
                continue
            owner = ", ".join(doc.get("names") or ()) or entry.name[:12]
            refs = [doc.get("manifest", ""), f"sha256:{entry.name}"]
            refs += [str(x["digest"]) for x in doc.get("layers", ())]
            for ref in refs:
                if ref:
                    users.setdefault(ref.removeprefix("sha256:"), []).append(owner)
        return {blob: sorted(owners) for blob, owners in users.items()}

    def prune_blobs(self) -> int:
        """Delete blobs no imported image uses and leftovers of interrupted
        copies; the bytes freed. Caller holds import_lock() (no import under way)."""
        directory = self.blobs_dir / "sha256"
        if not directory.is_dir():
            return 0
        used = self.blob_users()
        freed = 0
        for blob in directory.iterdir():
            if blob.name not in used:
                freed += blob.lstat().st_size
                remove_tree(blob)
        return freed

    def sweep_imports(self) -> list[Path]:
        """Remove what interrupted imports left (caller holds import_lock(): all stale)."""
        swept = sorted(self.digests_dir.glob("import.tmp-*")) if self.digests_dir.is_dir() else []
        for leftover in swept:
            remove_tree(leftover, unmount=True)
        return swept

    def interrupted_imports(self, *, remove: bool) -> list[Path]:
        """The folders of imports that no longer run (``hpvc gc``), removed unless
        not ``remove``. With the import lock free no import runs, so all are;
        while an import holds it, a folder is kept when its PID runs and is (as
        far as ``/proc/locks`` says) the lock's holder: a running import is never
        touched. Unused blobs are pruned too when no import runs."""
        if not self.digests_dir.is_dir() or not (self.root / "import.lock").exists():
            return []
        with self.import_lock_if_free() as free:
            folders = sorted(self.digests_dir.glob("import.tmp-*"))
            if not free:
                holders = procfs.flock_holders(self.root / "import.lock")
                folders = [p for p in folders if not _runs_import(p, holders)]
            if remove:
                for leftover in folders:
                    remove_tree(leftover, unmount=True)
                if free and folders:
                    self.prune_blobs()
        return folders

    def is_complete(self, digest: str) -> bool:
        return (self.digest_dir(digest) / "image.json").is_file()

    def read_name(self, name: str) -> str | None:
        """The digest ``name`` points to, or None."""
        try:
            return (self.names_dir / check_name(name)).read_text().strip() or None
        except FileNotFoundError:
            return None

    def all_names(self) -> dict[str, str]:
        """Every name -> digest, sorted by name (dot-files are temporaries, skipped)."""
        out: dict[str, str] = {}
        if not self.names_dir.is_dir():
            return out
        for entry in sorted(self.names_dir.iterdir()):
            if entry.name.startswith("."):
                continue
            digest = entry.read_text().strip()
            if digest:
                out[entry.name] = digest
        return out

    def names_of(self, digest: str) -> tuple[str, ...]:
        return tuple(n for n, d in self.all_names().items() if d == digest)

    def metadata(self, digest: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.digest_dir(digest) / "image.json").read_text())
        return doc

    def write_metadata(self, directory: Path, doc: dict[str, Any]) -> None:
        write_atomic(directory / "image.json", json.dumps(doc, indent=2) + "\n")

    def sync_names(self, digest: str) -> None:
        """Rewrite the ``names`` list of ``image.json`` from ``names/`` (caller holds lock())."""
        if self.is_complete(digest):
            doc = self.metadata(digest)
            doc["names"] = list(self.names_of(digest))
            self.write_metadata(self.digest_dir(digest), doc)

    def point(self, name: str, digest: str, in_use: InUse) -> None:
        """Point ``name`` at ``digest`` (caller holds lock()); drop the old digest if orphaned."""
        old = self.read_name(name)
        write_atomic(self.names_dir / check_name(name), digest + "\n")
        self.sync_names(digest)
        if old and old != digest:
            self.drop_if_orphan(old, in_use)

    def drop_if_orphan(self, digest: str, in_use: InUse) -> bool:
        """Delete ``digest``'s directory when no name points to it and nothing uses it."""
        if self.names_of(digest) or in_use(digest) or not self.digest_dir(digest).exists():
            return False
        doomed = self.digests_dir / f"{digest}.rm-{os.getpid()}"
        os.rename(self.digest_dir(digest), doomed)
        remove_tree(doomed)
        return True

    def load(self, name: str, digest: str) -> Image:
        return Image.from_metadata(name, self.digest_dir(digest), self.metadata(digest))


def _runs_import(folder: Path, holders: set[int]) -> bool:
    """Is ``import.tmp-<pid>`` the folder of a running import (its PID alive and,
    when the import lock's holders are known, one of them)?"""
    pid = folder.name.rsplit("-", 1)[-1]
    if not pid.isdigit() or not procfs.running(int(pid)):
        return False
    return not holders or int(pid) in holders


def remove_tree(path: Path, *, unmount: bool = False, root: RootLike = HOST) -> None:
    """Delete ``path`` without ever descending into a mount (a leftover /proc, a bind).

    With ``unmount`` (a build's own temporary directory, where an interrupted
    debootstrap may have left /proc or /sys mounted) the mounts are detached
    first; otherwise a mount under ``path`` is an error and nothing is deleted.
    """
    if not os.path.lexists(path):
        return
    mounts = mounts_under(path, root)
    if mounts and unmount:
        for point in mounts:
            subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)
        mounts = mounts_under(path, root)
    if mounts:
        raise HpvcError(
            f"remove {path}",
            f"{mounts[0]} is still mounted there",
            f"umount it, then remove {path} by hand",
        )
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)

"""``build_image``: a Debian rootfs from debootstrap, stored by the digest of its recipe.

A build runs in ``by-digest/<digest>.tmp-<pid>/`` under the digest's lock and is
renamed into place only when complete; on any failure, Ctrl-C or SIGTERM the
temporary directory is removed (after detaching any mount debootstrap left
there), so a failed build leaves neither a half image nor a name. A second
build of the same recipe waits for the lock, then reuses the finished image.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from hpvc.errors import InputError, MissingDependency
from hpvc.image import debootstrap, rootfs, suites
from hpvc.image.catalog import StoreArg, as_store
from hpvc.image.extras import lookup, with_extras
from hpvc.image.model import DEFAULT_SUITE, Image, ImageSpec, check_name
from hpvc.image.store import InUse, Store, remove_tree
from hpvc.progress import Progress, quiet

DEFAULT_CACHE_DIR = Path("/var/cache/hpvc/debootstrap")


@dataclass(frozen=True)
class _Job:
    """One build: what to build, where, with which tool, reporting to whom."""

    name: str
    spec: ImageSpec
    store: Store
    exe: str
    cache_dir: Path | None
    progress: Progress
    in_use: InUse

    @property
    def digest(self) -> str:
        return self.spec.digest


def find_debootstrap(path: str | Path | None = None, *, require_root: bool = True) -> str:
    """The debootstrap executable to run; MissingDependency / InputError with the fix."""
    candidate = str(path) if path is not None else "debootstrap"
    search = (
        None if path is not None else os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"])
    )
    exe = shutil.which(candidate, path=search)
    if exe is None:
        raise MissingDependency(
            "image build", f"{candidate} not found", "apt-get install debootstrap"
        )
    if require_root and os.geteuid() != 0:
        raise InputError("image build", "debootstrap needs root", "run as root, e.g. with sudo")
    return exe


def _in_use_error(name: str) -> InputError:
    return InputError(
        f"image {name!r}", "in use by a running cluster", "stop the clusters using it first"
    )


def _reuse(store: Store, name: str, digest: str, in_use: InUse) -> Image | None:
    """Point ``name`` at an already built ``digest`` and return it; None if not built."""
    if not store.is_complete(digest):
        return None
    try:
        with store.lock():
            if not store.is_complete(digest):
                return None
            store.point(name, digest, in_use)
            image = store.load(name, digest)
    except PermissionError as e:
        raise InputError(
            f"image store {store.root}", f"cannot write: {e.strerror}", "run as root"
        ) from None
    return replace(image, reused=True)


@contextmanager
def _download_cache(cache_dir: str | Path | None, progress: Progress) -> Iterator[Path | None]:
    """The .deb cache for this build, locked; None (build without it) if unusable or busy.

    Builds never depend on the cache: a directory that cannot be created, or one
    another build is filling right now, just means downloading again.
    """
    if cache_dir is None:
        yield None
        return
    path = Path(cache_dir).absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        progress(f"warning: no download cache ({path}: {e.strerror})")
        yield None
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        progress(f"warning: download cache {path} busy with another build; not using it")
        os.close(fd)
        yield None
        return
    try:
        yield path
    finally:
        os.close(fd)


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """During a build, SIGTERM raises KeyboardInterrupt so the cleanup runs (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _populate(job: _Job, tmp: Path) -> None:
    """Run debootstrap into ``tmp/rootfs``, finish the rootfs, write ``tmp/image.json``."""
    target = tmp / "rootfs"
    spec = job.spec
    started = time.monotonic()
    with _download_cache(job.cache_dir, job.progress) as cache:
        cmd = debootstrap.argv(job.exe, spec, target, cache)
        job.progress(f"debootstrap {spec.suite} from {spec.mirror}")
        rc, tail = debootstrap.run(cmd, tmp / "build.log", job.progress)
    if rc != 0:
        if missing := suites.missing_debs(tail):
            raise suites.missing_packages(job.name, spec, missing)
        raise debootstrap.failure(job.name, rc, tail, target, job.store.logs_dir, job.digest)
    for extra in lookup(spec.extras):
        job.progress(f"extra {extra.name}: installing")
        extra.install(target, job.progress)
    job.progress("cleaning apt caches, stamping the image")
    rootfs.finish(target, job.digest)
    image = Image(
        name=job.name,
        digest=job.digest,
        path=job.store.digest_dir(job.digest),
        suite=spec.suite,
        packages=spec.packages,
        mirror=spec.mirror,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        size_bytes=rootfs.tree_size(target),
        build_seconds=time.monotonic() - started,
        debootstrap_version=debootstrap.version(job.exe),
        extras=spec.extras,
    )
    job.store.write_metadata(tmp, image.metadata())


def _install(job: _Job, tmp: Path) -> None:
    """Move the finished ``tmp`` into place (replacing an old build) and point the name."""
    store, digest = job.store, job.digest
    final = store.digest_dir(digest)
    with store.lock():
        if final.exists():
            if job.in_use(digest):
                raise _in_use_error(job.name)
            old = store.digests_dir / f"{digest}.old-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            remove_tree(old)
        else:
            os.rename(tmp, final)
        store.point(job.name, digest, job.in_use)


def _sweep(store: Store, digest: str) -> None:
    """Remove leftovers of interrupted builds of ``digest`` (we hold its lock: all stale)."""
    for leftover in store.digests_dir.glob(f"{digest}.tmp-*"):
        remove_tree(leftover, unmount=True)


def _build_locked(job: _Job, force: bool) -> Image:
    """Build under the digest lock; reuse what a concurrent build finished meanwhile."""
    if not force and (image := _reuse(job.store, job.name, job.digest, job.in_use)):
        job.progress(f"reusing {image.short_digest}, built meanwhile by another build")
        return image
    if force and job.in_use(job.digest):
        raise _in_use_error(job.name)
    _sweep(job.store, job.digest)
    tmp = job.store.tmp_dir(job.digest)
    tmp.mkdir()
    try:
        with _sigterm_interrupts():
            _populate(job, tmp)
            _install(job, tmp)
    except BaseException:
        job.progress("removing the unfinished build")
        remove_tree(tmp, unmount=True)
        raise
    return job.store.load(job.name, job.digest)


def build_image(
    name: str,
    packages: Iterable[str] | None = None,
    *,
    store: StoreArg = None,
    mirror: str | None = None,
    suite: str = DEFAULT_SUITE,
    force: bool = False,
    progress: Progress = quiet,
    cache_dir: str | Path | None = DEFAULT_CACHE_DIR,
    debootstrap_path: str | Path | None = None,
    require_root: bool = True,
    in_use: InUse = lambda d: False,
    extras: Iterable[str] = (),
    check_suite: Callable[[ImageSpec], None] | None = suites.check,
) -> Image:
    """Build (or reuse) the image for this recipe and point ``name`` at it.

    ``packages`` None means ``DEFAULT_PACKAGES``; otherwise exactly those are
    included. An existing build of the same recipe is reused at once unless
    ``force``. ``progress`` receives debootstrap's steps ("Retrieving libc6 ...").
    ``cache_dir`` keeps downloaded .debs between builds (None: no cache).
    ``debootstrap_path`` and ``require_root`` exist for tests (a fake debootstrap).
    ``extras`` (``hpvc.image.extras``, e.g. ``spark-3.5.3``) are installed after
    debootstrap; the Debian packages they need join ``packages``.
    ``check_suite`` refuses, before anything is written, a suite this host
    cannot build from the mirror (``hpvc.image.suites.check``; None for tests
    with a fake debootstrap). Packages the suite lacks are one InputError
    naming them, seconds into debootstrap (``suites.missing_packages``).
    """
    chosen = tuple(extras)
    spec = ImageSpec.make(with_extras(packages, chosen), suite, mirror or "", chosen)
    store_ = as_store(store)
    check_name(name)
    if not force and (image := _reuse(store_, name, spec.digest, in_use)):
        progress(f"reusing {image.short_digest}")
        return image
    exe = find_debootstrap(debootstrap_path, require_root=require_root)
    if check_suite is not None:
        check_suite(spec)
    store_.ensure()
    job = _Job(
        name, spec, store_, exe, None if cache_dir is None else Path(cache_dir), progress, in_use
    )
    with store_.digest_lock(spec.digest):
        return _build_locked(job, force)

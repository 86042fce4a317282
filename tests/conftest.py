"""Shared fixtures: the real-machine topology snapshots, extracted once per machine.

Each ``tests/data/topologies/NAME.tar.bz2`` is extracted with the system ``tar``
(Python's ``tarfile`` is several times slower on bzip2), all of them at once,
into a cache keyed by the tarball's SHA-256:
``$HPVC_TEST_CACHE`` or ``$XDG_CACHE_HOME/hpvc-tests`` or ``~/.cache/hpvc-tests``.
Later runs on the same machine reuse the trees; a changed tarball gets a new
key. Without a usable cache (``HPVC_TEST_CACHE=`` turns it off, or the
directory cannot be written) the trees go to the session's temporary directory.
The tests only read the trees.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import TOPOLOGIES, requires

SUFFIX = ".tar.bz2"
CACHE_FORMAT = "1"  # part of the key: bump it when the extraction changes
COMPLETE = ".complete"  # written last, before the tree is renamed into place


def snapshot_names() -> list[str]:
    """Snapshot names, for parametrizing. With none found, one placeholder, so the
    tests still run and the ``snapshots`` fixture skips, or fails under CI, with
    the reason instead of pytest quietly dropping an empty parameter set."""
    names = sorted(
        os.path.basename(p)[: -len(SUFFIX)]
        for p in glob.glob(os.path.join(TOPOLOGIES, "*" + SUFFIX))
    )
    return names or ["(no topology snapshots found)"]


def cache_dir() -> Path | None:
    """Where extracted snapshots are kept between runs; None when caching is off."""
    given = os.environ.get("HPVC_TEST_CACHE")
    if given is not None:
        return Path(given) / "topologies" if given else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpvc-tests" / "topologies"


def _digest(tarball: Path) -> str:
    h = hashlib.sha256(CACHE_FORMAT.encode())
    with tarball.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _extract(tarball: Path, dest: Path) -> None:
    """Extract ``tarball`` into the existing directory ``dest``."""
    tar = shutil.which("tar")
    if tar is None:
        with tarfile.open(tarball) as t:
            t.extractall(dest, filter="tar")
        return
    cmd = [tar, "--no-same-owner", "-xjf", str(tarball), "-C", str(dest)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")


def _into_cache(tarball: Path, digest: str, cache: Path) -> Path | None:
    """``cache/<digest>``, extracted there first if needed; None when the cache is unusable.

    The tree is built in a temporary sibling and renamed into place, so a run
    that is killed half-way, or a concurrent run, never leaves a partial tree.
    """
    final = cache / digest
    if (final / COMPLETE).is_file():
        return final
    try:
        cache.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}-", dir=cache))
    except OSError:
        return None
    try:
        _extract(tarball, work)
        (work / COMPLETE).write_text(tarball.name + "\n")
        try:
            work.rename(final)
        except OSError:  # another run renamed its copy first (or a stray tree is there)
            if not (final / COMPLETE).is_file():
                return None
        return final
    except OSError:
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def extracted(tarball: Path, cache: Path | None, scratch: Path) -> Path:
    """The directory that holds ``tarball``'s extracted tree (its root folder inside)."""
    digest = _digest(tarball)
    if cache is not None:
        found = _into_cache(tarball, digest, cache)
        if found is not None:
            return found
    out = scratch / digest
    out.mkdir()
    _extract(tarball, out)
    return out


def _root(where: Path, name: str) -> Path:
    """The snapshot's root folder: ``NAME/``, else the one folder in the archive."""
    if (where / name).is_dir():
        return where / name
    dirs = [p for p in where.iterdir() if p.is_dir()]
    if len(dirs) != 1:
        raise RuntimeError(f"{name}{SUFFIX}: expected one root folder, found {dirs}")
    return dirs[0]


@pytest.fixture(scope="session")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Name -> extracted root of every snapshot in tests/data/topologies."""
    requires("topologies")
    names = [n for n in snapshot_names() if os.path.isfile(os.path.join(TOPOLOGIES, n + SUFFIX))]
    if not names:
        reason = f"no *{SUFFIX} in {TOPOLOGIES}"
        if os.environ.get("HPVC_REQUIRE_ALL") == "1":
            pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {reason}")
        pytest.skip(reason)
    cache = cache_dir()
    scratch = tmp_path_factory.mktemp("topologies")

    def one(name: str) -> Path:
        return _root(extracted(Path(TOPOLOGIES, name + SUFFIX), cache, scratch), name)

    with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))

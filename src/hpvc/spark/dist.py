"""The pinned Apache Spark: fetched once, verified, extracted once into a SPARK_HOME.

Spark comes from the PyPI sdist of pyspark, which carries the whole Apache
Spark distribution (``deps/jars`` with every jar, ``deps/bin`` with
``spark-class`` and ``spark-submit``). The same extracted folder runs the
native benchmarks and is copied into the ``spark`` image (``/opt/spark``), so
both sides run byte-identical Spark.

Cache layout (``$HPVC_CACHE_DIR/spark``, default ``/var/cache/hpvc/spark``)::

    pyspark-3.5.3.tar.gz      the sdist, verified against SDIST.sha256
    spark-3.5.3/              the SPARK_HOME: bin/ sbin/ jars/ conf/ RELEASE
    .lock                     held while either of the above is made

The sdist has no ``start-master.sh``/``start-worker.sh`` (its ``sbin`` holds
only the history-server scripts); hpvc starts the daemons with
``bin/spark-class`` directly, which needs nothing more than ``bin`` and
``jars``. ``RELEASE`` tells Spark's launcher that ``jars/`` is a release
layout rather than a source build.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from hpvc.errors import HpvcError, MissingDependency
from hpvc.locks import file_lock
from hpvc.progress import Progress, quiet

DEFAULT_CACHE_ROOT = Path("/var/cache/hpvc")
DOWNLOAD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Pinned:
    """One pinned Spark distribution: the pyspark sdist of that version and its sha256."""

    version: str
    sha256: str

    @property
    def sdist(self) -> str:
        return f"pyspark-{self.version}.tar.gz"

    @property
    def home_name(self) -> str:
        return f"spark-{self.version}"

    @property
    def prefix(self) -> str:
        """Where the distribution lies inside the sdist."""
        return f"pyspark-{self.version}/deps/"


SPARK = Pinned("3.5.3", "68b7cc0c0c570a7d8644f49f40d2da8709b01d30c9126cc8cf93b4f84f3d9747")
VERSION = SPARK.version

# The folders of the distribution a SPARK_HOME needs (examples, data, python stay out).
_TAKE = ("bin/", "sbin/", "jars/")


def cache_dir(path: str | Path | None = None) -> Path:
    """``path``, else ``$HPVC_CACHE_DIR/spark``, else ``/var/cache/hpvc/spark``."""
    if path is not None:
        return Path(path)
    return Path(os.environ.get("HPVC_CACHE_DIR") or DEFAULT_CACHE_ROOT) / "spark"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _fix(cache: Path, pin: Pinned) -> str:
    return f"or put {pin.sdist} (sha256 {pin.sha256[:16]}...) into {cache} by hand"


def _verify(path: Path, pin: Pinned, cache: Path) -> None:
    got = sha256_of(path)
    if got != pin.sha256:
        raise HpvcError(
            f"spark {pin.version}",
            f"{path} has sha256 {got[:16]}..., the pinned one is {pin.sha256[:16]}...",
            f"remove {path} and retry; if it happens again the index serves another file, "
            + _fix(cache, pin),
        )


def _pip_download(dest: Path, pin: Pinned) -> Path:
    """``pip download`` the sdist into the empty folder ``dest``; the file it saved."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off"]
    argv += ["--dest", str(dest), f"pyspark=={pin.version}"]
    what = f"spark {pin.version} download"
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise HpvcError(
            what, f"pip download took over {DOWNLOAD_TIMEOUT_S:.0f} s", _fix(dest.parent, pin)
        ) from None
    if "No module named pip" in done.stderr:
        raise MissingDependency(
            what, f"pip is not available to {sys.executable}", "install pip, " + _fix(dest, pin)
        )
    saved = dest / pin.sdist
    if done.returncode != 0 or not saved.is_file():
        lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {done.returncode}"
        raise HpvcError(
            what,
            f"pip download pyspark=={pin.version} failed: {why}",
            "check the network and pip's index, " + _fix(dest.parent, pin),
        )
    return saved


def _fetch_locked(cache: Path, pin: Pinned, progress: Progress) -> Path:
    target = cache / pin.sdist
    if target.is_file():
        _verify(target, pin, cache)
        return target
    tmp = cache / f".download-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        progress(f"downloading {pin.sdist} with pip")
        saved = _pip_download(tmp, pin)
        progress(f"verifying {pin.sdist}")
        _verify(saved, pin, cache)
        os.replace(saved, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _ensure(cache: Path) -> Path:
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except PermissionError as e:
        raise HpvcError(
            f"spark cache {cache}",
            f"cannot create it: {e.strerror}",
            "run as root or set HPVC_CACHE_DIR to a writable folder",
        ) from None
    return cache


def fetch(
    cache: str | Path | None = None, *, pin: Pinned = SPARK, progress: Progress = quiet
) -> Path:
    """The verified sdist in the cache, downloaded with pip the first time."""
    root = _ensure(cache_dir(cache))
    with file_lock(root / ".lock"):
        return _fetch_locked(root, pin, progress)


def _extract(sdist: Path, dest: Path, pin: Pinned) -> int:
    """Copy bin/, sbin/ and jars/ of the distribution into ``dest``; the files written.

    Only regular files and folders under the prefix are taken, by their
    normalized name, so nothing in the archive can write outside ``dest``.
    """
    count = 0
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            name = member.name
            if not name.startswith(pin.prefix) or ".." in Path(name).parts:
                continue
            rel = name[len(pin.prefix) :]
            if not rel.startswith(_TAKE) or rel.endswith(".cmd"):
                continue
            out = dest / rel
            if member.isdir():
                out.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                out.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None  # a regular file always has data
                with src, open(out, "wb") as f:
                    shutil.copyfileobj(src, f, 1 << 20)
                os.chmod(out, 0o755 if member.mode & 0o111 else 0o644)
                count += 1
    return count


def _home_locked(cache: Path, pin: Pinned, progress: Progress) -> Path:
    home = cache / pin.home_name
    if home.is_dir():
        return home
    sdist = _fetch_locked(cache, pin, progress)
    tmp = cache / f".{pin.home_name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        progress(f"extracting Spark {pin.version}")
        if _extract(sdist, tmp, pin) == 0 or not (tmp / "bin" / "spark-class").is_file():
            raise HpvcError(
                f"spark {pin.version}",
                f"{sdist} holds no Spark distribution under {pin.prefix}",
                f"remove {sdist} and retry",
            )
        (tmp / "conf").mkdir()
        (tmp / "RELEASE").write_text(
            f"Spark {pin.version} (the distribution inside {pin.sdist}, "
            f"sha256 {pin.sha256}), extracted by hpvc\n"
        )
        os.rename(tmp, home)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home


def spark_home(
    cache: str | Path | None = None, *, pin: Pinned = SPARK, progress: Progress = quiet
) -> Path:
    """A ready SPARK_HOME of the pinned Spark, fetched and extracted once.

    The folder appears whole or not at all (extracted beside it, then renamed)
    and the cache lock keeps two processes from doing the work twice.
    """
    root = cache_dir(cache)
    home = root / pin.home_name
    if home.is_dir():
        return home
    _ensure(root)
    with file_lock(root / ".lock"):
        return _home_locked(root, pin, progress)


def _deb_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def java_home() -> Path:
    """The Java 17 Spark runs on: ``$JAVA_HOME``, else Debian's openjdk-17."""
    env = os.environ.get("JAVA_HOME")
    home = Path(env) if env else Path(f"/usr/lib/jvm/java-17-openjdk-{_deb_arch()}")
    if not (home / "bin" / "java").is_file():
        raise MissingDependency(
            "spark",
            f"no java in {home}",
            "apt-get install openjdk-17-jdk-headless, or set JAVA_HOME",
        )
    return home

"""hpvc's TeraSort application jar, compiled from the Java sources shipped in this package.

The sources live in ``hpvc/spark/terasort/*.java`` as package data rather than
under ``native/``: an installed hpvc (pip, no source tree) must still build
the jar, both for native runs and for the ``spark`` image, and package data
is the one place an installed hpvc can always read. The jar is compiled
against the pinned Spark's jars with ``javac --release 17`` (so it runs on the
image's Java 17 runtime) and cached by the hash of the sources and the Spark
version; ``jar --date`` makes the same sources give a byte-identical jar.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from hpvc.errors import HpvcError, MissingDependency
from hpvc.spark.dist import VERSION, java_home

MAIN_CLASS = "hpvc.terasort.TeraSort"
# A fixed timestamp for every entry of the jar: the same sources, the same bytes.
JAR_DATE = "2024-01-01T00:00:00Z"


def sources() -> dict[str, bytes]:
    """The TeraSort Java sources, name -> content, from the installed package."""
    root = resources.files("hpvc.spark").joinpath("terasort")
    found = {
        entry.name: entry.read_bytes() for entry in root.iterdir() if entry.name.endswith(".java")
    }
    if not found:
        raise HpvcError("terasort jar", f"no Java sources in {root}", "reinstall hpvc")
    return dict(sorted(found.items()))


def sources_digest() -> str:
    """sha256 over the sources' names and contents and the Spark version they build against."""
    h = hashlib.sha256(f"spark-{VERSION}\n".encode())
    for name, text in sources().items():
        h.update(f"{name}\n{len(text)}\n".encode())
        h.update(text)
    return h.hexdigest()


def _jdk_tool(name: str) -> str:
    exe = java_home() / "bin" / name
    if exe.is_file():
        return str(exe)
    found = shutil.which(name)
    if found is None:
        raise MissingDependency(
            "terasort jar", f"{name} not found", "apt-get install openjdk-17-jdk-headless"
        )
    return found


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        raise HpvcError("terasort jar", f"{what} failed: {' / '.join(lines[:6])}")


def build_jar(spark_home: Path, out_dir: Path) -> Path:
    """``out_dir/terasort-<digest12>.jar``, compiled once per sources and Spark version.

    Built beside its final name and renamed into place, so a concurrent build
    or a crash never leaves a partial jar under the final name.
    """
    jar = out_dir / f"terasort-{sources_digest()[:12]}.jar"
    if jar.is_file():
        return jar
    javac, jar_tool = _jdk_tool("javac"), _jdk_tool("jar")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except PermissionError as e:
        raise HpvcError(
            f"terasort jar in {out_dir}",
            f"cannot create it: {e.strerror}",
            "run as root or set HPVC_CACHE_DIR to a writable folder",
        ) from None
    work = out_dir / f".build-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        src, classes = work / "src", work / "classes"
        src.mkdir(parents=True)
        for name, text in sources().items():
            (src / name).write_bytes(text)
        cp = f"{spark_home}/jars/*"
        files = [str(src / name) for name in sources()]
        flags = ["--release", "17", "-encoding", "UTF-8", "-nowarn", "-cp", cp]
        _run([javac, *flags, "-d", str(classes), *files], "javac")
        tmp_jar = work / jar.name
        create = [jar_tool, "--create", "--file", str(tmp_jar), "--main-class", MAIN_CLASS]
        _run([*create, "--date", JAR_DATE, "-C", str(classes), "."], "jar")
        os.replace(tmp_jar, jar)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return jar

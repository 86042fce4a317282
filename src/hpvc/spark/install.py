"""The ``spark-3.5.3`` image extra: the pinned SPARK_HOME and the TeraSort jar, into a rootfs.

Runs after debootstrap, inside the image build (root, the store's temporary
folder). Copies the very folder the native runs use (``hpvc.spark.dist``) to
``/opt/spark`` and the jar built from the sources of this hpvc to
``/opt/hpvc/terasort.jar``, then records the daemons' class-data archives
(``hpvc.spark.cds``); nothing outside the rootfs is written except the
download/jar cache. The Java runtime comes from Debian (openjdk-17-jre-headless,
in the recipe's packages), the same package as the host's JDK.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.progress import Progress
from hpvc.spark import cds, model
from hpvc.spark.app import build_jar
from hpvc.spark.dist import cache_dir, spark_home


def _inside(rootfs: Path, rel: str) -> Path:
    """``rootfs/rel`` with every folder on the way a real one (made if missing): a
    symlink in the rootfs (``/opt -> /host/...``) is refused, never followed."""
    path = rootfs
    for part in Path(rel.lstrip("/")).parts:
        path = path / part
        if path.is_symlink():
            raise HpvcError(f"image rootfs {rootfs}", f"/{rel} crosses the symlink {path}")
        path.mkdir(exist_ok=True)
    return path


def rootfs_java(rootfs: Path) -> Path:
    """The image's java 17 (from openjdk-17-jre-headless); HpvcError when missing."""
    found = sorted(rootfs.glob("usr/lib/jvm/java-17-openjdk-*/bin/java"))
    if not found:
        raise HpvcError(
            "image extra spark", "no Java 17 in the rootfs", "add openjdk-17-jre-headless"
        )
    return found[0]


def install_spark(rootfs: Path, progress: Progress) -> None:
    rootfs_java(rootfs)
    home = spark_home(progress=progress)
    progress("building the TeraSort jar")
    jar = build_jar(home, cache_dir() / "jars")
    progress(f"copying Spark to {model.IMAGE_SPARK_HOME}")
    spark_dir = _inside(rootfs, model.IMAGE_SPARK_HOME)
    shutil.rmtree(spark_dir)
    shutil.copytree(home, spark_dir, symlinks=True)
    jar_dir = _inside(rootfs, str(Path(model.IMAGE_JAR).parent))
    shutil.copyfile(jar, jar_dir / Path(model.IMAGE_JAR).name)
    cds.make_archives(rootfs, progress)

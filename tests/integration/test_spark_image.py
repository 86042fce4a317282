"""``hpvc image build spark`` for real: debootstrap with Java, then the pinned Spark
and the TeraSort jar in the rootfs, the very bytes the native runs use.

Built into the default store like the other image tests (the store is the
cache: later runs reuse it); the Spark download is cached too.
"""

from __future__ import annotations

import filecmp
import json
import subprocess
from pathlib import Path

import pytest

from hpvc.cli import main
from hpvc.image import resolve_image
from hpvc.image.extras import SPARK_EXTRA
from hpvc.spark import model
from hpvc.spark.app import build_jar
from hpvc.spark.dist import cache_dir, spark_home
from tests.helpers import requires
from tests.integration.test_image import in_rootfs


def in_chroot(rootfs: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` chrooted into ``rootfs`` with its own /proc, in a private mount
    and PID namespace: nothing is mounted where anyone else sees it, and the
    namespace (with its mount) is gone when the command is."""
    cmd = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={rootfs}/proc"]
    return subprocess.run(
        [*cmd, "chroot", str(rootfs), *argv], capture_output=True, text=True, timeout=120
    )


def test_spark_image_has_spark_the_jar_and_java(capsys: pytest.CaptureFixture[str]) -> None:
    requires("root", "debootstrap", "java")
    try:
        main(["image", "build", "spark", "--json"])
    except SystemExit as e:
        assert not e.code, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert doc["extras"] == [SPARK_EXTRA] and "openjdk-17-jre-headless" in doc["packages"]
    image = resolve_image("spark")
    rootfs = image.rootfs
    assert image.extras == (SPARK_EXTRA,)

    spark = rootfs / model.IMAGE_SPARK_HOME.lstrip("/")
    home = spark_home()
    for rel in ("bin/spark-class", "bin/spark-submit", "RELEASE", "jars/spark-core_2.12-3.5.3.jar"):
        assert (spark / rel).is_file(), rel
    assert filecmp.cmp(spark / "RELEASE", home / "RELEASE", shallow=False)
    assert sorted(p.name for p in (spark / "jars").iterdir()) == sorted(
        p.name for p in (home / "jars").iterdir()
    )
    jar = rootfs / model.IMAGE_JAR.lstrip("/")
    assert filecmp.cmp(jar, build_jar(home, cache_dir() / "jars"), shallow=False)
    assert in_rootfs(rootfs, "/usr/bin/java").is_file()
    assert in_rootfs(rootfs, "/usr/bin/ps").is_file()  # Spark's scripts call ps

    done = in_chroot(rootfs, "java", "-version")
    assert done.returncode == 0, done.stderr
    assert 'version "17.' in done.stderr
    # Spark itself runs in the image: the launcher, the JVM, the jars. (SPARK_LOCAL_IP:
    # the chroot's hostname resolves to nothing, and Spark looks its address up.)
    done = in_chroot(
        rootfs, "env", f"SPARK_HOME={model.IMAGE_SPARK_HOME}", "SPARK_LOCAL_IP=127.0.0.1",
        f"{model.IMAGE_SPARK_HOME}/bin/spark-submit", "--version",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "version 3.5.3" in done.stderr + done.stdout

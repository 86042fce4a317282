"""An image without Java or Spark is refused for a ``[spark]`` cluster at
``up``, in one line naming what is missing, before any host change; an
imported image that brings its own Java and Spark where hpvc's recipe puts
them is accepted (issue 26, item 3: nothing of an image's userland assumed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hpvc.backends.shared import spark_missing
from hpvc.image import Store as ImageStore
from hpvc.spark.model import IMAGE_JAVA_HOME, IMAGE_SPARK_HOME
from tests.helpers import ROOT, requires

DIGEST = "ab" * 32
JAVA = f"{IMAGE_JAVA_HOME}/bin/java"
SPARK_CLASS = f"{IMAGE_SPARK_HOME}/bin/spark-class"


def busybox_like(top: Path, *extra: str) -> ImageStore:
    """A store under ``top`` with an imported image ``bb`` whose root has a
    shell, sleep and the ``extra`` absolute paths (as empty files)."""
    s = ImageStore(top / "images")
    s.ensure()
    (s.names_dir / "bb").write_text(DIGEST + "\n")
    root = s.digest_dir(DIGEST) / "rootfs"
    for path in ("/bin/sh", "/bin/sleep", *extra):
        dest = root / path.lstrip("/")  # inside the image, never the host's path
        assert dest.is_relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text("")
    doc = {"names": ["bb"], "digest": DIGEST, "source": "dir:/x", "created": "now",
           "size_bytes": 0}  # fmt: skip
    (s.digest_dir(DIGEST) / "image.json").write_text(json.dumps(doc))
    return s


def test_what_spark_runs_is_looked_up_inside_the_image(tmp_path: Path) -> None:
    root = lambda s: s.digest_dir(DIGEST) / "rootfs"  # noqa: E731
    assert spark_missing(root(busybox_like(tmp_path / "a"))) == [JAVA, SPARK_CLASS]
    assert spark_missing(root(busybox_like(tmp_path / "b", JAVA))) == [SPARK_CLASS]
    assert spark_missing(root(busybox_like(tmp_path / "c", JAVA, SPARK_CLASS))) == []


def _up(spec_text: str, images: ImageStore, state: Path) -> subprocess.CompletedProcess[str]:
    spec = state.parent / "s.toml"
    spec.write_text(spec_text)
    env = {**os.environ, "HPVC_IMAGE_DIR": str(images.root), "HPVC_STATE_DIR": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "hpvc", "up", str(spec)],
        capture_output=True, text=True, check=False, env=env, cwd=ROOT,
    )  # fmt: skip


def test_up_refuses_it_in_one_line_and_changes_nothing(tmp_path: Path) -> None:
    requires("root")
    images = busybox_like(tmp_path, JAVA)
    text = (Path(ROOT) / "examples" / "spark.toml").read_text()
    assert 'image = "spark"' in text
    state = tmp_path / "state"
    r = _up(text.replace('image = "spark"', 'image = "bb"'), images, state)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert lines == [
        f"hpvc: image 'bb': has no {SPARK_CLASS}, which the spec's [spark] runs"
        ' (hpvc image build spark, and image = "spark" in the spec)'
    ]
    made = sorted(p.name for p in (state / "clusters").glob("*")) if state.exists() else []
    assert made == [], made

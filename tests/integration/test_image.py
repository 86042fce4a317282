"""The real default image, built with debootstrap into the default store.

The store is the cache: the first run on a machine builds the image (about a
minute), later runs and later tests reuse it. The image is not removed.
"""

from __future__ import annotations

import time
from pathlib import Path

from hpvc.image import DEFAULT_NAME, build_image, resolve_image
from tests.helpers import requires


def in_rootfs(rootfs: Path, path: str) -> Path:
    """``path`` resolved as if ``rootfs`` were /: absolute symlinks stay inside it
    (``/usr/bin/mpirun -> /etc/alternatives/mpirun``), never reach the host."""
    current = rootfs / path.lstrip("/")
    for _ in range(40):
        if not current.is_symlink():
            return current
        target = Path(current.readlink())
        current = (
            rootfs / str(target).lstrip("/") if target.is_absolute() else current.parent / target
        )
    raise AssertionError(f"symlink loop at {path}")


def test_default_image_builds_and_is_cached() -> None:
    requires("root", "debootstrap")
    image = build_image(DEFAULT_NAME)
    for tool in ("/usr/bin/mpirun", "/usr/bin/hpcc", "/usr/bin/fio", "/usr/bin/ping"):
        assert in_rootfs(image.rootfs, tool).is_file(), tool
    assert (image.rootfs / "etc/hpvc-image").read_text().strip() == image.digest
    assert resolve_image(DEFAULT_NAME).rootfs == image.rootfs

    started = time.monotonic()
    again = build_image(DEFAULT_NAME)
    assert time.monotonic() - started < 2.0
    assert again.reused and again.digest == image.digest

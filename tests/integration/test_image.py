"""The real default image, built with debootstrap into the default store.

The store is the cache: the first run on a machine builds the image (about a
minute), later runs and later tests reuse it. The image is not removed.
"""

from __future__ import annotations

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


def test_default_image_builds_and_is_cached(tmp_path: Path) -> None:
    requires("root", "debootstrap")
    image = build_image(DEFAULT_NAME)
    for tool in ("/usr/bin/mpirun", "/usr/bin/hpcc", "/usr/bin/fio", "/usr/bin/ping"):
        assert in_rootfs(image.rootfs, tool).is_file(), tool
    assert (image.rootfs / "etc/hpvc-image").read_text().strip() == image.digest
    assert resolve_image(DEFAULT_NAME).rootfs == image.rootfs

    # Built once, then reused: no debootstrap step, nothing in the rootfs rewritten.
    # (How fast the reuse is belongs in a benchmark, not here.) A debootstrap that
    # does not exist proves that no build is even attempted.
    stamp = image.rootfs / "etc/hpvc-image"
    before = stamp.stat().st_mtime_ns
    steps: list[str] = []
    again = build_image(
        DEFAULT_NAME, progress=steps.append, debootstrap_path=tmp_path / "no-debootstrap"
    )
    assert again.reused and again.digest == image.digest
    assert again.rootfs == image.rootfs
    assert steps == [f"reusing {image.short_digest}"]
    assert stamp.stat().st_mtime_ns == before

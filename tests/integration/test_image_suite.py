"""Images of another Debian release (``hpvc image build --suite``), for real.

A bullseye minbase image (``procps`` its one package) is built once into the
default store and reused afterwards, as the mpich image is (about 40 s the
first time); its container nodes run bullseye's own userland and libc, not the
host's bookworm. Suites and packages this host cannot build are one line,
exit 2, before anything is written (or, for a package, seconds into
debootstrap, before any package is downloaded).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.errors import HpvcError
from hpvc.image import Image, build_image, resolve_image
from hpvc.image.rootfs import os_name
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import cli_env, spec_file, store

__all__ = ["store"]  # the fixture, shared with test_cluster

SUITE = "bullseye"
SUITE_IMAGE = "bullseye-mini"
SUITE_PACKAGES = ["procps"]


def suite_image_ready() -> Image:
    """The bullseye image: reused when the default store has it, else built."""
    requires("root", "debootstrap")
    try:
        image = resolve_image(SUITE_IMAGE)
        if image.suite == SUITE:
            return image
    except HpvcError:
        pass
    return build_image(SUITE_IMAGE, SUITE_PACKAGES, suite=SUITE)


def hpvc(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpvc", *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_bullseye_image_nodes_run_bullseye(
    store: Store, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    image = suite_image_ready()
    assert image.suite == SUITE
    assert os_name(image.rootfs) == "Debian GNU/Linux 11 (bullseye)"
    r = hpvc("image", "ls", "--json", env=cli_env(store))
    assert r.returncode == 0, r.stderr
    listed = {i["name"]: i for i in json.loads(r.stdout)}[SUITE_IMAGE]
    assert listed["suite"] == SUITE and listed["os"] == "Debian GNU/Linux 11 (bullseye)"

    name = f"sb{os.getpid() % 10000}"
    spec = Path(spec_file(tmp_path, name, computes=1))
    spec.write_text(
        spec.read_text().replace(
            'kind = "container"\n', f'kind = "container"\nimage = "{SUITE_IMAGE}"\n'
        )
    )
    lifecycle.up(str(spec), store)
    try:
        capfd.readouterr()
        script = "cat /etc/debian_version; ldd --version | head -n 1"
        assert ops.exec_node(name, "compute0", ["sh", "-c", script], store) == 0
        version, libc = capfd.readouterr().out.splitlines()[:2]
    finally:
        lifecycle.down(name, store)
    # bullseye's own files and glibc 2.31, not the host's (bookworm: 12.x, 2.36)
    assert version.startswith("11."), version
    assert libc.endswith(" 2.31"), libc
    host = platform.libc_ver()[1]
    assert host and not libc.endswith(f" {host}"), (libc, host)


def test_suites_and_packages_this_host_lacks_are_one_line(tmp_path: Path) -> None:
    requires("root", "debootstrap")
    images = tmp_path / "images"

    # a suite the mirror does not serve: refused before the store exists
    r = hpvc("image", "build", "old", "--suite", "buster", "--store", str(images))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("hpvc: suite 'buster': not served")
    assert "bookworm" in r.stderr and "bullseye" in r.stderr and "trixie" in r.stderr
    assert not images.exists()

    # the default packages are bookworm's: trixie has no libopenmpi3, said seconds
    # into debootstrap with the command line that leaves it out; nothing is kept
    r = hpvc("image", "build", "new", "--suite", "trixie", "--store", str(images))
    assert r.returncode == 2, r.stderr
    last = r.stderr.splitlines()[-1]
    assert last.startswith("hpvc: image build new: trixie has no package libopenmpi3"), last
    assert "hpvc image build new --suite trixie --no-defaults --packages " in last, last
    assert "openmpi-bin" in last and ",libopenmpi3" not in last, last
    assert not list((images / "by-digest").glob("*.tmp-*"))
    assert not (images / "names" / "new").exists()

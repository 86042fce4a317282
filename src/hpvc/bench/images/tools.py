"""The peers of ``hpvc bench images``: Podman in a private store, tar, skopeo + umoci.

Podman runs with a storage root of its own (``--root``/``--runroot`` under
the run's temporary folder, the overlay driver), so the host's Podman images
and containers are never read or touched; nothing is made that lives outside
that folder (no network, no container is started), and ``podman rmi -a``
then removing the folder undoes everything.

``make_archives`` makes the two images of the run, from files on this host
only (no registry):

- ``base``: ``tar -C ROOTFS -c . | podman import`` of an hpvc image's root
  filesystem (``hpc``, about 300 MB), one layer;
- ``big``: ``podman build`` ``FROM`` base, ``COPY`` a folder of incompressible
  files (``os.urandom``, 4 MiB each; default 700 MiB): two layers, the first
  one base's own.

Each is written by ``podman save`` as a docker-archive (what ``docker save``
writes), then removed from Podman's store. Three ways to get an archive's
files, each timed by the wall clock around the commands a user would type,
and each cleaned up after, untimed:

- ``podman load -q -i ARCHIVE`` (then ``podman rmi``: its store is empty again);
- ``tar``: ``tar -xf ARCHIVE`` then ``tar -xf`` of each layer in the
  manifest's order into one folder (no whiteouts to handle: these layers
  have none), then ``rm -rf``;
- ``skopeo copy docker-archive:ARCHIVE oci:DIR:bench`` then ``umoci unpack``:
  what ``hpvc image import`` runs, without hpvc (then ``rm -rf``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hpvc.bench import common
from hpvc.errors import HpvcError

TOOLS = ["podman", "skopeo", "umoci", "tar", "du"]
CHUNK = 4 << 20  # bytes per incompressible file of the big image's layer
TIMEOUT_S = 1800


def run(argv: list[str], what: str, stdin: IO[bytes] | None = None) -> str:
    """Run ``argv``; its stdout, or HpvcError with the last line it said."""
    r = subprocess.run(
        argv, capture_output=True, text=True, check=False, stdin=stdin, timeout=TIMEOUT_S
    )
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(what, lines[-1] if lines else f"exit code {r.returncode}")
    return r.stdout.strip()


def timed(argvs: list[list[str]], what: str) -> float:
    """Wall seconds of the commands ``argvs``, one after the other."""
    t0 = time.perf_counter()
    for argv in argvs:
        run(argv, what)
    return time.perf_counter() - t0


def sync() -> None:
    """Write back what the last step left dirty, so it is not the next one's bill."""
    os.sync()


def du_bytes(path: Path) -> int:
    """Disk used under ``path`` (``du -s -B1``: hard links counted once)."""
    if not path.exists():
        return 0
    return int(run(["du", "-s", "-B1", str(path)], f"du {path}").split()[0])


@dataclass
class Podman:
    """Podman on a private storage root under ``tmp``."""

    tmp: Path

    def argv(self, *args: str) -> list[str]:
        return [
            "podman",
            "--root",
            str(self.tmp / "podman-root"),
            "--runroot",
            str(self.tmp / "podman-run"),
            "--storage-driver",
            "overlay",
            *args,
        ]

    def __call__(self, *args: str) -> str:
        return run(self.argv(*args), f"podman {args[0]}")

    def images(self) -> list[str]:
        return self("images", "-q", "--no-trunc").split()

    def load(self, archive: Path, tag: str) -> float:
        """``podman load`` timed; the image removed after (untimed)."""
        took = timed([self.argv("load", "-q", "-i", str(archive))], "podman load")
        self("rmi", "-f", tag)
        left = self.images()
        if left:
            raise HpvcError("podman rmi", f"{len(left)} image(s) left in the private store")
        return took

    def close(self) -> list[str]:
        """Remove every image and the private root; what could not be removed."""
        errors = []
        try:
            if (self.tmp / "podman-root").exists():
                self("rmi", "-a", "-f")
        except HpvcError as e:
            errors.append(common.error_line(e))
        for d in ("podman-root", "podman-run"):
            shutil.rmtree(self.tmp / d, ignore_errors=True)
            if (self.tmp / d).exists():
                errors.append(f"{self.tmp / d} not removed")
        return errors


@dataclass(frozen=True)
class Archive:
    """One docker-archive made for the run."""

    label: str
    tag: str
    path: Path
    layers: int

    def size(self) -> int:
        return self.path.stat().st_size


def _fill(folder: Path, mib: int) -> None:
    """``mib`` MiB of incompressible files under ``folder``."""
    folder.mkdir(parents=True)
    left = mib << 20
    i = 0
    while left > 0:
        n = min(CHUNK, left)
        (folder / f"blob{i:04d}.bin").write_bytes(os.urandom(n))
        left -= n
        i += 1


def make_archives(podman: Podman, rootfs: Path, extra_mib: int, prefix: str) -> list[Archive]:
    """``base`` from ``rootfs`` and ``big`` (base + ``extra_mib`` MiB), saved as
    docker-archives under podman's folder; Podman's store is empty after."""
    base_tag = f"localhost/{prefix}-base:latest"
    big_tag = f"localhost/{prefix}-big:latest"
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        run(podman.argv("import", "-q", "-", base_tag), "podman import", stdin=tar.stdout)
    finally:
        if tar.stdout:
            tar.stdout.close()
        if tar.wait(timeout=TIMEOUT_S) != 0:
            raise HpvcError("podman import", f"tar -C {rootfs} -c . failed")
    ctx = podman.tmp / "build"
    _fill(ctx / "data", extra_mib)
    (ctx / "Containerfile").write_text(f"FROM {base_tag}\nCOPY data /data\n")
    podman("build", "-q", "-t", big_tag, str(ctx))
    shutil.rmtree(ctx)
    out = []
    for label, tag in (("base", base_tag), ("big", big_tag)):
        path = podman.tmp / f"{label}.tar"
        podman("save", "--format", "docker-archive", "-o", str(path), tag)
        out.append(Archive(label, tag, path, len(layers_of(path))))
    podman("rmi", "-f", big_tag, base_tag)
    return out


def layers_of(archive: Path) -> list[str]:
    """The layer files of a docker-archive, in order (its manifest.json)."""
    got = run(["tar", "-xOf", str(archive), "manifest.json"], f"tar {archive.name}")
    manifest = json.loads(got)
    return [str(x) for x in manifest[0]["Layers"]]


def tar_unpack(archive: Path, scratch: Path) -> float:
    """Unpack the archive and then each of its layers with tar, timed; removed after."""
    top, rootfs = scratch / "tar-archive", scratch / "tar-rootfs"
    top.mkdir()
    rootfs.mkdir()
    try:
        t0 = time.perf_counter()
        run(["tar", "-C", str(top), "-xf", str(archive)], "tar -x archive")
        for layer in layers_of(archive):
            run(["tar", "-C", str(rootfs), "-xf", str(top / layer)], "tar -x layer")
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(top)
        shutil.rmtree(rootfs)


def umoci_unpack(archive: Path, scratch: Path) -> float:
    """``skopeo copy`` to an OCI layout and ``umoci unpack``, timed; removed after."""
    layout, bundle = scratch / "oci", scratch / "bundle"
    try:
        return timed(
            [
                ["skopeo", "copy", "-q", f"docker-archive:{archive}", f"oci:{layout}:bench"],
                ["umoci", "unpack", "--image", f"{layout}:bench", str(bundle)],
            ],
            "skopeo copy + umoci unpack",
        )
    finally:
        shutil.rmtree(layout, ignore_errors=True)
        shutil.rmtree(bundle, ignore_errors=True)

"""Which MPI an image carries: found in its own root filesystem, never on the host.

``hpvc run`` launches the image's MPI the way that implementation wants
(``hpvc.cluster.ops``), so it must know which one it is before anything runs:
the launcher on the image's PATH (``mpiexec``/``mpirun``, followed through the
image's own symlinks, e.g. Debian's ``/etc/alternatives``) and the
implementation its real name or the image's libraries say (MPICH: hydra,
``libmpich.so``; Open MPI: ``orterun``/``prterun``, ``libmpi.so.40``). The
version comes from the image's pkg-config files or its dpkg status, when it
has them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hpvc.image.rootfs import in_root

MPICH = "MPICH"
OPEN_MPI = "Open MPI"

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Launchers by name: the generic names first, judged by what they link to (an image
# with two MPIs runs the one its alternatives choose), then each implementation's own.
LAUNCHERS = (
    "mpiexec",
    "mpirun",
    "mpiexec.hydra",
    "mpiexec.mpich",
    "mpirun.mpich",
    "mpirun.openmpi",
    "mpiexec.openmpi",
)
LIB_DIRS = ("usr/lib", "usr/lib64", "lib", "lib64", "usr/local/lib", "usr/local/lib64")
_OMPI_LAUNCHER = re.compile(r"(orterun|prterun|prun)$|openmpi")
_MPICH_LAUNCHER = re.compile(r"hydra|mpich")


@dataclass(frozen=True)
class ImageMpi:
    """The MPI found in an image: which one, its version ('' if unknown), its launcher
    (the path inside the image, as the image's PATH names it)."""

    kind: str  # MPICH or OPEN_MPI
    version: str
    launcher: str

    def describe(self, image: str) -> str:
        """``MPICH 4.0.2 (image mpich)``: what ``hpvc run`` says it found."""
        v = f" {self.version}" if self.version else ""
        return f"{self.kind}{v} (image {image}, {self.launcher})"


def _lib_dirs(rootfs: Path) -> list[Path]:
    out = []
    for rel in LIB_DIRS:
        d = in_root(rootfs, rel)
        if d is not None and d.is_dir():
            out.append(d)
            out += [c for c in d.iterdir() if c.name.endswith("-linux-gnu") and c.is_dir()]
    return out


def _has_lib(rootfs: Path, pattern: str) -> bool:
    return any(any(d.glob(pattern)) for d in _lib_dirs(rootfs))


def _pc_version(rootfs: Path, names: tuple[str, ...]) -> str:
    for d in _lib_dirs(rootfs):
        for name in names:
            pc = d / "pkgconfig" / name
            try:
                text = pc.read_text(errors="replace")
            except OSError:
                continue
            m = re.search(r"^Version:\s*(\S+)", text, re.M)
            if m:
                return m.group(1)
    return ""


def _dpkg_version(rootfs: Path, packages: tuple[str, ...]) -> str:
    status = in_root(rootfs, "/var/lib/dpkg/status")
    if status is None:
        return ""
    for stanza in status.read_text(errors="replace").split("\n\n"):
        m = re.search(r"^Package:\s*(\S+)", stanza, re.M)
        v = re.search(r"^Version:\s*(?:\d+:)?([0-9][0-9.]*)", stanza, re.M)
        if m and v and m.group(1) in packages and "install ok installed" in stanza:
            return v.group(1).rstrip(".")
    return ""


def _kind(rootfs: Path, name: str, real: Path) -> str | None:
    for n in (name, real.name):
        if _MPICH_LAUNCHER.search(n):
            return MPICH
        if _OMPI_LAUNCHER.search(n):
            return OPEN_MPI
    if _has_lib(rootfs, "libmpich.so*"):
        return MPICH
    if _has_lib(rootfs, "libmpi.so.40*") or _has_lib(rootfs, "libopen-rte.so*"):
        return OPEN_MPI
    return None


def find_mpi(rootfs: Path, env: tuple[str, ...] = ()) -> ImageMpi | None:
    """The MPI whose launcher is on the image's PATH (its Env's, else the usual one);
    None when the image has no launcher this knows."""
    path = next((kv[5:] for kv in env if kv.startswith("PATH=")), "") or DEFAULT_PATH
    for name in LAUNCHERS:
        for d in path.split(":"):
            if not d:
                continue
            real = in_root(rootfs, f"{d}/{name}")
            if real is None or not real.is_file():
                continue
            kind = _kind(rootfs, name, real)
            if kind is None:
                continue
            if kind == MPICH:
                version = _pc_version(rootfs, ("mpich.pc",)) or _dpkg_version(
                    rootfs, ("mpich", "libmpich12")
                )
            else:
                version = _pc_version(rootfs, ("ompi.pc", "ompi-c.pc")) or _dpkg_version(
                    rootfs, ("openmpi-bin", "libopenmpi3")
                )
            return ImageMpi(kind, version, f"{d.rstrip('/')}/{name}")
    return None

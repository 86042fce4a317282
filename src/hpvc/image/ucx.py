"""The UCX transport over the ivshmem region, as far as guest images go (issue 29).

Co-resident VM guests of a cluster share one ivshmem region (``hpvc.host.ivshmem``);
``native/ucx`` builds a UCX transport module over it, ``libuct_ivshmem.so``, whose
transport UCX names ``ivshmem``. UCX 1.13 loads only the modules named when it was
built (``UCX_MODULE_DIR`` finds no new name), so a process takes it by
``LD_PRELOAD`` (``hpvc.cluster.ucx``). It is built against one UCX's internal
headers and works with that UCX alone, so hpvc puts it into a guest's base disk
only where the image's own ``libucx0`` is the version the module was built
against, ``MODULE_UCX``, which is bookworm's (the host's ``libucx-dev``; the
source hpvc builds it from is ``apt-get source ucx`` of that version). Any other
image (an imported one, another suite) boots without it, and ``hpvc run
--verbose`` says why (``verdict``).

This module reads the image's root filesystem and builds the module; it writes
nothing outside the directory it is given.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.image.rootfs import in_root

TRANSPORT = "ivshmem"  # the name UCX gives the transport (UCX_TLS, ucx_info -d)
MODULE = "libuct_ivshmem.so"
GUEST_MODULE_DIR = "/usr/local/lib/hpvc/ucx"  # in the guest's disk
GUEST_MODULE = f"{GUEST_MODULE_DIR}/{MODULE}"
MODULE_UCX = "1.13.1"  # the UCX version the module is built against (bookworm's libucx0)
UCX_PACKAGES = ("libucx0",)
NATIVE_UCX = Path(__file__).resolve().parents[3] / "native" / "ucx"
if not NATIVE_UCX.is_dir():  # an installed copy (scripts/slurm/install.sh puts them here)
    NATIVE_UCX = Path(sys.prefix) / "share" / "hpvc" / "native" / "ucx"


@dataclass(frozen=True)
class Verdict:
    """Whether an image's guests get the module: ``ok``, and what decided it."""

    ok: bool
    image_ucx: str  # the image's libucx0 version; "" when it has none
    why: str

    def describe(self, image: str) -> str:
        """One line for ``hpvc run --verbose``."""
        if self.ok:
            return f"image {image}: UCX {self.image_ucx}, {MODULE} in {GUEST_MODULE_DIR}"
        return f"image {image}: no {MODULE} in its guests: {self.why}"


def image_ucx_version(rootfs: Path) -> str:
    """The version of ``libucx0`` in the image's dpkg status ("1.13.1"), "" if not installed."""
    status = in_root(rootfs, "/var/lib/dpkg/status")
    if status is None or not status.is_file():
        return ""
    for stanza in status.read_text(errors="replace").split("\n\n"):
        name = re.search(r"^Package:\s*(\S+)", stanza, re.M)
        version = re.search(r"^Version:\s*(?:\d+:)?([0-9][0-9.]*)", stanza, re.M)
        if name and version and name.group(1) in UCX_PACKAGES and "install ok installed" in stanza:
            return version.group(1).rstrip(".")
    return ""


def verdict(rootfs: Path, sources: Path | None = None) -> Verdict:
    """Whether guests of the image at ``rootfs`` get the module (``sources``: this
    hpvc's ``native/ucx``, default ``NATIVE_UCX``)."""
    found = image_ucx_version(rootfs)
    src = NATIVE_UCX if sources is None else sources
    if not found:
        return Verdict(False, "", "the image has no UCX (libucx0): its MPI cannot use it")
    if found != MODULE_UCX:
        why = f"the image's UCX is {found}, the module is built for UCX {MODULE_UCX}"
        return Verdict(False, found, why)
    if not (src / "Makefile").is_file():
        return Verdict(False, found, f"this hpvc has no module sources ({src}/Makefile)")
    return Verdict(True, found, "")


def module_sources(sources: Path | None = None) -> list[Path]:
    """The files that decide the module (for the guest build's cache key)."""
    src = NATIVE_UCX if sources is None else sources
    if not src.is_dir():
        return []
    return sorted(
        p
        for p in src.iterdir()
        if p.is_file() and p.suffix in (".c", ".h", "") and not p.name.startswith(".")
    )


def compile_module(dest_dir: Path, sources: Path | None = None) -> Path:
    """``make -C native/ucx OUT=dest_dir``: the module, built against UCX ``MODULE_UCX``."""
    src = NATIVE_UCX if sources is None else sources
    done = subprocess.run(
        ["make", "-s", "-C", str(src), f"OUT={dest_dir}"],
        capture_output=True,
        text=True,
        check=False,
    )
    module = dest_dir / MODULE
    if done.returncode != 0 or not module.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise HpvcError(
            f"build {MODULE}",
            " / ".join(tail) or f"make exited {done.returncode} without {MODULE}",
            f"make -C {src} (it needs UCX {MODULE_UCX}'s source: make setup)",
        )
    return module

"""The guest initramfs: ``/init`` (hpvc-init) and the virtio modules, a gzipped newc cpio.

Members, in archive order (``initramfs_members``)::

    dev/  init  modules/  modules/<name>.ko ... (load order)  modules/order
    [modules/<name>.ko ... modules/binds]  newroot/  proc/  sys/

``modules/order`` names the module files one a line; ``/init`` loads them in
that order, then those ``modules/binds`` names only when the kernel command
line has ``hpvc.binds=`` (virtiofs: host folders shared into the guest), then
switches to the root disk. Everything is owned by root and
dated 1970, so the same inputs give the same bytes.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpvc.errors import HpvcError, MissingDependency

_DIRS = ("dev", "newroot", "proc", "sys")


def initramfs_members(modules: Sequence[str], on_demand: Sequence[str] = ()) -> list[str]:
    """The archive's member paths for modules named in load order (without ``.ko``),
    and those loaded only for ``hpvc.binds=`` (``on_demand``)."""
    return [
        "dev",
        "init",
        "modules",
        *(f"modules/{name}.ko" for name in modules),
        "modules/order",
        *(f"modules/{name}.ko" for name in on_demand),
        *(["modules/binds"] if on_demand else []),
        *(d for d in _DIRS if d != "dev"),
    ]


def module_order(modules: Sequence[str]) -> str:
    """The text of ``modules/order``."""
    return "".join(f"{name}.ko\n" for name in modules)


def _stage(
    stage: Path, init: Path, modules: Sequence[Path], on_demand: Sequence[Path] = ()
) -> list[str]:
    """Lay the initramfs out in ``stage``; return its members in archive order."""
    for d in _DIRS:
        (stage / d).mkdir(mode=0o755)
    shutil.copyfile(init, stage / "init")
    os.chmod(stage / "init", 0o755)
    (stage / "modules").mkdir(mode=0o755)
    for path in (*modules, *on_demand):
        shutil.copyfile(path, stage / "modules" / path.name)
        os.chmod(stage / "modules" / path.name, 0o644)
    names = [p.name.removesuffix(".ko") for p in modules]
    (stage / "modules" / "order").write_text(module_order(names))
    later = [p.name.removesuffix(".ko") for p in on_demand]
    if later:
        (stage / "modules" / "binds").write_text(module_order(later))
    members = initramfs_members(names, later)
    for member in members:
        os.utime(stage / member, (0, 0), follow_symlinks=False)
    return members


def pack_initramfs(
    init: Path, modules: Sequence[Path], dest: Path, workdir: Path, on_demand: Sequence[Path] = ()
) -> list[str]:
    """Write the gzipped newc cpio to ``dest`` (``workdir`` is scratch); return its members.

    ``modules`` are uncompressed ``<name>.ko`` files in load order; ``on_demand``
    are loaded after them only for a command line with ``hpvc.binds=``.
    """
    if shutil.which("cpio") is None:
        raise MissingDependency("guest initramfs", "cpio not found", "apt-get install cpio")
    stage = workdir / "initramfs"
    stage.mkdir()
    try:
        members = _stage(stage, init, modules, on_demand)
        done = subprocess.run(
            ["cpio", "--create", "--format=newc", "--owner=0:0", "--reproducible", "--quiet"],
            cwd=stage,
            input="".join(m + "\n" for m in members).encode(),
            capture_output=True,
            check=False,
        )
    finally:
        shutil.rmtree(stage)
    if done.returncode != 0:
        raise HpvcError("guest initramfs", f"cpio failed: {done.stderr.decode().strip()}")
    with open(dest, "wb") as f:
        f.write(gzip.compress(done.stdout, compresslevel=6, mtime=0))
    return members


def list_initramfs(path: Path) -> list[str]:
    """The member paths of a gzipped cpio, in archive order (``cpio -t``)."""
    done = subprocess.run(
        ["cpio", "--list", "--quiet"],
        input=gzip.decompress(path.read_bytes()),
        capture_output=True,
        check=True,
    )
    return done.stdout.decode().splitlines()

"""Guest disks: the read-only base ext4 image of an image's rootfs, and per-node copies.

``make_base_disk`` never mounts anything and never writes into the image: it
builds a hard-link farm of the rootfs (``cp -al``, no data copied) in a scratch
directory, adds ``/sbin/hpvc-init`` (and ``/usr/local/sbin/hpvc-shm``, the tool for
the ivshmem region co-resident VMs share, and ``/usr/local/sbin/hpvc-rsh``, which
runs a command on another node through its agent, and the UCX transport module over
the ivshmem region where the image gets one: ``hpvc.image.ucx``) there as new files,
removes the image's ssh host keys from the farm (unlinking a link leaves the image
untouched) so that every node makes its own on first boot, adds the mount points hpvc-init needs
that the image lacks (an imported image may have no ``/dev`` or ``/proc``:
``MOUNT_POINTS``, made in the farm only), and hands the farm to
``mkfs.ext4 -d``. ``node_disk`` gives each node a writable disk over the base:
a sparse raw copy or a qcow2 overlay backed by it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.image.rootfs import tree_size

MiB = 1 << 20
HEADROOM = 512 * MiB
ROUND = 64 * MiB
LABEL = "hpvc-root"
INIT_PATH = "sbin/hpvc-init"
SHM_TOOL_PATH = "usr/local/sbin/hpvc-shm"
RSH_TOOL_PATH = "usr/local/sbin/hpvc-rsh"  # a command on another node, through its agent
UCX_MODULE_DIR = "usr/local/lib/hpvc/ucx"  # hpvc.image.ucx.GUEST_MODULE_DIR, relative
# What the initramfs moves /dev onto and hpvc-init mounts or writes in (/etc/hosts).
MOUNT_POINTS = ("dev", "proc", "sys", "run", "tmp", "etc")
DiskMode = Literal["raw", "qcow2"]
DISK_MODES: tuple[DiskMode, ...] = ("raw", "qcow2")


def disk_size(rootfs_bytes: int) -> int:
    """Bytes of the base disk: the rootfs plus 512 MiB headroom, rounded up to 64 MiB."""
    return -(-(rootfs_bytes + HEADROOM) // ROUND) * ROUND


def _run(argv: list[str], what: str, package: str) -> None:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    argv = [shutil.which(argv[0], path=search) or argv[0], *argv[1:]]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise MissingDependency(
            what, f"{argv[0]} not found", f"apt-get install {package}"
        ) from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise HpvcError(what, f"{argv[0]} failed: {' / '.join(tail)}")


def in_tree(top: Path, rel: str) -> Path:
    """``top/rel`` with symlinks resolved as if ``top`` were /, so never outside ``top``."""
    parts = list(Path(rel).parts)
    current = top
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("/", "."):
            continue
        if part == "..":
            current = top if current == top else current.parent
            continue
        if not (current / part).is_symlink():
            current = current / part
            continue
        hops += 1
        if hops > 40:
            raise HpvcError(f"guest disk: /{rel}", "too many levels of symbolic links")
        target = os.readlink(current / part)
        if target.startswith("/"):
            current = top
        parts = list(Path(target).parts) + parts
    return current


def _add_init(farm: Path, init: Path, rel: str = INIT_PATH, mkdir: bool = False) -> None:
    dest = in_tree(farm, str(Path(rel).parent)) / Path(rel).name
    if mkdir and not dest.parent.exists() and not dest.parent.is_symlink():
        dest.parent.mkdir(mode=0o755, parents=True)
    if not dest.parent.is_dir():
        raise HpvcError("guest disk", f"/{Path(rel).parent} is not a directory in the image")
    if dest.exists() or dest.is_symlink():
        dest.unlink()  # a link into the image: unlinking leaves the image alone
    shutil.copyfile(init, dest)
    os.chmod(dest, 0o755)


def _add_mount_points(farm: Path) -> None:
    for rel in MOUNT_POINTS:
        path = farm / rel
        if not path.exists() and not path.is_symlink():
            path.mkdir()
            os.chmod(path, 0o1777 if rel == "tmp" else 0o755)


def _drop_host_keys(farm: Path) -> None:
    ssh = in_tree(farm, "etc/ssh")
    if ssh.is_dir():
        for key in ssh.glob("ssh_host_*"):
            key.unlink()


def make_base_disk(
    rootfs: Path,
    init: Path,
    dest: Path,
    workdir: Path,
    shm_tool: Path | None = None,
    rsh_tool: Path | None = None,
    ucx_module: Path | None = None,
) -> int:
    """Write the base ext4 image of ``rootfs`` plus ``init`` (and ``shm_tool``,
    ``rsh_tool``, the UCX transport module ``ucx_module``) to ``dest``.

    Returns the disk's size in bytes.
    """
    farm = workdir / "root"
    size = disk_size(tree_size(rootfs))
    try:
        _run(["cp", "-al", str(rootfs), str(farm)], "guest disk", "coreutils")
        _add_mount_points(farm)
        _add_init(farm, init, mkdir=True)  # an image without /sbin gets one in the farm
        if shm_tool is not None:
            _add_init(farm, shm_tool, SHM_TOOL_PATH, mkdir=True)
        if rsh_tool is not None:
            _add_init(farm, rsh_tool, RSH_TOOL_PATH, mkdir=True)
        if ucx_module is not None:
            _add_init(farm, ucx_module, f"{UCX_MODULE_DIR}/{ucx_module.name}", mkdir=True)
        _drop_host_keys(farm)
        os.chmod(farm, rootfs.stat().st_mode & 0o7777)
        argv = ["mkfs.ext4", "-q", "-F", "-d", str(farm), "-L", LABEL, "-m", "0"]
        _run([*argv, str(dest), f"{size // 1024}k"], "guest disk", "e2fsprogs")
    finally:
        shutil.rmtree(farm, ignore_errors=True)
    return size


def node_disk(base: Path, dest: Path, mode: DiskMode = "qcow2") -> Path:
    """A writable disk for one node at ``dest``: ``raw`` (sparse copy) or ``qcow2`` (overlay).

    A qcow2 overlay reads unchanged blocks from ``base``, which must then stay
    where it is and unchanged (the base disks of ``build_guest`` are read-only).
    The disk is made under a temporary name and renamed, so a failure leaves nothing.
    """
    if mode not in DISK_MODES:
        raise InputError(f"node disk mode {mode!r}", "unknown", "use raw or qcow2")
    if dest.exists():
        raise InputError(f"node disk {dest}", "already exists", "remove it or choose another path")
    base = base.absolute()
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        if mode == "raw":
            _run(["cp", "--sparse=always", str(base), str(tmp)], "node disk", "coreutils")
            os.chmod(tmp, 0o600)
        else:
            argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base)]
            _run([*argv, str(tmp)], "node disk", "qemu-utils")
        os.rename(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest

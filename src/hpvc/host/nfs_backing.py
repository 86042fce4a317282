"""Where a cluster's shared directory keeps its data on the host.

``backing`` gives NFS-Ganesha (``hpvc.host.nfs_server``) the directory it
exports: a plain directory, or, with a size, an ext4 file system of that
size in a sparse image file beside it, on a loop device (the same loop set-up
as the nodes' writable layers, ``hpvc.host.layer``: autoclear, direct I/O),
so that a cluster filling its shared directory gets ``ENOSPC`` instead of
filling the host's disk. Unlike a layer, this file system has a journal: it
may hold data that outlives the cluster.

The root of the shared directory is mode 1777 (like /tmp): any user of the
cluster may make files and folders in it, and only remove their own.

For VM nodes, ``disk_image`` makes only the image file (root directory mode
1777 too, set with ``debugfs``): it is never mounted on the host, since the
serving guest mounts it as its disk, and two kernels must not write one ext4
at once. Journaled (kind ``"nfs-image"``); the undo removes the image this
call made unless ``keep``.

Who last wrote an image is in its metadata: the extended attribute
``trusted.hpvc.writer`` of the image file (``trusted.``: only root reads or
sets it), ``host`` when ``backing`` made it, ``guest`` from the moment
``disk_image`` hands it to a VM, made or kept. A file system a VM guest wrote
is never mounted by the host kernel: its bytes are a tenant's, and parsing
them is for a guest kernel, not the host's. So ``backing`` attaches a kept
image only while it says ``host``; an image a guest wrote, or one whose writer
is not recorded (kept by an older hpvc, or on a file system without extended
attributes), is refused with InputError before anything is made, and stays a
VM cluster's (a VM of the same cluster name serves it again).

Journaled (kind ``"nfs-backing"``) before anything is made. The undo
unmounts the file system (its loop device then goes by itself); then, when
``keep`` is False, removes the data this call made (the directory, or the
image file and the mount point); when ``keep`` is True, leaves the directory
or the image, and a later ``backing`` with the same path attaches the same
data again.

``set_sync`` switches such a file system between buffered and synchronous
writes (``MS_SYNCHRONOUS``, a superblock flag: every mount namespace sees it,
the server's too) by a remount, live: the storage coordinator turns it on
while the cluster's writes must be charged to its NFS server (a write then
reaches the disk in the writer's own context) and off when nothing competes.
It needs no undo of its own: the file system is unmounted by the backing's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path

from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host import layer
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.probe import read_mounts

MODE = 0o1777  # the shared directory's root: everyone's, sticky
MS_SYNCHRONOUS, MS_REMOUNT = 16, 32  # <linux/mount.h>
WRITER = "trusted.hpvc.writer"  # the image file's: "host" or "guest", who last wrote it
HOST, GUEST = "host", "guest"
MKFS_OPTS = ("-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard")


def image_of(path: Path) -> Path:
    """The image file of the file system mounted at ``path``: beside it."""
    return path.with_name(path.name + ".img")


def _e2fs(tool: str) -> str:
    found = shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if found is None:
        raise MissingDependency("NFS backing", f"{tool} not found", "apt-get install e2fsprogs")
    return found


def _run(argv: list[str]) -> None:
    """Run an e2fsprogs tool; its error (debugfs says it on stderr, with status 0)."""
    done = subprocess.run(argv, capture_output=True, text=True)
    name = os.path.basename(argv[0])
    said = [x for x in done.stderr.splitlines() if x.strip() and not x.startswith("debugfs ")]
    if done.returncode != 0 or (name == "debugfs" and said):
        why = said or done.stdout.strip().splitlines()
        raise HpvcError("NFS backing", f"{name}: {why[-1] if why else done.returncode}")


def _mkfs(image: Path, size_mib: int, *, root_mode: int | None = None) -> None:
    mkfs = _e2fs("mkfs.ext4")
    tmp = image.with_name(f".{image.name}.tmp-{os.getpid()}")  # a crash leaves no half image
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.truncate(size_mib * layer.MiB)
        _run([mkfs, *MKFS_OPTS, str(tmp)])
        if root_mode is not None:  # set in the unmounted file system
            _run([_e2fs("debugfs"), "-w", "-R", f"sif / mode 04{root_mode:04o}", str(tmp)])
        os.rename(tmp, image)
    finally:
        tmp.unlink(missing_ok=True)


def writer(image: Path) -> str | None:
    """Who last wrote ``image``: "host", "guest", or None when it is not recorded."""
    try:
        return os.getxattr(image, WRITER).decode(errors="replace")
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
            return None
        raise


def mark(image: Path, who: str) -> None:
    """Record ``who`` ("host" or "guest") as the last writer of ``image``. A guest
    mark that cannot be set must at least leave no "host" behind: that is
    removed, or the image is not handed on."""
    try:
        os.setxattr(image, WRITER, who.encode())
        return
    except OSError as e:
        if who == HOST:
            return  # unrecorded reads as not the host's: the safe side
        why = e.strerror
    with contextlib.suppress(OSError):
        os.removexattr(image, WRITER)
    if writer(image) is not None:
        raise HpvcError(f"NFS backing {image}", f"cannot mark it written by a VM guest: {why}")


def check_host_may_mount(image: Path) -> None:
    """InputError unless the host made ``image`` and no guest wrote it since."""
    who = writer(image)
    if who == HOST:
        return
    said = "last written by a VM guest" if who == GUEST else "of an unrecorded writer"
    raise InputError(
        f"shared image {image}",
        f"is {said}, and the host kernel does not mount a file system a guest may have written",
        "use it from a VM cluster of this name (backend qemu), or give this cluster "
        "another name or keep = false",
    )


def _mount(image: Path, path: Path) -> None:
    backing_fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        fd, dev = layer._attach(backing_fd)
    finally:
        os.close(backing_fd)
    try:  # closing ``fd`` frees the device unless the mount holds it (autoclear)
        if layer._libc.mount(dev.encode(), str(path).encode(), b"ext4", 0, layer.MOUNT_OPTS) != 0:
            raise HpvcError("NFS backing", str(layer._os_error(f"mount {dev} on {path}")))
    finally:
        os.close(fd)


def _mount_entry(path: Path) -> tuple[str, tuple[str, ...]] | None:
    """(file system type, options) of the top mount at ``path``, as /proc/mounts shows
    them (its options include the superblock's ``sync``)."""
    want = os.path.realpath(path)
    found = [m for m in read_mounts() if m.target == want]
    return (found[-1].fstype, found[-1].options) if found else None


def is_sync(path: Path) -> bool | None:
    """Does the file system mounted at ``path`` write synchronously? None: no mount there."""
    entry = _mount_entry(path)
    return None if entry is None else "sync" in entry[1]


def set_sync(path: Path, on: bool) -> bool:
    """Make the loop file system at ``path`` write synchronously (``on``) or
    buffered, by a remount; True when that changed anything."""
    entry = _mount_entry(path)
    if entry is None or entry[0] != "ext4":
        raise HpvcError(f"NFS backing {path}", "no ext4 file system of hpvc's mounted there")
    if ("sync" in entry[1]) == on:
        return False
    flags = MS_REMOUNT | (MS_SYNCHRONOUS if on else 0)  # the same options it was mounted with
    if layer._libc.mount(None, str(path).encode(), None, flags, layer.MOUNT_OPTS) != 0:
        raise HpvcError("NFS backing", str(layer._os_error(f"remount {path}")))
    return True


def backing(journal: Journal, *, path: Path, size_mib: int | None, keep: bool) -> Path:
    """The directory to export, at ``path``: plain when ``size_mib`` is None,
    else an ext4 file system of ``size_mib`` MiB mounted there. Data kept by an
    earlier call with ``keep`` is used as it is. Returns ``path``.

    The undo removes only what this call made: a directory or image that was
    there before it is some earlier call's (or a person's) data, and stays."""
    path = Path(os.path.abspath(path))
    if size_mib is not None and size_mib < 16:
        raise HpvcError(
            f"NFS backing {path}", f"{size_mib} MiB is too small", "give 16 MiB or more"
        )
    image = None if size_mib is None else image_of(path)
    made_dir = not path.exists()
    made_image = image is not None and not image.exists()
    if image is not None and not made_image and not os.path.ismount(path):
        check_host_may_mount(image)  # before anything is made
    journal.record(
        "nfs-backing",
        path=str(path),
        image=None if image is None else str(image),
        keep=keep,
        made_dir=made_dir,
        made_image=made_image,
    )
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)  # opened below, once it is what it will be
    if image is not None:
        if made_image:
            _mkfs(image, size_mib or 0)
            mark(image, HOST)
        if not os.path.ismount(path):
            _mount(image, path)
    if made_image or (image is None and made_dir):
        os.chmod(path, MODE)
    return path


def disk_image(journal: Journal, *, image: Path, size_mib: int, keep: bool) -> Path:
    """An ext4 file system of ``size_mib`` MiB in the image file ``image``, not
    mounted here (a VM gets it as a disk). An image kept by an earlier call is
    used as it is. Returns ``image``; the undo removes it only if this call made
    it and not ``keep``."""
    image = Path(os.path.abspath(image))
    if size_mib < 16:
        raise HpvcError(
            f"NFS backing {image}", f"{size_mib} MiB is too small", "give 16 MiB or more"
        )
    made = not image.exists()
    journal.record("nfs-image", image=str(image), keep=keep, made_image=made)
    if made:
        _mkfs(image, size_mib, root_mode=MODE)
    mark(image, GUEST)  # from now on its bytes are a guest's
    return image


@undoer("nfs-image", what=lambda a: f"NFS backing {a['image']}")
def _undo_disk_image(args: Args) -> None:
    if args.get("made_image") and not args.get("keep"):
        Path(args["image"]).unlink(missing_ok=True)


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        raise HpvcError(f"NFS backing {path}", "is not a directory: left as it is")
    shutil.rmtree(path)


@undoer("nfs-backing", what=lambda a: f"NFS backing {a['path']}")
def _undo_backing(args: Args) -> None:
    path, keep = Path(args["path"]), bool(args["keep"])
    image = Path(args["image"]) if args.get("image") else None
    if image is not None:
        try:
            layer.unmount_layer(str(path))  # lazily when still busy; the loop device follows
        except OSError as e:
            raise HpvcError(f"NFS backing {path}", f"unmount: {e.strerror}") from e
        if not keep and args.get("made_image"):
            image.unlink(missing_ok=True)
    if keep or not args.get("made_dir") or not path.exists():
        return
    if image is not None:
        path.rmdir()  # the mount point, empty once unmounted
    else:
        _remove_tree(path)

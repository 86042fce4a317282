"""The VM guest boot chain: kernel, initramfs, base disk, per-node disks, command line.

``build_guest(image)`` gives what QEMU boots (``GuestArtifacts``): Debian's cloud
kernel, an initramfs whose ``/init`` loads the virtio modules and switches to the
root disk (and a second one that loads the NFS client's modules too, for
clusters whose shared directory is NFS), and a base ext4 disk of the image's
rootfs with ``/sbin/hpvc-init`` (``native/guest/init.c``) as PID 1 and
``/usr/local/sbin/hpvc-shm`` (``native/guest/shmtool.c``), and, where the image's
UCX is the one it is built for, the UCX transport over the ivshmem region
(``hpvc.image.ucx``: ``libuct_ivshmem.so`` in ``/usr/local/lib/hpvc/ucx``). Built
artifacts are cached by (image digest, kernel release, module lists, init.c,
shmtool.c, native/ucx and their Makefiles, builder format)::

    <store>/guest/<kver>/                       the kernel (hpvc.image.guest_kernel)
    <store>/guest/<kver>/builds/<key>/          initrd.img, initrd-nfs.img, disk.raw
                                                (read-only), hpvc-init, hpvc-shm, guest.json
    <store>/guest/<kver>/builds/<key>.tmp-<pid> a build in progress, renamed when done

Each node boots from its own ``node_disk`` (a raw copy or a qcow2 overlay of
the base) with ``kernel_cmdline(name, ip, mtu, pubkey)``. hpvc-init prints
``hpvc-ready <name>`` on the serial console once sshd accepts connections (an
image without sshd: once the agent listens), or
``hpvc-failed <name>`` after ``hpvc-init: ...`` lines saying what went wrong.
QEMU should run with ``-no-reboot``: the command line has ``panic=-1``, so a
guest that cannot boot ends QEMU instead of hanging.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.image import guest_kernel, ucx
from hpvc.image.builder import _sigterm_interrupts as sigterm_interrupts
from hpvc.image.catalog import StoreArg, as_store
from hpvc.image.guest_disk import DISK_MODES, DiskMode, make_base_disk, node_disk
from hpvc.image.guest_initramfs import pack_initramfs
from hpvc.image.guest_kernel import BIND_MODULES, MODULES, NFS_MODULES, Kernel
from hpvc.image.model import Image
from hpvc.locks import file_lock
from hpvc.progress import Progress, quiet

__all__ = [
    "CMDLINE_MAX",
    "DISK_MODES",
    "DiskMode",
    "GuestArtifacts",
    "build_guest",
    "cache_key",
    "kernel_cmdline",
    "node_disk",
    "peers_text",
]

# Bump when the builder changes what ends up in a guest artifact.
GUEST_FORMAT = 2  # 2: mount points an imported image lacks (guest_disk.MOUNT_POINTS)
CMDLINE_MAX = 2048  # the kernel's COMMAND_LINE_SIZE on x86, including the final NUL
NATIVE_DIR = Path(__file__).resolve().parents[3] / "native" / "guest"
if not NATIVE_DIR.is_dir():  # an installed copy (scripts/slurm/install.sh puts them here)
    NATIVE_DIR = Path(sys.prefix) / "share" / "hpvc" / "native" / "guest"
# no_timer_check: without it 1 of 16 concurrent TCG boots panicked (HOST-NOTES).
# panic=-1 with QEMU's -no-reboot: a guest that cannot boot ends QEMU at once.
# ipv6.disable=1: hpvc networks are IPv4 only; no RS/DAD/MLD traffic on the bridge.
BASE_CMDLINE = (
    "console=ttyS0",
    "root=/dev/vda",
    "rw",
    "no_timer_check",
    "panic=-1",
    "ipv6.disable=1",
)
_HOSTNAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_PUBKEY = re.compile(r"(ssh|ecdsa|sk)-[a-z0-9@.-]+ [A-Za-z0-9+/]+=*( [ -~]*)?")
_TOOLS = {"make": "make", "gcc": "gcc", "cpio": "cpio", "mkfs.ext4": "e2fsprogs"}


class CmdlineError(InputError, ValueError):
    """A kernel command line that cannot be built (bad value, or too long)."""


@dataclass(frozen=True)
class GuestArtifacts:
    """What QEMU needs to boot a node of an image: ``-kernel``, ``-initrd``, the base disk."""

    kernel: Path
    initrd: Path
    disk: Path
    kernel_version: str
    key: str = ""
    initrd_nfs: Path | None = None  # ``initrd`` plus the NFS client's modules
    reused: bool = field(default=False, compare=False)


def kernel_cmdline(
    name: str,
    ip_cidr: str | None = None,
    mtu: int | None = None,
    pubkey: str | None = None,
    peers: str | None = None,
    binds: tuple[tuple[str, str], ...] = (),
) -> str:
    """The guest's kernel command line; CmdlineError (a ValueError) if invalid or too long.

    ``ip_cidr`` (``10.88.0.3/24``) configures eth0, ``mtu`` its MTU; ``pubkey``
    (one ``authorized_keys`` line) goes to root's authorized_keys, base64-encoded
    so that its comment may hold spaces; ``peers`` (``peers_text``: the
    cluster's name, then ``IP MAC NAME`` per node) becomes /etc/hosts and the
    ARP table before the guest is ready; ``binds`` (virtiofs tag, guest path)
    are mounted by hpvc-init before it is ready (``hpvc.binds=``). A line of 2048
    bytes or more is refused.
    """
    words = [*BASE_CMDLINE, f"hpvc.name={_hostname(name)}"]
    if ip_cidr is not None:
        words.append(f"hpvc.ip={_interface(ip_cidr)}")
    if mtu is not None:
        if not 68 <= mtu <= 65535:
            raise CmdlineError(f"guest MTU {mtu}", "out of range", "use 68 to 65535, e.g. 9000")
        words.append(f"hpvc.mtu={mtu}")
    if pubkey is not None:
        words.append(f"hpvc.key={_encode_key(pubkey)}")
    if peers is not None:
        words.append(f"hpvc.peers={base64.b64encode(peers.encode()).decode()}")
    if binds:
        words.append(f"hpvc.binds={_encode_binds(binds)}")
    line = " ".join(words)
    if len(line.encode()) >= CMDLINE_MAX:
        raise CmdlineError(
            "guest kernel command line",
            f"{len(line.encode())} bytes, the kernel takes fewer than {CMDLINE_MAX}",
            "use a shorter ssh key (ed25519)",
        )
    return line


def peers_text(cluster: str, nodes: list[tuple[str, str, str]]) -> str:
    """What hpvc-init makes /etc/hosts and the ARP table of: ``cluster``, then
    ``IP MAC NAME`` for each node, a line each."""
    return cluster + "\n" + "".join(f"{ip} {mac} {_hostname(n)}\n" for ip, mac, n in nodes)


def _hostname(name: str) -> str:
    if not _HOSTNAME.fullmatch(name):
        raise CmdlineError(
            f"guest name {name!r}", "not a host name", "use a-z, 0-9 and '-', up to 63 characters"
        )
    return name


def _interface(ip_cidr: str) -> str:
    try:
        iface = ipaddress.IPv4Interface(ip_cidr)
    except ValueError as e:
        raise CmdlineError(f"guest address {ip_cidr!r}", str(e), "e.g. 10.88.0.3/24") from None
    if "/" not in ip_cidr:
        raise CmdlineError(f"guest address {ip_cidr!r}", "no prefix length", "e.g. 10.88.0.3/24")
    return iface.with_prefixlen


_TAG = re.compile(r"[A-Za-z0-9_-]{1,36}")


def _encode_binds(binds: tuple[tuple[str, str], ...]) -> str:
    """``TAG PATH`` lines, base64: a tag is a short word, a path absolute, in one line."""
    for tag, path in binds:
        if not _TAG.fullmatch(tag):
            raise CmdlineError(f"virtiofs tag {tag!r}", "not a short word", "e.g. hpvcfs0")
        if not path.startswith("/") or any(c in path for c in "\n\0"):
            raise CmdlineError(f"guest path {path!r}", "not an absolute path", "e.g. /home")
    text = "".join(f"{tag} {path}\n" for tag, path in binds)
    return base64.b64encode(text.encode()).decode()


def _encode_key(pubkey: str) -> str:
    line = pubkey.strip()
    if not _PUBKEY.fullmatch(line):
        raise CmdlineError(
            "guest ssh key", "not one OpenSSH public key line", "pass the content of id_*.pub"
        )
    return base64.b64encode(line.encode()).decode()


def init_sources() -> dict[str, str]:
    """sha256 of each file that decides the guest binaries (init.c, shmtool.c, the
    agent's sources in native/agent, and the Makefiles of both)."""
    if not (NATIVE_DIR / "init.c").is_file():
        raise HpvcError(
            "guest build",
            f"{NATIVE_DIR / 'init.c'} not found",
            "run hpvc from its source checkout (pip install -e .)",
        )
    names = ("init.c", "shmtool.c", "Makefile")
    agent = NATIVE_DIR.parent / "agent"
    return {
        **{name: hashlib.sha256((NATIVE_DIR / name).read_bytes()).hexdigest() for name in names},
        **{
            f"agent/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted([*agent.glob("*.[ch]"), agent / "Makefile"])
        },
        # the UCX transport over the ivshmem region (hpvc.image.ucx)
        **{
            f"ucx/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
            for p in ucx.module_sources()
        },
    }


def cache_key(image_digest: str, kernel_version: str, sources: dict[str, str]) -> str:
    """The build directory name: sha256 of everything that decides the artifacts."""
    doc = {
        "format": GUEST_FORMAT,
        "image": image_digest,
        "kernel": kernel_version,
        "modules": list(MODULES),
        "nfs_modules": list(NFS_MODULES),
        "bind_modules": list(BIND_MODULES),
        "init": dict(sorted(sources.items())),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _check_tools() -> None:
    for tool, package in _TOOLS.items():
        if shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"])):
            continue
        raise MissingDependency("guest build", f"{tool} not found", f"apt-get install {package}")


def compile_init(dest_dir: Path) -> Path:
    """``make -C native/guest OUT=dest_dir``: the static hpvc-init (and hpvc-shm) binaries."""
    done = subprocess.run(
        ["make", "-s", "-C", str(NATIVE_DIR), f"OUT={dest_dir}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise HpvcError(
            "compile hpvc-init",
            " / ".join(tail) or f"make exited {done.returncode}",
            "apt-get install gcc make libc6-dev",
        )
    return dest_dir / "hpvc-init"


@dataclass(frozen=True)
class _Build:
    image: Image
    kernel: Kernel
    key: str
    final: Path
    progress: Progress


def _artifacts(build: _Build, reused: bool) -> GuestArtifacts:
    return GuestArtifacts(
        kernel=build.kernel.vmlinuz,
        initrd=build.final / "initrd.img",
        disk=build.final / "disk.raw",
        kernel_version=build.kernel.version,
        key=build.key,
        initrd_nfs=build.final / "initrd-nfs.img",
        reused=reused,
    )


def _populate(build: _Build, tmp: Path) -> None:
    started = time.monotonic()
    build.progress("compiling hpvc-init")
    init = compile_init(tmp)
    build.progress("packing the initramfs")
    binds = build.kernel.bind_modules  # loaded only for hpvc.binds= (virtiofs)
    pack_initramfs(init, build.kernel.modules, tmp / "initrd.img", tmp, binds)
    pack_initramfs(init, build.kernel.nfs_modules, tmp / "initrd-nfs.img", tmp, binds)
    build.progress(f"making the base disk of image {build.image.name} (mkfs.ext4 -d)")
    shm_tool = init.with_name("hpvc-shm")
    rsh_tool = init.with_name("hpvc-rsh")
    module, ucx_why = _ucx_module(build, tmp)
    size = make_base_disk(
        build.image.rootfs, init, tmp / "disk.raw", tmp, shm_tool, rsh_tool, module
    )
    os.chmod(tmp / "disk.raw", 0o444)
    doc = {
        "key": build.key,
        "image": build.image.digest,
        "kernel": build.kernel.version,
        "modules": list(MODULES),
        "nfs_modules": list(NFS_MODULES),
        "bind_modules": list(BIND_MODULES),
        "disk_bytes": size,
        "ucx_module": {"installed": module is not None, "why": ucx_why},
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "build_seconds": round(time.monotonic() - started, 3),
    }
    (tmp / "guest.json").write_text(json.dumps(doc, indent=2) + "\n")


def _ucx_module(build: _Build, tmp: Path) -> tuple[Path | None, str]:
    """The UCX transport module for the image's guests, or None and why not
    (``hpvc.image.ucx``: only for the UCX it is built against). A module that
    fails to build leaves the guests without it, said in progress and guest.json:
    their MPI then goes over TCP, as before the module."""
    found = ucx.verdict(build.image.rootfs)
    if not found.ok:
        build.progress(f"no UCX ivshmem module in the guests: {found.why}")
        return None, found.why
    build.progress(f"building {ucx.MODULE} for UCX {ucx.MODULE_UCX}")
    try:
        return ucx.compile_module(tmp), ""
    except HpvcError as e:
        build.progress(f"no UCX ivshmem module in the guests: {e}")
        return None, str(e)


def _build_locked(build: _Build) -> GuestArtifacts:
    if (build.final / "guest.json").is_file():
        return _artifacts(build, reused=True)
    for leftover in build.final.parent.glob(f"{build.key}.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)  # we hold the lock: all stale
    tmp = build.final.with_name(f"{build.key}.tmp-{os.getpid()}")
    tmp.mkdir()
    try:
        _populate(build, tmp)
        if build.final.exists():  # incomplete: no guest.json
            shutil.rmtree(build.final)
        os.rename(tmp, build.final)
    except BaseException:
        build.progress("removing the unfinished guest build")
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _artifacts(build, reused=False)


def build_guest(
    image: Image,
    *,
    store: StoreArg = None,
    kernel_version: str | None = None,
    progress: Progress = quiet,
) -> GuestArtifacts:
    """Build (or reuse) the kernel, initramfs and base disk that boot ``image`` as a VM.

    ``kernel_version`` None means what ``linux-image-cloud-amd64`` depends on now
    (``apt-cache``), or the newest kernel already fetched when apt does not know.
    A build runs in a temporary directory under a lock and is renamed into place
    when complete; a failure leaves nothing behind.
    """
    guest_dir = as_store(store).root / "guest"
    kver = guest_kernel.check_version(kernel_version or guest_kernel.resolve_version(guest_dir))
    key = cache_key(image.digest, kver, init_sources())
    final = guest_dir / kver / "builds" / key
    kernel = Kernel(kver, guest_dir / kver)
    build = _Build(image, kernel, key, final, progress)
    if kernel.is_complete() and (final / "guest.json").is_file():
        return _artifacts(build, reused=True)
    _check_tools()
    with sigterm_interrupts():  # so that a SIGTERM still removes the temporary directory
        guest_kernel.ensure_kernel(guest_dir, kver, progress)
        final.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(final.parent / f"{key}.lock"):
            return _build_locked(build)

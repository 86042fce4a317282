"""The guest kernel: Debian's ``linux-image-*-cloud-amd64``, fetched once per version.

``ensure_kernel`` downloads the package with ``apt-get download`` (no host
install), unpacks it with ``dpkg-deb -x`` and keeps only what a guest needs::

    <store>/guest/<kver>/vmlinuz
    <store>/guest/<kver>/config
    <store>/guest/<kver>/modules/<name>.ko     the virtio and NFS modules, uncompressed
    <store>/guest/<kver>/kernel.json           package, version, module order

ext4 is built into that kernel; the virtio drivers are modules, loaded by the
initramfs in ``MODULES`` order (each after the modules it depends on, which is
checked against the modules' own ``depends=``). The NFS client is modules too
(``NFS_MODULES``): only the NFS initramfs loads them, after the virtio ones,
for clusters whose shared directory is served over NFS (under TCG they cost
about 0.8 s of boot; docs/vms.md). virtiofs (``BIND_MODULES``) is in every
initramfs but loaded only when the command line asks for host folders. A
kernel fetched by an hpvc that kept fewer modules is completed in place (its
guest builds stay). Compressed modules (``.ko.xz``, ``.ko.gz``, ``.ko.zst``)
are decompressed here, so the initramfs never needs the
kernel's in-kernel decompression (``MODULE_INIT_COMPRESSED_FILE``).
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpvc.errors import HpvcError, MissingDependency
from hpvc.locks import file_lock
from hpvc.progress import Progress

META_PACKAGE = "linux-image-cloud-amd64"
APT_LISTS = Path("/var/lib/apt/lists")
# Load order: each module after everything in its depends= (checked at fetch time).
MODULES: tuple[str, ...] = (
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_blk",
    "failover",
    "net_failover",
    "virtio_net",
    # /sys/firmware/qemu_fw_cfg: where hpvc-init reads the agent's key (no deps)
    "qemu_fw_cfg",
)
# The NFSv3 client over TCP, in load order (what ``mount -t nfs -o vers=3`` needs;
# ``nfs`` asks for ``nfsv3`` on its own only where modprobe works: not in a guest).
NFS_MODULES: tuple[str, ...] = (
    "sunrpc",
    "grace",
    "lockd",
    "nfs_acl",
    "netfs",
    "fscache",
    "nfs",
    "nfsv3",
)
# virtiofs (the FUSE core, then its virtio transport): loaded only by a guest
# whose command line names host folders to mount (``hpvc.binds=``: a Slurm
# site's binds, served by virtiofsd as the job's user, hpvc.host.virtiofsd).
BIND_MODULES: tuple[str, ...] = ("fuse", "virtiofs")
ALL_MODULES = MODULES + NFS_MODULES + BIND_MODULES  # what a fetched kernel keeps
_KVER = re.compile(r"[0-9][0-9A-Za-z.+~-]*-cloud-amd64")
_DEPENDS = re.compile(r"^\s*\|?(?:Pre)?Depends:\s*linux-image-(\S+-cloud-amd64)\s*$", re.M)
_MODINFO_DEPENDS = re.compile(rb"(?:^|\0)depends=([^\0]*)\0")
_SUFFIXES = (".ko", ".ko.xz", ".ko.gz", ".ko.zst")


@dataclass(frozen=True)
class Kernel:
    """A fetched kernel: its version, image, and modules in load order."""

    version: str
    path: Path

    @property
    def vmlinuz(self) -> Path:
        return self.path / "vmlinuz"

    @property
    def modules(self) -> tuple[Path, ...]:
        return tuple(self.path / "modules" / f"{name}.ko" for name in MODULES)

    @property
    def nfs_modules(self) -> tuple[Path, ...]:
        """The virtio modules, then the NFS client's: the NFS initramfs's load order."""
        return tuple(self.path / "modules" / f"{name}.ko" for name in MODULES + NFS_MODULES)

    @property
    def bind_modules(self) -> tuple[Path, ...]:
        """virtiofs's modules, which the initramfs loads only for ``hpvc.binds=``."""
        return tuple(self.path / "modules" / f"{name}.ko" for name in BIND_MODULES)

    def is_complete(self) -> bool:
        """Fetched, with every module this hpvc loads."""
        try:
            kept = json.loads((self.path / "kernel.json").read_text()).get("modules", [])
        except (OSError, ValueError, AttributeError):
            return False
        return set(ALL_MODULES) <= set(kept)


def check_version(kver: str) -> str:
    """``kver`` if it looks like a cloud kernel's release (``6.1.0-56-cloud-amd64``)."""
    if not _KVER.fullmatch(kver):
        raise HpvcError(
            f"guest kernel {kver!r}", "not a cloud kernel release", "e.g. 6.1.0-56-cloud-amd64"
        )
    return kver


def parse_apt_depends(text: str) -> str | None:
    """The kernel release that ``apt-cache depends linux-image-cloud-amd64`` names."""
    found = _DEPENDS.findall(text)
    return str(found[0]) if found else None


def modinfo_depends(blob: bytes) -> tuple[str, ...]:
    """The ``depends=`` list of a module's .modinfo section (module names, '-' as '_')."""
    match = _MODINFO_DEPENDS.search(blob)
    if match is None or not match.group(1):
        return ()
    return tuple(d.replace("-", "_") for d in match.group(1).decode().split(",") if d)


def check_order(depends: dict[str, tuple[str, ...]], order: Sequence[str]) -> None:
    """Every module comes after the modules it depends on; HpvcError names the first miss."""
    loaded: set[str] = set()
    for name in order:
        missing = [d for d in depends.get(name, ()) if d not in loaded]
        if missing:
            raise HpvcError(
                f"guest kernel module {name}",
                f"depends on {', '.join(missing)}, not loaded before it",
                "fix hpvc.image.guest_kernel.MODULES",
            )
        loaded.add(name)


def _run(argv: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise MissingDependency(what, f"{argv[0]} not found", "apt-get install apt dpkg") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise HpvcError(what, f"{' '.join(argv[:2])} failed: {' / '.join(tail)}")
    return done.stdout


def cached_versions(guest_dir: Path) -> list[str]:
    """Kernel releases already fetched under ``guest_dir``, newest (by mtime) first."""
    if not guest_dir.is_dir():
        return []
    found = [
        k
        for k in guest_dir.iterdir()
        if _KVER.fullmatch(k.name) and Kernel(k.name, k).is_complete()
    ]
    return [k.name for k in sorted(found, key=lambda k: k.stat().st_mtime, reverse=True)]


def _apt_candidate() -> str | None:
    try:
        return parse_apt_depends(_run(["apt-cache", "depends", META_PACKAGE], "guest kernel"))
    except HpvcError:
        return None


def resolve_version(guest_dir: Path, apt_lists: Path = APT_LISTS) -> str:
    """The release ``linux-image-cloud-amd64`` depends on now; else the newest one fetched.

    ``apt-cache`` takes about a second, so its answer is remembered in
    ``guest_dir/resolved.json`` until apt's package lists change (their mtime).
    """
    memo = guest_dir / "resolved.json"
    try:
        stamp = apt_lists.stat().st_mtime_ns
    except OSError:
        stamp = -1
    try:
        doc = json.loads(memo.read_text())
        if doc.get("apt_lists_mtime_ns") == stamp and stamp >= 0:
            return check_version(str(doc["version"]))
    except (OSError, ValueError, KeyError, HpvcError):
        pass
    kver = _apt_candidate()
    if kver is not None:
        _remember(memo, check_version(kver), stamp)
        return kver
    cached = cached_versions(guest_dir)
    if cached:
        return cached[0]
    raise MissingDependency(
        "guest kernel",
        f"apt does not know {META_PACKAGE} and none is cached",
        "run apt-get update",
    )


def _remember(memo: Path, kver: str, stamp: int) -> None:
    """Best effort: a store we cannot write just means asking apt again next time."""
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"version": kver, "apt_lists_mtime_ns": stamp}) + "\n")
        os.rename(tmp, memo)
    except OSError:
        pass


def _find_module(tree: Path, name: str) -> Path:
    for suffix in _SUFFIXES:
        for candidate in (name, name.replace("_", "-")):
            hits = sorted(tree.rglob(candidate + suffix))
            if hits:
                return hits[0]
    raise HpvcError(f"guest kernel module {name}", f"not found under {tree}")


def decompress(path: Path) -> bytes:
    """A module's bytes, decompressed when it ends in .xz, .gz or .zst."""
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    if path.name.endswith(".zst"):
        if shutil.which("zstd") is None:
            raise MissingDependency(f"module {path.name}", "zstd not found", "apt-get install zstd")
        return _zstd(path)
    return data


def _zstd(path: Path) -> bytes:
    done = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        raise HpvcError(f"module {path.name}", done.stderr.decode(errors="replace").strip())
    return done.stdout


def _unpack(kver: str, tmp: Path) -> tuple[Path, str]:
    """Download and unpack ``linux-image-<kver>``; return the tree and the package version."""
    debs = tmp / "deb"
    debs.mkdir()
    package = f"linux-image-{kver}"
    _run(["apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", package], package, debs)
    deb = next(iter(sorted(debs.glob("*.deb"))), None)
    if deb is None:
        raise HpvcError(package, "apt-get download left no .deb")
    tree = tmp / "tree"
    _run(["dpkg-deb", "-x", str(deb), str(tree)], package)
    version = _run(["dpkg-deb", "-f", str(deb), "Version"], package).strip()
    return tree, version


def _keep(kver: str, tree: Path, dest: Path) -> dict[str, tuple[str, ...]]:
    """Copy vmlinuz, config and the modules (uncompressed) into ``dest``; their depends."""
    shutil.copyfile(tree / "boot" / f"vmlinuz-{kver}", dest / "vmlinuz")
    shutil.copyfile(tree / "boot" / f"config-{kver}", dest / "config")
    (dest / "modules").mkdir()
    depends = {}
    for name in ALL_MODULES:
        data = decompress(_find_module(tree / "lib" / "modules" / kver, name))
        (dest / "modules" / f"{name}.ko").write_bytes(data)
        depends[name] = modinfo_depends(data)
    return depends


def _fetch(kver: str, guest_dir: Path, progress: Progress) -> None:
    for leftover in guest_dir.glob(f"{kver}.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)  # we hold the lock: all stale
    tmp = guest_dir / f"{kver}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        progress(f"fetching linux-image-{kver}")
        tree, version = _unpack(kver, tmp)
        depends = _keep(kver, tree, tmp)
        check_order(depends, ALL_MODULES)
        shutil.rmtree(tmp / "deb")
        shutil.rmtree(tree)
        doc = {
            "version": kver,
            "package": f"linux-image-{kver}",
            "package_version": version,
            "modules": list(ALL_MODULES),
        }
        (tmp / "kernel.json").write_text(json.dumps(doc, indent=2) + "\n")
        final = guest_dir / kver
        if (final / "kernel.json").is_file():  # fetched with fewer modules: complete it
            _complete(tmp, final)
            shutil.rmtree(tmp)
            return
        if final.exists():  # a leftover without kernel.json
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _complete(fresh: Path, final: Path) -> None:
    """Put the modules and kernel.json of ``fresh`` into the kernel ``final`` that an
    older hpvc fetched, each file replaced at once; its guest builds stay."""
    (final / "modules").mkdir(exist_ok=True)
    for module in sorted((fresh / "modules").iterdir()):
        os.replace(module, final / "modules" / module.name)
    os.replace(fresh / "kernel.json", final / "kernel.json")  # last: now complete


def ensure_kernel(guest_dir: Path, kver: str, progress: Progress) -> Kernel:
    """The kernel ``kver`` under ``guest_dir``, fetched first if needed (locked, atomic)."""
    kernel = Kernel(check_version(kver), guest_dir / kver)
    if kernel.is_complete():
        return kernel
    guest_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(guest_dir / f"{kver}.lock"):
        if not kernel.is_complete():
            _fetch(kver, guest_dir, progress)
    return kernel

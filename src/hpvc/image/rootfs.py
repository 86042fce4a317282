"""Finishing a fresh rootfs: drop apt caches, stamp the digest, make /etc files real.

Every write here stays inside the rootfs: a symlink in the rootfs (``/etc/hosts
-> /run/...``, an absolute link) is removed, never followed, so the host's
files are never touched.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hpvc.errors import HpvcError

HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
# The host's resolv.conf, which debootstrap copies in, does not belong in a
# shared image; nodes get theirs bind-mounted over this placeholder.
RESOLV = "# hpvc: replaced by the node's resolver configuration at start\n"

# (directory inside the rootfs, entries to keep)
_APT_LEFTOVERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("var/lib/apt/lists", frozenset({"partial", "lock"})),
    ("var/cache/apt/archives", frozenset({"partial", "lock"})),
    ("var/cache/apt/archives/partial", frozenset()),
    ("var/cache/apt", frozenset({"archives"})),
)


def _real_dir(rootfs: Path, rel: str) -> Path | None:
    """``rootfs/rel`` if every component is a real directory (no symlink), else None."""
    path = rootfs
    for part in Path(rel).parts:
        path = path / part
        if path.is_symlink() or not path.is_dir():
            return None
    return path


def clean_apt(rootfs: Path) -> int:
    """Delete apt's package lists and downloaded archives; return the bytes freed."""
    freed = 0
    for rel, keep in _APT_LEFTOVERS:
        directory = _real_dir(rootfs, rel)
        if directory is None:
            continue
        for entry in directory.iterdir():
            if entry.name in keep:
                continue
            if entry.is_dir() and not entry.is_symlink():
                freed += tree_size(entry)
                shutil.rmtree(entry)
            else:
                freed += entry.lstat().st_size
                entry.unlink()
    return freed


def write_regular(rootfs: Path, rel: str, text: str, *, replace: bool = True) -> None:
    """Make ``rootfs/rel`` a regular file holding ``text`` (a symlink there is removed).

    With ``replace=False`` an existing regular file is left as it is.
    """
    parent = _real_dir(rootfs, str(Path(rel).parent))
    if parent is None:
        raise HpvcError(
            f"image rootfs {rootfs}",
            f"{Path(rel).parent} is not a directory",
            "rebuild with --force",
        )
    path = parent / Path(rel).name
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            raise HpvcError(f"image rootfs {rootfs}", f"/{rel} is a directory", "rebuild --force")
        if not replace and not path.is_symlink() and path.is_file():
            return
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def finish(rootfs: Path, digest: str) -> None:
    """Everything done to a rootfs after debootstrap, before it becomes an image."""
    clean_apt(rootfs)
    write_regular(rootfs, "etc/hpvc-image", digest + "\n")
    write_regular(rootfs, "etc/hosts", HOSTS, replace=False)
    write_regular(rootfs, "etc/resolv.conf", RESOLV)


def tree_size(path: Path) -> int:
    """Bytes on disk under ``path`` (like ``du -s``: hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            st = os.lstat(os.path.join(top, name))
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_blocks * 512
    return total + os.lstat(path).st_blocks * 512


def in_root(rootfs: Path, path: str) -> Path | None:
    """``path`` as the image would see it, symlinks resolved inside ``rootfs``
    (an absolute link is taken from the image's root, never the host's); None
    when it does not exist there."""
    parts = list(Path(path.lstrip("/")).parts)
    current = rootfs
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent if current != rootfs else rootfs
            continue
        nxt = current / part
        if nxt.is_symlink():
            hops += 1
            if hops > 40:
                return None
            target = os.readlink(nxt)
            parts = [*Path(target.lstrip("/")).parts, *parts]
            if target.startswith("/"):
                current = rootfs
            continue
        if not nxt.exists():
            return None
        current = nxt
    return current


# What a container node runs as its init (hpvc.backends.crun.container.INIT):
# a shell and sleep, nothing else of the image's userland.
NODE_SHELL = "/bin/sh"
NODE_COMMANDS = ("sleep",)


def missing_for_node(rootfs: Path, env: tuple[str, ...] = ()) -> list[str]:
    """What a container node needs that the image lacks: its shell, and each
    command on the image's PATH (its Env's, else the usual one)."""
    missing = [] if in_root(rootfs, NODE_SHELL) else [NODE_SHELL]
    path = next((kv[5:] for kv in env if kv.startswith("PATH=")), "")
    dirs = (path or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin").split(":")
    for cmd in NODE_COMMANDS:
        if not any(d and in_root(rootfs, f"{d}/{cmd}") for d in dirs):
            missing.append(cmd)
    return missing


def os_name(rootfs: Path) -> str:
    """The image's own ``PRETTY_NAME`` (``Debian GNU/Linux 11 (bullseye)``) from its
    os-release, read inside ``rootfs``; empty when it has none or it cannot be read."""
    try:
        found = (in_root(rootfs, rel) for rel in ("/etc/os-release", "/usr/lib/os-release"))
        path = next((p for p in found if p is not None and p.is_file()), None)
        text = "" if path is None else path.read_text(errors="replace")[:65536]
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PRETTY_NAME":
            return value.strip().strip("\"'")
    return ""

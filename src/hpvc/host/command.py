"""Running host commands (mount, umount, modprobe) with one-line errors."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.sysroot import RootLike, as_root

PACKAGE_OF = {"modprobe": "kmod", "mount": "mount", "umount": "mount"}


def host_run(argv: Sequence[str]) -> None:
    """Run ``argv``; raise HpvcError naming the command and its error."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        pkg = PACKAGE_OF.get(argv[0], argv[0])
        raise HpvcError(" ".join(argv), f"{argv[0]} not found", f"apt-get install {pkg}") from e
    if done.returncode != 0:
        raise HpvcError(" ".join(argv), done.stderr.strip() or f"exit status {done.returncode}")


def at(root: RootLike, abs_path: str) -> Path:
    """``abs_path`` inside ``root`` (a host path under an injectable root)."""
    return as_root(root).at(abs_path)

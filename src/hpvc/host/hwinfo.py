"""Hardware facts of a host, read-only: CPU model, last-level cache, a block device's queue.

What benchmark reports record about the machine the numbers came from (and what
sizes a benchmark's problem). Every reader takes an injectable ``root`` (``/``,
or a snapshot or fake tree in tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpvc.errors import HpvcError
from hpvc.host.blkio import read_text
from hpvc.host.command import at
from hpvc.sysroot import HOST, RootLike


def cpu_model(root: RootLike = HOST) -> str | None:
    """The first ``model name`` of /proc/cpuinfo; None when there is none."""
    for line in (read_text(at(root, "/proc/cpuinfo")) or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def cache_size_bytes(text: str) -> int:
    """A sysfs cache size (``32K``, ``32768K``, ``1M``) in bytes."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?)", text.strip())
    if not m:
        raise ValueError(f"not a cache size: {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def llc_bytes(root: RootLike = HOST) -> int:
    """Size of CPU 0's last-level data (or unified) cache, from sysfs."""
    base = at(root, "/sys/devices/system/cpu/cpu0/cache")
    best = (0, 0)
    for d in sorted(base.glob("index*")):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            level = int((d / "level").read_text())
            size = cache_size_bytes((d / "size").read_text())
        except (OSError, ValueError):
            continue
        best = max(best, (level, size))
    if best[1] == 0:
        raise HpvcError("last-level cache", f"no cache size under {base}", "")
    return best[1]


@dataclass(frozen=True)
class BlockQueue:
    """A block device as /sys/block shows it; None where a file is missing."""

    major_minor: str | None
    scheduler: str | None  # the active one
    rotational: str | None
    loop_direct_io: str | None  # loop devices only


def active_scheduler(schedulers: str | None) -> str | None:
    """``none mq-deadline [bfq]`` -> ``bfq``."""
    for word in (schedulers or "").split():
        if word.startswith("["):
            return word.strip("[]")
    return schedulers


def block_queue(name: str, root: RootLike = HOST) -> BlockQueue:
    """The device ``name`` (``loop3``, ``sda``) as the kernel shows it now."""
    sysfs = at(root, "/sys/block") / name
    return BlockQueue(
        major_minor=read_text(sysfs / "dev"),
        scheduler=active_scheduler(read_text(sysfs / "queue/scheduler")),
        rotational=read_text(sysfs / "queue/rotational"),
        loop_direct_io=read_text(sysfs / "loop/dio"),
    )

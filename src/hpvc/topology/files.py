"""Reading files under a root without ever leaving it: the one file reader of
``hpvc.topology`` (sysfs, procfs and cgroup files of a host or a snapshot).

Nothing here interprets a topology; it reads text, numbers and CPU lists, and
collects the notes a reader makes about what it had to assume.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

from hpvc.sysroot import SysRoot
from hpvc.units import format_cpulist, parse_cpulist


def parse_cpumask(text: str) -> list[int]:
    """Parse a sysfs CPU mask (comma-separated 32-bit hex words, highest first).

    >>> parse_cpumask("00000000,00000011")
    [0, 4]
    """
    words = [w.strip() for w in text.strip().split(",")]
    if not words or any(not w for w in words):
        raise ValueError(f"bad CPU mask {text!r}")
    cpus: list[int] = []
    for index, word in enumerate(reversed(words)):
        value = int(word, 16)
        cpus.extend(index * 32 + bit for bit in range(32) if value >> bit & 1)
    return cpus


class Reader:
    """Reads files under one root and collects what had to be assumed."""

    def __init__(self, root: SysRoot) -> None:
        self.root = root.path
        resolved = self.root.resolve()
        self._guard = None if resolved == Path("/") else resolved
        self.notes: list[str] = []
        self._grouped: dict[tuple[str, str], list[int]] = defaultdict(list)
        self._cpuinfo: dict[int, dict[str, str]] | None = None

    def path(self, rel: str) -> Path:
        return self.root / rel

    def _inside(self, p: Path) -> bool:
        """False for a path that links out of the root: never read the host by accident."""
        return self._guard is None or p.resolve().is_relative_to(self._guard)

    def text(self, rel: str) -> str | None:
        """Stripped content of ``root/rel``; None when absent, unreadable or outside root."""
        p = self.path(rel)
        try:
            if not self._inside(p):
                return None
            return p.read_text(errors="replace").replace("\0", "").strip()
        except (OSError, ValueError):
            return None

    def listdir(self, rel: str) -> list[str]:
        """Names in ``root/rel``; empty when absent or outside root."""
        p = self.path(rel)
        try:
            return os.listdir(p) if self._inside(p) else []
        except (OSError, ValueError):
            return []

    def integer(self, rel: str) -> int | None:
        text = self.text(rel)
        try:
            return int(text) if text is not None else None
        except ValueError:
            self.note(f"{rel}: {text!r} is not a number; ignored")
            return None

    def cpuset(self, rel: str) -> set[int] | None:
        """A CPU list file (``*list``, ``online``, ``present``) or hex mask file as a set."""
        text = self.text(rel)
        if text is None:
            return None
        name = rel.rsplit("/", 1)[-1]
        try:
            listed = name.endswith("list") or name in ("online", "present")
            return set(parse_cpulist(text) if listed else parse_cpumask(text))
        except ValueError:
            self.note(f"{rel}: cannot parse {text!r}; ignored")
            return None

    def entries(self, rel: str, pattern: re.Pattern[str]) -> list[int]:
        """Sorted numbers N of the folders under ``rel`` whose names match ``pattern``."""
        found = (pattern.match(n) for n in self.listdir(rel))
        return sorted(int(m.group(1)) for m in found if m and self.path(f"{rel}/{m[0]}").is_dir())

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def assume(self, reason: str, kind: str, item: int) -> None:
        """Record ``reason`` for one "CPU" or "node"; items with one reason share a note."""
        self._grouped[(reason, kind)].append(item)

    def all_notes(self) -> tuple[str, ...]:
        grouped = [
            f"{reason} ({kind}{'s' if len(items) > 1 else ''} {format_cpulist(items)})"
            for (reason, kind), items in self._grouped.items()
        ]
        return (*self.notes, *grouped)

    def cpuinfo(self, cpu: int, key: str) -> int | None:
        """A numeric field of ``cpu``'s block in /proc/cpuinfo, if any."""
        if self._cpuinfo is None:
            self._cpuinfo = _parse_cpuinfo(self.text("proc/cpuinfo") or "")
        value = self._cpuinfo.get(cpu, {}).get(key)
        return int(value) if value is not None and value.isdigit() else None


def _parse_cpuinfo(text: str) -> dict[int, dict[str, str]]:
    blocks: dict[int, dict[str, str]] = {}
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields.get("processor", "").isdigit():
            blocks[int(fields["processor"])] = fields
    return blocks

"""Parsing of the size and CPU-list notations users and sysfs write."""

from __future__ import annotations

import re

_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?)(B?)\s*(/s)?\s*", re.IGNORECASE)
_POW = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}


def parse_size(text: str | int) -> int:
    """Return a size in bytes.

    ``KiB/MiB/GiB`` and bare ``K/M/G`` are powers of 1024, ``KB/MB/GB`` powers
    of 1000, a bare number is bytes; a trailing ``/s`` (rates) is accepted.

    >>> parse_size("2GiB"), parse_size("50MB/s"), parse_size("1G"), parse_size(512)
    (2147483648, 50000000, 1073741824, 512)
    """
    if isinstance(text, bool):
        raise ValueError("a size must be a number or a string such as '2GiB'")
    if isinstance(text, int):
        if text < 0:
            raise ValueError("a size cannot be negative")
        return text
    m = _SIZE_RE.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (write e.g. '2GiB', '512MiB', '50MB')")
    number, prefix, binary, byte, _rate = m.groups()
    prefix = prefix.upper()
    if binary and not prefix:
        raise ValueError(f"{text!r} is not a size (write e.g. '2GiB', '512MiB', '50MB')")
    base = 1024 if (binary or not byte) else 1000
    value = float(number) * base ** _POW[prefix]
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def format_mib(mib: int) -> str:
    if mib % 1024 == 0 and mib >= 1024:
        return f"{mib // 1024}GiB"
    return f"{mib}MiB"


def parse_cpulist(text: str) -> list[int]:
    """Parse a Linux CPU list such as ``0-3,8,10-11`` (empty text: no CPUs).

    >>> parse_cpulist("0-3,8")
    [0, 1, 2, 3, 8]
    """
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            step = 1
            if ":" in hi_s:  # kernel's "0-15:2" stride form
                hi_s, step_s = hi_s.split(":", 1)
                step = int(step_s)
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo or step < 1:
                raise ValueError(f"bad CPU range {part!r} in {text!r}")
            cpus.update(range(lo, hi + 1, step))
        else:
            cpus.add(int(part))
    return sorted(cpus)


def format_cpulist(cpus: list[int] | tuple[int, ...] | set[int] | frozenset[int]) -> str:
    """Inverse of :func:`parse_cpulist`: ``[0,1,2,3,8]`` -> ``"0-3,8"``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)

"""libvirt domain XML and CPU maps as typed data: pure parsing for the read-back.

``hpvc.backends.libvirt.domain`` reads a live domain (its XML, ``numaParameters``,
CPU maps) and hands the pieces here; nothing in this module touches libvirt
or the host, so it is tested on XML strings alone.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any, TypedDict

_NUMA_MODES = ("strict", "preferred", "interleave", "restrictive")
_UNITS_KIB = {"b": 1 / 1024, "bytes": 1 / 1024, "k": 1, "kib": 1, "kb": 1000 / 1024}
_UNITS_KIB |= {"m": 1024, "mib": 1024, "mb": 1e6 / 1024, "g": 1 << 20, "gib": 1 << 20}


class MemNode(TypedDict):
    cellid: int
    mode: str
    nodeset: str


class NumaTune(TypedDict):
    mode: str  # strict, preferred, interleave, restrictive
    nodeset: str  # host NUMA nodes of the guest memory ("" when libvirt chooses)
    cells: list[MemNode]  # per guest cell, from <numatune><memnode>


class HugePages(TypedDict):
    size_kib: int  # 0: the host's default hugepage size
    nodeset: str  # guest NUMA cells backed by these pages ("" for all)


class MemoryBacking(TypedDict):
    """``<memoryBacking>`` of the live definition."""

    hugepages: list[HugePages]
    nosharepages: bool
    locked: bool
    source: str
    access: str
    allocation: str


def cpus_of(cpumap: Sequence[bool]) -> list[int]:
    """A libvirt CPU map (one bool per host CPU) as a list of CPU numbers."""
    return [i for i, on in enumerate(cpumap) if on]


def _size_kib(el: ET.Element) -> int:
    size = int(el.get("size", "0"))
    return int(size * _UNITS_KIB.get(el.get("unit", "KiB").lower(), 1))


def _attr(parent: ET.Element, tag: str, attr: str) -> str:
    el = parent.find(tag)
    return "" if el is None else el.get(attr, "")


def memory_backing(xml: str) -> MemoryBacking:
    """``<memoryBacking>`` of a domain XML, as typed data (all false/empty when absent)."""
    mb = ET.fromstring(xml).find("memoryBacking")
    if mb is None:
        mb = ET.Element("memoryBacking")
    pages: list[HugePages] = []
    huge = mb.find("hugepages")
    if huge is not None:
        given = huge.findall("page")
        pages = [HugePages(size_kib=_size_kib(p), nodeset=p.get("nodeset", "")) for p in given]
        pages = pages or [HugePages(size_kib=0, nodeset="")]
    return MemoryBacking(
        hugepages=pages,
        nosharepages=mb.find("nosharepages") is not None,
        locked=mb.find("locked") is not None,
        source=_attr(mb, "source", "type"),
        access=_attr(mb, "access", "mode"),
        allocation=_attr(mb, "allocation", "mode"),
    )


def numa_tune(params: dict[str, Any], xml: str) -> NumaTune:
    """``numaParameters()`` with the per-cell ``<memnode>`` bindings of the live XML."""
    mode = params.get("numa_mode", 0)
    known = isinstance(mode, int) and 0 <= mode < len(_NUMA_MODES)
    cells = [
        MemNode(
            cellid=int(m.get("cellid", "0")), mode=m.get("mode", ""), nodeset=m.get("nodeset", "")
        )
        for m in ET.fromstring(xml).findall("numatune/memnode")
    ]
    return NumaTune(
        mode=_NUMA_MODES[mode] if known else str(mode),
        nodeset=str(params.get("numa_nodeset", "")),
        cells=cells,
    )


_QEMU_NS = "{http://libvirt.org/schemas/domain/qemu/1.0}"


def _qemu_option(value: str, key: str) -> str | None:
    """``key=...`` of a QEMU option string (a doubled comma is a comma)."""
    parts: list[str] = [""]
    i = 0
    while i < len(value):
        if value[i] == "," and value[i + 1 : i + 2] == ",":
            parts[-1] += ","
            i += 2
        else:
            if value[i] == ",":
                parts.append("")
            else:
                parts[-1] += value[i]
            i += 1
    for part in parts:
        if part.startswith(f"{key}="):
            return part[len(key) + 1 :]
    return None


def qemu_opens(xml: str) -> list[tuple[str, str]]:
    """The host files a domain's QEMU opens itself, as (path, "r" or "rw"): kernel,
    initramfs, file disks (a qcow2's backing files not included), fw_cfg entries'
    files and ``mem-path`` of memory backends on ``<qemu:commandline>``. What
    libvirt opens and passes (tap, serial log, monitor) is not listed."""
    dom = ET.fromstring(xml)
    found: list[tuple[str, str]] = []
    for tag in ("os/kernel", "os/initrd"):
        el = dom.find(tag)
        if el is not None and el.text:
            found.append((el.text.strip(), "r"))
    for disk in dom.findall("devices/disk"):
        source = disk.find("source")
        if disk.get("type") != "file" or source is None or not source.get("file"):
            continue
        readonly = disk.find("readonly") is not None or disk.get("device") == "cdrom"
        found.append((source.get("file", ""), "r" if readonly else "rw"))
    for entry in dom.findall("sysinfo/entry"):
        if entry.get("file"):
            found.append((entry.get("file", ""), "r"))
    for arg in dom.findall(f"{_QEMU_NS}commandline/{_QEMU_NS}arg"):
        path = _qemu_option(arg.get("value", ""), "mem-path")
        if path:
            found.append((path, "rw"))
    return list(dict.fromkeys(found))

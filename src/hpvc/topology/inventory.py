"""Host inventory: which hosts a cluster may span, each with its topology root
and, optionally, its fabric address (where the cluster network across hosts runs)."""

from __future__ import annotations

import ipaddress
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpvc.errors import InputError, SpecError, TopologyError
from hpvc.sysroot import HOST, RootLike
from hpvc.topology.model import Topology

DEFAULT_FABRIC_MTU = 9000  # jumbo frames: nodes get 8950 across hosts
MIN_FABRIC_MTU = 1330  # the smallest node MTU (1280, IPv6's minimum) plus 50 for VXLAN
MAX_FABRIC_MTU = 65535
KEYS = frozenset({"name", "topology", "count", "fabric", "fabric_mtu"})


@dataclass(frozen=True)
class Fabric:
    """A host's address on the fabric between hosts (IPv4) and that network's MTU."""

    address: str
    mtu: int = DEFAULT_FABRIC_MTU


@dataclass(frozen=True)
class Inventory:
    """The hosts of an inventory file in order, and the fabric of those that give one."""

    hosts: tuple[tuple[str, Topology], ...]
    fabric: Mapping[str, Fabric] = field(default_factory=dict)


@dataclass(frozen=True)
class _Entry:
    name: str
    root: Path
    fabric: Fabric | None
    key: str = ""  # where in the inventory the root was given: hosts[i]


def _read(root: RootLike) -> Topology:
    from hpvc.topology.sysfs import read_topology

    return read_topology(root)


def _read_from(root: Path, what: str, fix: str) -> Topology:
    """The topology at ``root``; one that cannot be read is said as ``what`` (the
    option or inventory key it came from) with ``fix`` in place of the reader's
    own advice about ``hpvc topology --root``."""
    try:
        return _read(root)
    except TopologyError as e:
        raise TopologyError(what, e.why, fix if "--root" in e.fix else e.fix) from None


def local_hosts(topology_root: str | None) -> list[tuple[str, Topology]]:
    """This machine (root '/'), or one snapshot named after its directory."""
    if topology_root is None:
        return [(socket.gethostname() or "localhost", _read(HOST))]
    root = Path(topology_root)
    fix = (
        "pass --topology-root a folder holding sys/ and proc/, such as a snapshot"
        " extracted from tests/data/topologies/, or leave it out for this host"
    )
    return [(root.resolve().name or "host", _read_from(root, "--topology-root", fix))]


def _fabric(path: Path, key: str, h: dict[str, Any], count: int) -> list[Fabric | None]:
    """The fabric of each of the group's ``count`` hosts: consecutive addresses."""
    if "fabric" not in h:
        if "fabric_mtu" in h:
            raise SpecError(
                str(path), f"{key}.fabric_mtu", "given without fabric", 'add fabric = "10.0.0.1"'
            )
        return [None] * count
    text = h["fabric"]
    try:
        first = ipaddress.IPv4Address(text) if isinstance(text, str) else None
    except ValueError:
        first = None
    bad = first is None or first.is_multicast or first.is_unspecified or first.is_loopback
    if first is None or bad or int(first) == 0xFFFFFFFF:
        raise SpecError(
            str(path),
            f"{key}.fabric",
            f"{text!r} is not a unicast IPv4 address",
            'the host\'s address on the fabric between hosts, e.g. fabric = "10.0.0.1"',
        )
    if int(first) + count - 1 >= 0xFFFFFFFF:
        raise SpecError(str(path), f"{key}.fabric", f"no room for {count} addresses from {first}")
    mtu = h.get("fabric_mtu", DEFAULT_FABRIC_MTU)
    if (
        not isinstance(mtu, int)
        or isinstance(mtu, bool)
        or not MIN_FABRIC_MTU <= mtu <= MAX_FABRIC_MTU
    ):
        raise SpecError(
            str(path),
            f"{key}.fabric_mtu",
            f"got {mtu!r}, want an integer from {MIN_FABRIC_MTU} to {MAX_FABRIC_MTU}",
            "the fabric's MTU, e.g. fabric_mtu = 9000",
        )
    return [Fabric(str(first + n), mtu) for n in range(count)]


def _entries(path: Path, data: dict[str, Any]) -> list[_Entry]:
    hosts = data.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise SpecError(str(path), "hosts", "no [[hosts]] entries", "add one per host")
    out: list[_Entry] = []
    owner: dict[str, str] = {}  # fabric address -> host name
    for i, h in enumerate(hosts):
        key = f"hosts[{i}]"
        if not isinstance(h, dict) or not isinstance(h.get("name"), str):
            raise SpecError(str(path), f"{key}.name", "missing or not a string", "name the host")
        extra = set(h) - KEYS
        if extra:
            raise SpecError(str(path), f"{key}.{sorted(extra)[0]}", "unknown key", "remove it")
        topo = h.get("topology", "/")
        if not isinstance(topo, str):
            raise SpecError(str(path), f"{key}.topology", "not a string", "give a directory")
        root = (path.parent / topo) if not topo.startswith("/") else Path(topo)
        count = h.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise SpecError(str(path), f"{key}.count", "not a positive integer", "e.g. count = 4")
        names = [h["name"]] if count == 1 else [f"{h['name']}{n}" for n in range(count)]
        for name, fabric in zip(names, _fabric(path, key, h, count), strict=True):
            if fabric is not None:
                if fabric.address in owner:
                    raise SpecError(
                        str(path),
                        f"{key}.fabric",
                        f"{fabric.address} (host {name}) is also the fabric address"
                        f" of host {owner[fabric.address]}",
                        "give every host its own address",
                    )
                owner[fabric.address] = name
            out.append(_Entry(name, root, fabric, key))
    return out


def read_inventory(path: str | Path) -> Inventory:
    """Read an inventory TOML (``[[hosts]] name, topology, count, fabric, fabric_mtu``)
    and every topology it names."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(p), "file not found", "check the --hosts path") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError(str(p), "", f"cannot read inventory: {e}", "fix the TOML") from None
    entries = _entries(p, data)
    cache: dict[Path, Topology] = {}
    hosts = []
    for entry in entries:
        key = entry.root.resolve()
        if key not in cache:
            cache[key] = _read_from(
                entry.root,
                f"{p}: {entry.key}.topology",
                "give a folder holding sys/ and proc/; a relative path is relative"
                " to the inventory file",
            )
        hosts.append((entry.name, cache[key]))
    fabric = {x.name: x.fabric for x in entries if x.fabric is not None}
    return Inventory(hosts=tuple(hosts), fabric=fabric)


def load_inventory(path: str | Path) -> list[tuple[str, Topology]]:
    """The hosts of an inventory TOML with their topologies (see ``read_inventory``)."""
    return list(read_inventory(path).hosts)

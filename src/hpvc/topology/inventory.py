"""Host inventory: which hosts a cluster may span, each with its topology root."""

from __future__ import annotations

import socket
import tomllib
from pathlib import Path
from typing import Any

from hpvc.errors import InputError, SpecError
from hpvc.sysroot import HOST, RootLike
from hpvc.topology.model import Topology


def _read(root: RootLike) -> Topology:
    from hpvc.topology.sysfs import read_topology

    return read_topology(root)


def local_hosts(topology_root: str | None) -> list[tuple[str, Topology]]:
    """This machine (root '/'), or one snapshot named after its directory."""
    if topology_root is None:
        return [(socket.gethostname() or "localhost", _read(HOST))]
    root = Path(topology_root)
    return [(root.resolve().name or "host", _read(root))]


def _entries(path: Path, data: dict[str, Any]) -> list[tuple[str, Path]]:
    hosts = data.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise SpecError(str(path), "hosts", "no [[hosts]] entries", "add one per host")
    out: list[tuple[str, Path]] = []
    for i, h in enumerate(hosts):
        key = f"hosts[{i}]"
        if not isinstance(h, dict) or not isinstance(h.get("name"), str):
            raise SpecError(str(path), f"{key}.name", "missing or not a string", "name the host")
        extra = set(h) - {"name", "topology", "count"}
        if extra:
            raise SpecError(str(path), f"{key}.{sorted(extra)[0]}", "unknown key", "remove it")
        topo = h.get("topology", "/")
        if not isinstance(topo, str):
            raise SpecError(str(path), f"{key}.topology", "not a string", "give a directory")
        root = (path.parent / topo) if not topo.startswith("/") else Path(topo)
        count = h.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise SpecError(str(path), f"{key}.count", "not a positive integer", "e.g. count = 4")
        if count == 1:
            out.append((h["name"], root))
        else:
            out.extend((f"{h['name']}{n}", root) for n in range(count))
    return out


def load_inventory(path: str | Path) -> list[tuple[str, Topology]]:
    """Read an inventory TOML (``[[hosts]] name, topology, count``) and every topology."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(p), "file not found", "check the --hosts path") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError(str(p), "", f"cannot read inventory: {e}", "fix the TOML") from None
    cache: dict[Path, Topology] = {}
    out = []
    for name, root in _entries(p, data):
        key = root.resolve()
        if key not in cache:
            cache[key] = _read(root)
        out.append((name, cache[key]))
    return out

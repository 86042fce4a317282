"""What the kernel holds for a node's cgroups, read back for ``hpvc status`` (v1 and v2).

``hpvc.host.cgroups`` makes the cgroups; this module only reads them: the
node's and its cluster's CPUs and memory nodes, memory, CPU shares or weight
and quota, block-I/O throttles and bfq weight, pids and hugetlb limits, and
the tasks in a node's cgroup.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpvc.errors import HpvcError
from hpvc.host.blkio import THROTTLES, parse_device_map, parse_io_max, weight_value
from hpvc.host.blkio import read_text as _read
from hpvc.host.blkio import to_int as _int
from hpvc.host.cgroups import (
    _check_name,
    _crun_targets,
    _node_dir,
    _procs,
    _version,
    cluster_path,
    node_path,
)
from hpvc.host.command import at as _at
from hpvc.host.probe import CgroupLayout, cgroup_layout
from hpvc.sysroot import HOST, RootLike


def node_tasks(cluster: str, node: str, root: RootLike = HOST) -> list[int]:
    """PIDs in the node's cgroup and below it (empty when it has none)."""
    for controller in ("pids", "memory", "cpuset", "freezer"):
        try:
            _, d = _node_dir(root, cluster, node, controller)
        except HpvcError:
            continue
        pids: set[int] = set()
        for dirpath, _, _ in os.walk(d):
            pids.update(_procs(Path(dirpath)))
        return sorted(pids)
    return []


def _hugetlb_kib(name: str) -> int | None:
    """``2MB`` -> 2048 (the size in hugetlb.<size>.* file names)."""
    m = re.fullmatch(r"(\d+)([KMG])B", name)
    if not m:
        return None
    return int(m.group(1)) << {"K": 0, "M": 10, "G": 20}[m.group(2)]


def _hugetlb(d: Path | None, limit: str, usage: str) -> dict[str, dict[str, int | None]]:
    out: dict[str, dict[str, int | None]] = {}
    if d is None or not d.is_dir():
        return out
    for f in sorted(d.glob(f"hugetlb.*.{limit}")):
        size = _hugetlb_kib(f.name.split(".")[1])
        if size is not None and not f.name.split(".")[2].startswith("rsvd"):
            usage_text = _read(d / f"hugetlb.{f.name.split('.')[1]}.{usage}")
            out[f"{size}kB"] = {"limit": _int(_read(f)), "usage": _int(usage_text)}
    return out


def read_node_limits(cluster: str, node: str, root: RootLike = HOST) -> dict[str, Any]:
    """The limits the kernel holds for a node (for ``hpvc status``); None: no limit / unknown.

    Keys: cgroup ("v1"|"v2"), path, cpus, mems (the node's), cluster_cpus, cluster_mems,
    cpu_exclusive (of the cluster's cpuset), memory_limit, memory_usage, cpu_shares (v1),
    cpu_weight (v2), cpu_quota_us, cpu_period_us, io {read_bps, write_bps, read_iops,
    write_iops: {"MAJ:MIN": value}}, io_weight (bfq), pids_max, pids_current,
    hugetlb {"2048kB": {limit, usage}} (bytes).
    """
    _check_name("cluster", cluster)
    _check_name("node", node)
    layout = cgroup_layout(root)
    if _version(layout) == "v1":
        return _limits_v1(root, layout, cluster, node)
    _, d = _node_dir(root, cluster, node, "cgroup2")
    return _limits_v2(d, d.parent)


def _v1_reader(root: RootLike, layout: CgroupLayout, rel: str) -> Callable[[str, str], str | None]:
    def read(controller: str, name: str) -> str | None:
        target = layout.v1.get(controller)
        return _read(_at(root, target) / rel / name) if target else None

    return read


def _limits_v1(root: RootLike, layout: CgroupLayout, cluster: str, node: str) -> dict[str, Any]:
    rel = node_path(cluster, node).lstrip("/")
    if not any((_at(root, t) / rel).is_dir() for t in _crun_targets(layout)):
        _node_dir(root, cluster, node, "pids")  # raises the "is it running?" error
    n = _v1_reader(root, layout, rel)
    c = _v1_reader(root, layout, cluster_path(cluster).lstrip("/"))
    hugetlb = layout.v1.get("hugetlb")
    return {
        "cgroup": "v1",
        "path": "/" + rel,
        "cpus": n("cpuset", "cpuset.cpus"),
        "mems": n("cpuset", "cpuset.mems"),
        "cluster_cpus": c("cpuset", "cpuset.cpus"),
        "cluster_mems": c("cpuset", "cpuset.mems"),
        "cpu_exclusive": c("cpuset", "cpuset.cpu_exclusive") == "1",
        "memory_limit": _int(n("memory", "memory.limit_in_bytes")),
        "memory_usage": _int(n("memory", "memory.usage_in_bytes")),
        "cpu_shares": _int(n("cpu", "cpu.shares")),
        "cpu_weight": None,
        "cpu_quota_us": _int(n("cpu", "cpu.cfs_quota_us")),
        "cpu_period_us": _int(n("cpu", "cpu.cfs_period_us")),
        "io": {
            name: parse_device_map(n("blkio", f"blkio.throttle.{name}_device"))
            for name, _ in THROTTLES
        },
        "io_weight": weight_value(n("blkio", "blkio.bfq.weight")),
        "pids_max": _int(n("pids", "pids.max")),
        "pids_current": _int(n("pids", "pids.current")),
        "hugetlb": _hugetlb(
            _at(root, hugetlb) / rel if hugetlb else None, "limit_in_bytes", "usage_in_bytes"
        ),
    }


def _io_field(io_max: dict[str, dict[str, int | None]], field: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for dev, values in io_max.items():
        value = values.get(field)
        if value is not None:
            out[dev] = value
    return out


def _limits_v2(d: Path, cl: Path) -> dict[str, Any]:
    cpu_max = (_read(d / "cpu.max") or "").split()
    io_max = parse_io_max(_read(d / "io.max"))
    partition = _read(cl / "cpuset.cpus.partition") or ""
    return {
        "cgroup": "v2",
        "path": "/" + "/".join(d.parts[-3:]),
        "cpus": _read(d / "cpuset.cpus.effective"),
        "mems": _read(d / "cpuset.mems.effective"),
        "cluster_cpus": _read(cl / "cpuset.cpus.effective"),
        "cluster_mems": _read(cl / "cpuset.mems.effective"),
        "cpu_exclusive": partition in ("root", "isolated"),
        "memory_limit": _int(_read(d / "memory.max")),
        "memory_usage": _int(_read(d / "memory.current")),
        "cpu_shares": None,
        "cpu_weight": _int(_read(d / "cpu.weight")),
        "cpu_quota_us": _int(cpu_max[0]) if cpu_max else None,
        "cpu_period_us": _int(cpu_max[1]) if len(cpu_max) > 1 else None,
        "io": {name: _io_field(io_max, f) for name, f in THROTTLES},
        "io_weight": weight_value(_read(d / "io.bfq.weight")),
        "pids_max": _int(_read(d / "pids.max")),
        "pids_current": _int(_read(d / "pids.current")),
        "hugetlb": _hugetlb(d, "max", "current"),
    }

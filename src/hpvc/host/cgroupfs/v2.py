"""cgroup v2: one unified tree, every controller in it.

hpvc makes ``/hpvc`` and ``/hpvc/<cluster>`` in the tree and enables in their
``cgroup.subtree_control`` the controllers the root delegates (of
``CONTROLLERS``). A cluster's cpuset becomes a partition root
(``cpuset.cpus.partition``) only under a partition root ``/hpvc``. A cgroup's
CPUs and memory nodes are read from ``cpuset.*.effective``; block I/O is
``io.bfq.weight`` and ``io.max``, its counters ``io.stat``; CPU time is
``cpu.stat``'s ``usage_usec``; hugepages are counted by the ``total`` line of
``hugetlb.<size>.numa_stat``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from hpvc.errors import HpvcError
from hpvc.host.blkio import THROTTLES, parse_io_max, read_text, to_int, weight_value, write_text
from hpvc.host.cgroupfs.base import (
    CgroupManager,
    Version,
    hugetlb_limits,
    mkdir,
    not_exclusive_note,
)
from hpvc.host.command import at

CONTROLLERS = ("cpuset", "cpu", "memory", "io", "pids", "hugetlb")
_FIELD = {"read": "rbps", "write": "wbps"}  # io.max's key for a direction


def _cpu_stat_seconds(d: Path) -> float | None:
    """``usage_usec`` of ``cpu.stat`` in seconds; None when not there."""
    for line in (read_text(d / "cpu.stat") or "").splitlines():
        k, _, v = line.partition(" ")
        if k == "usage_usec" and v.strip().isdigit():
            return int(v) / 1e6
    return None


def _io_field(io_max: dict[str, dict[str, int | None]], field: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for dev, values in io_max.items():
        value = values.get(field)
        if value is not None:
            out[dev] = value
    return out


class V2Manager(CgroupManager):
    """cgroup v2: the one tree mounted at ``layout.v2_path``."""

    version: ClassVar[Version] = "v2"
    CONTROLLERS: ClassVar[tuple[str, ...]] = CONTROLLERS
    IO_WEIGHT: ClassVar[str] = "io.bfq.weight"
    HUGETLB_TOTAL: ClassVar[str] = "total="
    MEMORY_MAX: ClassVar[str] = "memory.max"
    HUGETLB_MAX: ClassVar[str] = "max"

    # --- where ---------------------------------------------------------------------

    def mount(self, controller: str) -> str | None:
        return self.layout.v2_path or None  # the one tree, whatever the controller

    def hierarchies(self) -> list[str]:
        return [self.layout.v2_path or ""]

    def io_mount(self) -> str | None:
        return self.layout.v2_path if "io" in self.layout.v2 else None

    # --- making --------------------------------------------------------------------

    def make_cluster(
        self, top: str, cluster: str, cpus: str, mems: str, exclusive: bool
    ) -> tuple[bool, list[str]]:
        base = at(self.root, self.layout.v2_path or "")
        delegated = (read_text(base / "cgroup.subtree_control") or "").split()
        wanted = [c for c in self.CONTROLLERS if c in delegated]
        notes = []
        if len(wanted) < len(self.CONTROLLERS):
            lacking = ",".join(c for c in self.CONTROLLERS if c not in wanted)
            notes.append(
                f"the cgroup2 root does not delegate {lacking}: those limits will not apply"
            )
        shared, cl = base / top, base / top / cluster
        mkdir(shared)
        mkdir(cl)
        self.enable((shared, cl), wanted)
        if "cpuset" not in wanted:
            return False, notes
        write_text(cl / "cpuset.cpus", cpus)
        write_text(cl / "cpuset.mems", mems)
        if not exclusive:
            return False, notes
        if not (read_text(shared / "cpuset.cpus.partition") or "").startswith("root"):
            return False, [*notes, not_exclusive_note(cl, top)]
        write_text(cl / "cpuset.cpus.partition", "root")
        return read_text(cl / "cpuset.cpus.partition") == "root", notes

    def enable(self, dirs: Sequence[Path], controllers: Sequence[str]) -> None:
        """``+controller`` in each folder's ``cgroup.subtree_control`` where missing."""
        for d in dirs:
            have = (read_text(d / "cgroup.subtree_control") or "").split()
            missing = [f"+{c}" for c in controllers if c not in have]
            if missing:  # one write: the kernel takes all or none
                write_text(d / "cgroup.subtree_control", " ".join(missing))

    def hugetlb_mount_target(self) -> str | None:
        return None  # hugetlb is a cgroup2 controller like the others

    # --- block I/O -----------------------------------------------------------------

    def check_throttle(self, d: Path, key: str, name: str, value: int) -> str:
        field = dict(THROTTLES)[name]
        path = d / "io.max"
        if parse_io_max(read_text(path)).get(key, {}).get(field) == value:
            return ""
        write_text(path, f"{key} {field}={value}")
        if parse_io_max(read_text(path)).get(key, {}).get(field) != value:
            raise HpvcError(
                f"block I/O limit of {d}", f"io.max does not hold {key} {field}={value}"
            )
        return f"io.max = {key} {field}={value} (crun had not set it)"

    def set_bps(self, d: Path, key: str, direction: str, value: int | None) -> None:
        write_text(d / "io.max", f"{key} {_FIELD[direction]}={value or 'max'}")

    def bps_limits(self, d: Path) -> dict[str, dict[str, int | None]]:
        return {
            dev: {"read": fields.get("rbps"), "write": fields.get("wbps")}
            for dev, fields in parse_io_max(read_text(d / "io.max")).items()
        }

    def io_bytes(self, d: Path) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for line in (read_text(d / "io.stat") or "").splitlines():
            dev, *pairs = line.split()
            fields = dict(p.partition("=")[::2] for p in pairs)
            out[dev] = {"read": to_int(fields.get("rbytes")) or 0,
                        "write": to_int(fields.get("wbytes")) or 0}  # fmt: skip
        return out

    # --- reading back --------------------------------------------------------------

    def limits(self, node: str, cluster: str) -> dict[str, Any]:
        d = at(self.root, self.layout.v2_path or "") / node.strip("/")
        cl = at(self.root, self.layout.v2_path or "") / cluster.strip("/")
        cpu_max = (read_text(d / "cpu.max") or "").split()
        io_max = parse_io_max(read_text(d / "io.max"))
        partition = read_text(cl / "cpuset.cpus.partition") or ""
        return {
            "cgroup": self.version,
            "path": "/" + node.strip("/"),
            "cpus": read_text(d / "cpuset.cpus.effective"),
            "mems": read_text(d / "cpuset.mems.effective"),
            "cluster_cpus": read_text(cl / "cpuset.cpus.effective"),
            "cluster_mems": read_text(cl / "cpuset.mems.effective"),
            "cpu_exclusive": partition in ("root", "isolated"),
            "memory_limit": to_int(read_text(d / "memory.max")),
            "memory_usage": to_int(read_text(d / "memory.current")),
            "cpu_shares": None,
            "cpu_weight": to_int(read_text(d / "cpu.weight")),
            "cpu_quota_us": to_int(cpu_max[0]) if cpu_max else None,
            "cpu_period_us": to_int(cpu_max[1]) if len(cpu_max) > 1 else None,
            "io": {name: _io_field(io_max, f) for name, f in THROTTLES},
            "io_weight": weight_value(read_text(d / "io.bfq.weight")),
            "pids_max": to_int(read_text(d / "pids.max")),
            "pids_current": to_int(read_text(d / "pids.current")),
            "hugetlb": hugetlb_limits(d, "max", "current"),
        }

    def cpu_seconds(self, rel: str) -> float | None:
        d = self.dir("cpu", rel)
        return _cpu_stat_seconds(d) if d is not None else None

    def hugetlb_mount(self) -> str | None:
        return self.layout.v2_path

    # --- what hpvc doctor says -----------------------------------------------------

    def describe(self) -> str:
        held = ",".join(self.layout.v2) or "no controllers"
        return f"{self.layout.mode}: cgroup2 at {self.layout.v2_path or '?'} with {held}"

    def problems(self) -> tuple[list[str], list[str]]:
        lacking = [c for c in self.CONTROLLERS if c not in self.layout.v2]
        if not lacking:
            return [], []
        return (
            [f"cgroup2 lacks {','.join(lacking)}"],
            [f"enable {','.join(lacking)} in the kernel / cgroup.subtree_control"],
        )

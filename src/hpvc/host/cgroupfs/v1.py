"""cgroup v1 (as on these hosts, hybrid ones included): a hierarchy per controller.

hpvc makes ``/hpvc`` and ``/hpvc/<cluster>`` in every hierarchy crun uses
(``CONTROLLERS``; co-mounted ones once). ``/hpvc`` copies the root's CPUs and
memory nodes unless an administrator made it exclusive; a cluster's cpuset is
marked ``cpuset.cpu_exclusive`` only under an exclusive ``/hpvc``. Block I/O is
``blkio.bfq.weight`` and ``blkio.throttle.*``; hugepages are counted by the
``hierarchical_total`` line of ``hugetlb.<size>.numa_stat``. On a hybrid host
the cgroup2 tree holds no controller crun needs (crun 1.8 refuses it
otherwise), which ``problems`` says and ``hugetlb_mount_target`` helps with.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from hpvc.errors import HpvcError
from hpvc.host.blkio import THROTTLES, parse_device_map, read_text, to_int, weight_value, write_text
from hpvc.host.cgroupfs.base import (
    CgroupManager,
    Version,
    hugetlb_limits,
    mkdir,
    not_exclusive_note,
    subdirs,
)
from hpvc.host.command import at

CONTROLLERS = (
    *("cpuset", "cpu", "cpuacct", "memory", "blkio"),
    *("pids", "hugetlb", "devices", "freezer"),
)  # every hierarchy crun 1.8 joins on v1


class V1Manager(CgroupManager):
    """cgroup v1: each controller in the hierarchy it is mounted as."""

    version: ClassVar[Version] = "v1"
    CONTROLLERS: ClassVar[tuple[str, ...]] = CONTROLLERS
    IO_WEIGHT: ClassVar[str] = "blkio.bfq.weight"
    HUGETLB_TOTAL: ClassVar[str] = "hierarchical_total="
    MEMORY_MAX: ClassVar[str] = "memory.limit_in_bytes"
    HUGETLB_MAX: ClassVar[str] = "limit_in_bytes"

    # --- where ---------------------------------------------------------------------

    def mount(self, controller: str) -> str | None:
        return self.layout.v1.get(controller) or None

    def hierarchies(self) -> list[str]:
        return list(dict.fromkeys(t for c in self.CONTROLLERS if (t := self.mount(c))))

    def io_mount(self) -> str | None:
        return self.mount("blkio")

    def _bases(self) -> list[str]:
        """Folders the hierarchies are mounted in (``/sys/fs/cgroup``)."""
        return sorted({str(Path(p).parent) for p in self.layout.v1.values() if p})

    # --- making --------------------------------------------------------------------

    def make_cluster(
        self, top: str, cluster: str, cpus: str, mems: str, exclusive: bool
    ) -> tuple[bool, list[str]]:
        notes: list[str] = []
        lacking = [c for c in self.CONTROLLERS if not self.mount(c)]
        if lacking:
            notes.append(
                f"cgroup v1 lacks {','.join(lacking)}: crun will refuse to start"
                + (" (ensure_hugetlb_v1 binds hugetlb)" if "hugetlb" in lacking else "")
            )
        cpuset_root = self.dir("cpuset", "")
        for target in self.hierarchies():
            base = at(self.root, target)
            if base == cpuset_root:
                continue
            mkdir(base / top)
            mkdir(base / top / cluster)
        if cpuset_root is None:
            notes.append("no v1 cpuset hierarchy: the cluster's CPUs are not confined")
            return False, notes
        shared = cpuset_root / top
        mkdir(shared)
        if read_text(shared / "cpuset.cpu_exclusive") != "1":
            for name in ("cpuset.cpus", "cpuset.mems"):  # the root's: a superset of any child's
                write_text(shared / name, read_text(cpuset_root / name) or "")
        cl = shared / cluster
        mkdir(cl)
        write_text(cl / "cpuset.cpus", cpus)
        write_text(cl / "cpuset.mems", mems)
        excl, note = self._exclusive(shared, cl, exclusive, top)
        return excl, notes + note

    def _exclusive(self, shared: Path, cl: Path, want: bool, top: str) -> tuple[bool, list[str]]:
        flag = cl / "cpuset.cpu_exclusive"
        if not want:
            if read_text(flag) == "1":
                write_text(flag, "0")
            return False, []
        if read_text(shared / "cpuset.cpu_exclusive") != "1":
            return False, [not_exclusive_note(cl, top)]
        try:
            flag.write_text("1")
        except OSError as e:
            siblings = [p.name for p in subdirs(shared) if p != cl]
            raise HpvcError(
                f"make cpuset {cl} exclusive",
                f"{e.strerror or e}: its CPUs overlap another cpuset beside it"
                f" ({', '.join(siblings)})",
                "give the cluster CPUs no other cluster holds",
            ) from e
        return True, []

    def enable(self, dirs: Sequence[Path], controllers: Sequence[str]) -> None:
        """Nothing to do: a v1 controller is in every cgroup of its hierarchy."""

    def hugetlb_mount_target(self) -> str | None:
        if "hugetlb" in self.layout.v1:
            return None
        bases = self._bases()
        return f"{bases[0] if bases else '/sys/fs/cgroup'}/hugetlb"

    # --- block I/O -----------------------------------------------------------------

    def check_throttle(self, d: Path, key: str, name: str, value: int) -> str:
        path = d / f"blkio.throttle.{name}_device"
        if parse_device_map(read_text(path)).get(key) == value:
            return ""
        write_text(path, f"{key} {value}")
        if parse_device_map(read_text(path)).get(key) != value:
            raise HpvcError(f"block I/O limit of {d}", f"{path.name} does not hold {key} {value}")
        return f"{path.name} = {key} {value} (crun had not set it)"

    def set_bps(self, d: Path, key: str, direction: str, value: int | None) -> None:
        path = d / f"blkio.throttle.{direction}_bps_device"
        write_text(path, f"{key} {value or 0}")  # 0 removes the rule

    def bps_limits(self, d: Path) -> dict[str, dict[str, int | None]]:
        out: dict[str, dict[str, int | None]] = {}
        for direction in ("read", "write"):
            text = read_text(d / f"blkio.throttle.{direction}_bps_device")
            for dev, value in parse_device_map(text).items():  # 0: no rule (a fake tree)
                out.setdefault(dev, {"read": None, "write": None})[direction] = value or None
        return out

    def io_bytes(self, d: Path) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for line in (read_text(d / "blkio.throttle.io_service_bytes") or "").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in ("Read", "Write") and parts[2].isdigit():
                out.setdefault(parts[0], {"read": 0, "write": 0})[parts[1].lower()] = int(parts[2])
        return out

    # --- reading back --------------------------------------------------------------

    def _read(self, controller: str, rel: str, name: str) -> str | None:
        d = self.dir(controller, rel)
        return read_text(d / name) if d is not None else None

    def limits(self, node: str, cluster: str) -> dict[str, Any]:
        def n(controller: str, name: str) -> str | None:
            return self._read(controller, node, name)

        def c(controller: str, name: str) -> str | None:
            return self._read(controller, cluster, name)

        return {
            "cgroup": self.version,
            "path": "/" + node.strip("/"),
            "cpus": n("cpuset", "cpuset.cpus"),
            "mems": n("cpuset", "cpuset.mems"),
            "cluster_cpus": c("cpuset", "cpuset.cpus"),
            "cluster_mems": c("cpuset", "cpuset.mems"),
            "cpu_exclusive": c("cpuset", "cpuset.cpu_exclusive") == "1",
            "memory_limit": to_int(n("memory", "memory.limit_in_bytes")),
            "memory_usage": to_int(n("memory", "memory.usage_in_bytes")),
            "cpu_shares": to_int(n("cpu", "cpu.shares")),
            "cpu_weight": None,
            "cpu_quota_us": to_int(n("cpu", "cpu.cfs_quota_us")),
            "cpu_period_us": to_int(n("cpu", "cpu.cfs_period_us")),
            "io": {
                name: parse_device_map(n("blkio", f"blkio.throttle.{name}_device"))
                for name, _ in THROTTLES
            },
            "io_weight": weight_value(n("blkio", "blkio.bfq.weight")),
            "pids_max": to_int(n("pids", "pids.max")),
            "pids_current": to_int(n("pids", "pids.current")),
            "hugetlb": hugetlb_limits(
                self.dir("hugetlb", node), "limit_in_bytes", "usage_in_bytes"
            ),
        }

    def cpu_seconds(self, rel: str) -> float | None:
        text = self._read("cpuacct", rel, "cpuacct.usage")
        return int(text) / 1e9 if text and text.isdigit() else None

    def hugetlb_mount(self) -> str | None:
        return self.mount("hugetlb")

    # --- what hpvc doctor says -----------------------------------------------------

    def describe(self) -> str:
        bases = self._bases()
        where = f" under {', '.join(bases)}" if bases else ""
        parts = [f"v1 {','.join(sorted(self.layout.v1))}{where}"]
        if self.layout.v2_path is not None:  # hybrid: the cgroup2 tree beside
            held = ",".join(self.layout.v2) or "no controllers"
            parts.append(f"cgroup2 at {self.layout.v2_path or '?'} with {held}")
        return f"{self.layout.mode}: " + "; ".join(parts)

    def problems(self) -> tuple[list[str], list[str]]:
        problems: list[str] = []
        fixes: list[str] = []
        v1, v2 = self.layout.v1, self.layout.v2
        if v2:  # hybrid, with controllers in the cgroup2 tree
            problems.append("crun refuses hybrid mode while cgroup2 holds controllers")
            fixes.append(self._mount_fix([c for c in v2 if c not in v1]))
        lacking = [c for c in self.CONTROLLERS if c not in v1 and c not in v2]
        if lacking:
            problems.append(f"v1 lacks {','.join(lacking)}")
            fixes.append(self._mount_fix(lacking))
        return problems, fixes

    def _mount_fix(self, names: Sequence[str]) -> str:
        bases = self._bases()
        base = bases[0] if bases else "/sys/fs/cgroup"
        return " && ".join(
            f"mkdir -p {base}/{c} && mount -t cgroup -o {c} cgroup {base}/{c}" for c in names
        )

"""Host readers for the benchmarks: CPU time counters (host.usage) and hardware facts
(host.hwinfo), on fake /proc and /sys trees and on the topology snapshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpvc.errors import HpvcError
from hpvc.host import hwinfo, usage


def tree(root: Path, files: dict[str, str]) -> Path:
    """A fake root with ``files`` (absolute path -> text) and a /proc/mounts."""
    (root / "proc").mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        p = root / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


# --- usage ---------------------------------------------------------------------------


def test_parse_proc_stat_sums_busy_and_steal() -> None:
    busy, steal = usage.parse_proc_stat("cpu  100 10 20 900 5 1 2 7 0 0\ncpu0 1\n", 100)
    assert busy == pytest.approx(1.33) and steal == pytest.approx(0.07)  # idle, iowait left out
    assert usage.parse_proc_stat("", 100) == (None, None)
    assert usage.parse_proc_stat("cpu0 1 2 3 4 5 6 7 8\n", 100) == (None, None)  # no total
    assert usage.parse_proc_stat("cpu 1 2 3\n", 100) == (None, None)  # too short


def test_host_cpu_seconds(tmp_path: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    root = tree(tmp_path, {"/proc/stat": "cpu  100 10 20 900 5 1 2 7 0 0\ncpu0 1\n"})
    busy, steal = usage.host_cpu_seconds(root)
    assert busy == pytest.approx(133 / tick) and steal == pytest.approx(7 / tick)
    assert usage.host_cpu_seconds(tmp_path / "none") == (None, None)


def test_cgroup_cpu_seconds_v1_and_v2(tmp_path: Path) -> None:
    v1 = tree(
        tmp_path / "v1",
        {
            "/proc/mounts": "cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\n",
            "/sys/fs/cgroup/cpuacct/a/b/cpuacct.usage": "2500000000\n",
            "/sys/fs/cgroup/cpuacct/a/c/cpuacct.usage": "garbage\n",
        },
    )
    assert usage.cgroup_cpu_seconds("/a/b", v1) == 2.5
    assert usage.cgroup_cpu_seconds("/a/c", v1) is None
    assert usage.cgroup_cpu_seconds("/a/gone", v1) is None
    v2 = tree(
        tmp_path / "v2",
        {
            "/proc/mounts": "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n",
            "/sys/fs/cgroup/cgroup.controllers": "cpu cpuset",
            "/sys/fs/cgroup/a/b/cpu.stat": "usage_usec 1500000\nuser_usec 1\n",
        },
    )
    assert usage.cgroup_cpu_seconds("/a/b", v2) == 1.5
    assert usage.cgroup_cpu_seconds("/a/gone", v2) is None


# --- hwinfo --------------------------------------------------------------------------


def test_cpu_model(tmp_path: Path) -> None:
    root = tree(tmp_path, {"/proc/cpuinfo": "processor\t: 0\nmodel name\t: AMD EPYC 7B13\n"})
    assert hwinfo.cpu_model(root) == "AMD EPYC 7B13"
    assert hwinfo.cpu_model(tmp_path / "none") is None


def _caches(root: Path, caches: list[tuple[int, str, str]]) -> Path:
    base = "/sys/devices/system/cpu/cpu0/cache"
    files: dict[str, str] = {}
    for i, (level, kind, size) in enumerate(caches):
        files |= {
            f"{base}/index{i}/level": f"{level}\n",
            f"{base}/index{i}/type": f"{kind}\n",
            f"{base}/index{i}/size": f"{size}\n",
        }
    return tree(root, files)


def test_llc_bytes_takes_the_highest_data_cache(tmp_path: Path) -> None:
    caches = [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K")]
    root = _caches(tmp_path, [*caches, (3, "Unified", "32768K")])
    assert hwinfo.llc_bytes(root) == 32 << 20
    assert hwinfo.llc_bytes(str(root)) == 32 << 20  # any root-like


def test_llc_bytes_skips_an_instruction_cache_above_the_data_caches(tmp_path: Path) -> None:
    root = _caches(tmp_path, [(1, "Data", "48K"), (2, "Instruction", "4M"), (2, "Bad", "x")])
    assert hwinfo.llc_bytes(root) == 48 << 10


def test_llc_bytes_without_caches_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(HpvcError, match="no cache size"):
        hwinfo.llc_bytes(tmp_path)


def test_llc_bytes_of_a_real_machine(snapshots: dict[str, Path]) -> None:
    assert hwinfo.llc_bytes(snapshots["64amd64-4s2n4ca2co"]) == 6144 << 10


@pytest.mark.parametrize(
    ("text", "size"), [("32K", 32 << 10), ("1M", 1 << 20), ("512", 512), ("1 G", 1 << 30)]
)
def test_cache_size_bytes(text: str, size: int) -> None:
    assert hwinfo.cache_size_bytes(text) == size


def test_cache_size_bytes_refuses_other_text() -> None:
    with pytest.raises(ValueError, match="not a cache size"):
        hwinfo.cache_size_bytes("32 KiB")


def test_active_scheduler() -> None:
    assert hwinfo.active_scheduler("none mq-deadline [bfq]") == "bfq"
    assert hwinfo.active_scheduler("[none] bfq") == "none"
    assert hwinfo.active_scheduler("none") == "none"  # no brackets: as the kernel says
    assert hwinfo.active_scheduler(None) is None


def test_block_queue(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "/sys/block/loop3/dev": "7:3\n",
            "/sys/block/loop3/queue/scheduler": "none mq-deadline [bfq]\n",
            "/sys/block/loop3/queue/rotational": "1\n",
            "/sys/block/loop3/loop/dio": "0\n",
            "/sys/block/sda/dev": "8:0\n",
        },
    )
    assert hwinfo.block_queue("loop3", root) == hwinfo.BlockQueue("7:3", "bfq", "1", "0")
    assert hwinfo.block_queue("sda", root) == hwinfo.BlockQueue("8:0", None, None, None)

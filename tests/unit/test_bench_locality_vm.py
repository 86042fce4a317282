"""``hpvc bench locality --kind vm``'s pure parts (``hpvc.bench.locality.vm``): a run
counts only when UCX's lanes show the transport it measures; ratios to TCP per
repetition; the goals; the report."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from hpvc.bench.locality import vm
from hpvc.errors import HpvcError

IVSHMEM_ERR = (
    "[1] ucp_worker.c:1763 UCX  INFO    ep_cfg[0]: tag(self/memory0 ivshmem/ivshmem)\n"
    "[1] ucp_worker.c:1763 UCX  INFO    ep_cfg[1]: tag(ivshmem/ivshmem)\n"
)
TCP_ERR = "[1] ucp_worker.c:1763 UCX  INFO    ep_cfg[1]: tag(tcp/eth0)\n"


def job(stderr: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["pingpong"], rc, '{"bytes": 4}\n', stderr)


def test_a_run_counts_only_over_the_transport_it_measures() -> None:
    assert vm.checked("ivshmem", job(IVSHMEM_ERR)) == '{"bytes": 4}\n'
    assert vm.checked("tcp", job(TCP_ERR)) == '{"bytes": 4}\n'
    with pytest.raises(HpvcError, match="tcp/eth0"):
        vm.checked("ivshmem", job(TCP_ERR))  # a fallback is never an ivshmem figure
    with pytest.raises(HpvcError, match="ivshmem/ivshmem"):
        vm.checked("tcp", job(IVSHMEM_ERR))
    with pytest.raises(HpvcError, match="not printed"):
        vm.checked("tcp", job(""))
    with pytest.raises(HpvcError):
        vm.checked("ivshmem", job(IVSHMEM_ERR, rc=1))


def rows(lat: float, bw: float) -> list[dict[str, Any]]:
    """pingpong's lines; ``bw`` is what it prints (rounded, 0.0 at times over TCG),
    which the benchmark does not use: its bandwidth is bytes over the latency."""
    return [
        {"bytes": b, "latency_us": lat * (1 + b / 1024), "bandwidth_MBps": round(bw * 0, 1)}
        for b in (4, 64, 4 << 20)
    ]


def test_ratios_are_to_tcp_of_the_same_repetition_and_goals_follow() -> None:
    runs = {
        "ivshmem": [rows(10, 400), rows(20, 200)],
        "tcp": [rows(100, 100), rows(100, 100)],
        "native": [rows(1, 4000), rows(1, 4000)],
    }
    table = vm.table(runs)
    small = table[0]
    assert small["bytes"] == 4
    assert small["ivshmem"]["latency_ratio_to_tcp"] == {"min": 5.0, "median": 7.5, "max": 10.0}
    assert small["ivshmem"]["bandwidth_ratio_to_tcp"] == small["ivshmem"]["latency_ratio_to_tcp"]
    assert small["native"]["latency_us"]["median"] == pytest.approx(1 * (1 + 4 / 1024))
    assert small["native"]["bandwidth_MBps"]["median"] == pytest.approx(4 / (1 + 4 / 1024))
    assert vm.goals(table) == {
        "latency_5x_lower_than_tcp_small": True,
        "bandwidth_higher_than_tcp_every_size": True,
    }
    runs["ivshmem"] = [rows(150, 90), rows(150, 90)]  # slower than tcp
    assert vm.goals(vm.table(runs)) == {
        "latency_5x_lower_than_tcp_small": False,
        "bandwidth_higher_than_tcp_every_size": False,
    }


def test_the_report_labels_emulation_and_has_every_size() -> None:
    runs = {"ivshmem": [rows(10, 400)], "tcp": [rows(100, 100)], "native": [rows(1, 4000)]}
    table = vm.table(runs)
    doc = {
        "repeat": 1,
        "host": "h",
        "cpu_model": "cpu",
        "cpus": 2,
        "kernel": "k",
        "open_mpi": "Open MPI 4.1.4",
        "date": "d",
        "label": "TCG emulation: absolute figures are the emulator's",
        "ratio": "to tcp",
        "goals": vm.goals(table),
        "sizes": table,
        "configs": vm.CONFIGS,
    }
    text = vm.report_md(doc)
    assert "**TCG emulation: absolute figures are the emulator's.**" in text
    assert [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| 4")] == [
        "| 4 B",
        "| 4 MiB",
    ]
    assert "| 64 B | 10.6 (10.6-10.6) | 106.2 (106.2-106.2) |" in text

"""hpvc.bench.migrate.region's pure parts: the spec, the table's ratios, the report."""

from __future__ import annotations

from typing import Any

from hpvc.bench.migrate import region


def row(region_rt: int, fallback_rt: int, tcp_rt: int, let_go: float) -> dict[str, Any]:
    loop = {"round_trips": 0, "wrong": 0, "max_gap_ms": 1.0}
    return {
        "region": loop | {"round_trips": region_rt},
        "move": loop | {"round_trips": 100, "max_gap_ms": 400.0},
        "fallback": loop | {"round_trips": fallback_rt},
        "tcp": loop | {"round_trips": tcp_rt},
        "migration": {"total_ms": 200, "downtime_ms": 200, "wall_s": 3.0, "let_go_s": let_go},
    }


def test_spec_keeps_the_region_and_three_guests() -> None:
    text = region.spec_text("10.9.0.0/24", 512)
    assert 'locality = "shm"' in text and "count = 3" in text and 'memory = "512MiB"' in text


def test_table_ratios_and_report() -> None:
    rows = [row(1000, 250, 200, 0.05), row(900, 300, 300, 0.07), row(1200, 200, 250, 0.06)]
    t = region.table(rows, secs=10)
    assert t["region"]["round_trips_per_s"] == {"min": 90.0, "median": 100.0, "max": 120.0}
    assert t["region_over_fallback"]["median"] == 4.0  # 1000/250, 900/300=3, 1200/200=6
    assert t["fallback_over_tcp"] == {"min": 0.8, "median": 1.0, "max": 1.25}
    assert t["let_go_s"]["median"] == 0.06
    doc = {"accelerator": {"vm": "tcg"}, "reps": 3, "memory_mib": 512, "loop_seconds": 10,
           "table": t}  # fmt: skip
    text = region.report(doc)
    assert "(TCG: emulation, not KVM)" in text
    assert "| move | 10 / 10 / 10 | 400.0 / 400.0 / 400.0 |" in text
    assert "region / fallback (round trips): 3.00 / 4.00 / 6.00" in text

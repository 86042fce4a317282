"""hpvc.bench.migrate.region's pure parts: the spec, the table's ratios, the report."""

from __future__ import annotations

from typing import Any

from hpvc.bench.migrate import region


def row(region_s: float, after_s: float, tcp_s: float, let_go: float) -> dict[str, Any]:
    loop = {"round_trips": 0, "wrong": 0, "max_gap_ms": 1.0}
    return {
        "region": loop | {"per_s": region_s},
        "move": loop | {"per_s": 50.0, "max_gap_ms": 400.0},
        "after": {"per_s": after_s, "max_gap_ms": 400.0},
        "tcp": loop | {"per_s": tcp_s},
        "migration": {"total_ms": 200, "downtime_ms": 200, "wall_s": 3.0, "let_go_s": let_go},
    }


def test_spec_keeps_the_region_and_three_guests() -> None:
    text = region.spec_text("10.9.0.0/24", 512)
    assert 'locality = "shm"' in text and "count = 3" in text and 'memory = "512MiB"' in text


def test_per_second_counts_are_read() -> None:
    out = "loop running\nloop at 1 s: 10 round trips\nloop at 2 s: 25 round trips\n"
    assert {int(s): int(n) for s, n in region.AT.findall(out)} == {1: 10, 2: 25}


def test_table_ratios_and_report() -> None:
    rows = [row(1000, 250, 200, 0.05), row(900, 300, 300, 0.07), row(1200, 200, 250, 0.06)]
    t = region.table(rows)
    assert t["region"]["round_trips_per_s"] == {"min": 900.0, "median": 1000.0, "max": 1200.0}
    assert t["region_over_after"]["median"] == 4.0  # 1000/250, 900/300=3, 1200/200=6
    assert t["after_over_tcp"] == {"min": 0.8, "median": 1.0, "max": 1.25}
    assert t["let_go_s"]["median"] == 0.06
    assert "max_gap_ms" not in t["after"]
    doc = {"accelerator": {"vm": "tcg"}, "reps": 3, "memory_mib": 512, "loop_seconds": 10,
           "table": t}  # fmt: skip
    text = region.report(doc)
    assert "(TCG: emulation, not KVM)" in text
    assert "| move | 50 / 50 / 50 | 400.0 / 400.0 / 400.0 |" in text
    assert "| after | 200 / 250 / 300 | (the move's) |" in text
    assert "region / after (round trips): 3.0 / 4.0 / 6.0" in text

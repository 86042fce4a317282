"""The pure parts of ``python -m hpvc.bench.migrate.slurm``: the MPI loop's last
line, the table of min/median/max per size and load, the report."""

from __future__ import annotations

from typing import Any

from hpvc.bench.migrate.slurm import parse_loop, report, spec_text, table


def _row(load: str, total: int, **more: Any) -> dict[str, Any]:
    return {"memory_mib": 1024, "load": load, "total_ms": total, "downtime_ms": total // 10,
            "wall_s": total / 1000 + 1, "bytes_sent": 512 << 20, **more}  # fmt: skip


def test_loop_line() -> None:
    got = parse_loop("loop running\nloop done: 1200 round trips, 0 wrong, max gap 412.5 ms\n")
    assert got == {"round_trips": 1200, "wrong": 0, "max_gap_ms": 412.5}
    assert parse_loop("mpirun: something went wrong") is None


def test_table_takes_min_median_max_per_load() -> None:
    mpi = {"slowdown": 1.5, "loop": {"max_gap_ms": 400.0}, "baseline": {"max_gap_ms": 10.0}}
    rows = [_row("idle", 900), _row("idle", 1100), _row("idle", 1000), _row("mpi", 2000, **mpi)]
    t = table(rows)
    idle = next(e for e in t if e["load"] == "idle")
    assert idle["n"] == 3 and idle["total_ms"] == {"min": 900, "median": 1000, "max": 1100}
    assert idle["sent_mib"]["median"] == 512
    m = next(e for e in t if e["load"] == "mpi")
    assert m["slowdown"]["max"] == 1.5 and m["mpi_max_gap_ms"]["min"] == 400.0
    text = report({"accelerator": {"vm": "tcg"}, "reps": 3, "table": t})
    assert "TCG: emulation" in text and "| 1024 MiB | idle | 900 / 1000 / 1100 |" in text


def test_spec_keeps_guests_movable() -> None:
    spec = spec_text("10.9.8.0/24", 2048)
    assert 'locality = "none"' in spec and 'memory = "2048MiB"' in spec and "count = 2" in spec

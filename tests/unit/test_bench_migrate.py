"""``hpvc bench migrate`` (one host)'s pure parts: the outside view of the
guest from ping output, load order, slowdown, sizing to the host's memory,
the table's statistics, the report and the refusals before anything starts."""

from __future__ import annotations

from typing import Any

import pytest

from hpvc.bench.migrate import report, runner
from hpvc.cli import bench_migrate as cli
from hpvc.errors import InputError

PING = """PING 10.9.0.3 (10.9.0.3) 56(84) bytes of data.
[1764130000.000000] 64 bytes from 10.9.0.3: icmp_seq=1 ttl=64 time=0.2 ms
[1764130000.002000] 64 bytes from 10.9.0.3: icmp_seq=2 ttl=64 time=0.2 ms
[1764130000.150500] 64 bytes from 10.9.0.3: icmp_seq=60 ttl=64 time=0.3 ms
[1764130000.153000] 64 bytes from 10.9.0.3: icmp_seq=61 ttl=64 time=0.2 ms

--- 10.9.0.3 ping statistics ---
"""


def test_the_longest_gap_between_replies_is_the_outside_downtime() -> None:
    assert report.longest_gap_ms(PING) == pytest.approx(148.5, abs=1e-3)


def test_a_guest_that_stops_answering_shows_as_a_gap_to_the_end() -> None:
    """With the time ping was stopped, the silence after the last reply counts:
    a guest that never answered again after the move is not a small gap."""
    assert report.longest_gap_ms(PING, 1764130000.153) == pytest.approx(148.5, abs=1e-3)
    assert report.longest_gap_ms(PING, 1764130000.853) == pytest.approx(700.0, abs=1e-3)
    one = "\n".join(PING.splitlines()[:2])
    assert report.longest_gap_ms(one, 1764130000.5) == pytest.approx(500.0, abs=1e-3)


def test_fewer_than_two_replies_give_no_gap() -> None:
    one = "\n".join(PING.splitlines()[:2])
    assert report.longest_gap_ms(one) is None
    assert report.longest_gap_ms("From 10.9.0.1 icmp_seq=1 Destination Host Unreachable") is None


def test_loads_alternate_per_repetition() -> None:
    assert report.loads_of(0) == ("idle", "memwrite", "mpi")
    assert report.loads_of(1) == ("mpi", "memwrite", "idle")
    assert report.loads_of(2) == report.loads_of(0)


def test_slowdown_is_baseline_over_during() -> None:
    assert report.slowdown(1000, 500) == 2.0
    assert report.slowdown(1000, 1000) == 1.0
    assert report.slowdown(10, 0) == 10.0  # no round trip during: no division by zero


def _row(mib: int, load: str, total: float, gap: float | None, **more: Any) -> dict[str, Any]:
    return {"memory_mib": mib, "load": load, "total_ms": total, "downtime_ms": total / 10,
            "wall_s": total / 100, "bytes_sent": 3 << 20, "ping_gap_ms": gap, **more}  # fmt: skip


def test_table_gives_min_median_max_per_size_and_load() -> None:
    rows = [
        _row(1024, "idle", 300, 20),
        _row(1024, "idle", 100, 40),
        _row(1024, "idle", 200, None),
        _row(1024, "mpi", 400, 90, slowdown=1.5),
        _row(2048, "memwrite", 900, 30),
    ]
    t = report.table(rows)
    assert [(e["memory_mib"], e["load"], e["n"]) for e in t] == [
        (1024, "idle", 3), (1024, "mpi", 1), (2048, "memwrite", 1)
    ]  # fmt: skip
    idle = t[0]
    assert idle["total_ms"] == {"min": 100, "median": 200, "max": 300}
    assert idle["ping_gap_ms"] == {"min": 20, "median": 30, "max": 40}  # the missing one left out
    assert idle["sent_mib"]["median"] == 3
    assert "slowdown" not in idle and t[1]["slowdown"]["max"] == 1.5


def test_report_labels_tcg_as_emulation_and_says_what_was_sized_down() -> None:
    rows = [_row(1024, "mpi", 400, None, slowdown=1.25)]
    doc = {"accelerator": {"vm": "tcg"}, "reps": 1, "table": report.table(rows),
           "sized_down": "Sized down: 4096 MiB left out"}  # fmt: skip
    md = report.report_md(doc)
    assert "emulation" in md and "Sized down: 4096 MiB" in md
    assert "| 1024 MiB | mpi | 400 / 400 / 400 | 40 / 40 / 40 | n/a |" in md
    assert "1.25 / 1.25 / 1.25" in md
    doc["accelerator"] = {"vm": "kvm"}
    assert "emulation" not in report.report_md(doc)


def test_sizes_that_do_not_fit_the_host_now_are_left_out_and_named() -> None:
    assert runner.fitting([1024, 2048], 10000) == ([1024, 2048], "")
    fit, note = runner.fitting([1024, 2048, 4096], 5000)
    assert fit == [1024, 2048]  # 2 x (2048 + 256) = 4608 fits in 5000, 2 x 4352 does not
    assert "4096 MiB" in note


@pytest.mark.parametrize(
    ("args", "what"),
    [(([], 3, 10), "--sizes"), (([128], 3, 10), "--sizes"), (([1024], 0, 10), "--reps"),
     (([1024], 3, 1), "--seconds")],
)  # fmt: skip
def test_bad_arguments_are_refused_before_anything_starts(
    args: tuple[list[int], int, int], what: str
) -> None:
    with pytest.raises(InputError) as e:
        runner.preflight(*args)
    assert what in e.value.line()


def test_cli_refuses_bad_sizes_and_host_counts_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hpvc.cli import main

    for argv, named in ((["--sizes", "lots"], "--sizes lots"), (["--hosts", "3"], "--hosts 3")):
        with pytest.raises(SystemExit) as e:
            main(["bench", "migrate", *argv, "--out", "/nonexistent/never-made"])
        assert e.value.code == 2
        assert named in capsys.readouterr().err
    assert cli.parse_sizes("1GiB, 512MiB") == [1024, 512]


def test_a_load_that_failed_is_counted_and_named_and_its_move_kept() -> None:
    ok = _row(1024, "memwrite", 300, 20.0, rep=1)
    bad = _row(1024, "memwrite", 500, 30.0, rep=0, load_failed="writer: exit 255, said nothing")
    rows = [ok, bad]
    table = report.table(rows)
    assert table[0]["n"] == 2 and table[0]["load_failed"] == 1
    assert table[0]["total_ms"]["max"] == 500  # the move itself was measured
    md = report.report_md({"accelerator": {"vm": "tcg"}, "reps": 2, "table": table, "runs": rows})
    assert "| 1 of 2 |" in md and "rep 0 memwrite: writer: exit 255, said nothing" in md


def test_a_stopped_copy_is_said_above_the_table() -> None:
    """A move copied with the guest stopped (TCG before QEMU 9.0) has its whole
    copy as downtime; the report says so, and only then."""
    rows = [_row(1024, "idle", 300, 20.0)]
    doc = {"accelerator": {"vm": "tcg"}, "reps": 1, "table": report.table(rows), "runs": rows}
    assert report.STOPPED_NOTE not in report.report_md(doc)
    rows[0]["stop_and_copy"] = True
    assert report.STOPPED_NOTE in report.report_md(doc)


def test_only_a_load_that_ran_through_the_move_gives_mpi_figures() -> None:
    """A loop that ended before the switch never saw the pause: its slowdown and
    longest round trip are left out, and the table says how many spanned it."""
    inside = _row(1024, "mpi", 400, 50.0, slowdown=2.0, load_spans_move=True,
                  loop={"round_trips": 10, "wrong": 0, "max_gap_ms": 420.0})  # fmt: skip
    before = _row(1024, "mpi", 500, 50.0, slowdown=1.0, load_spans_move=False,
                  loop={"round_trips": 20, "wrong": 0, "max_gap_ms": 30.0})  # fmt: skip
    t = report.table([inside, before])
    assert t[0]["spans"] == 1 and t[0]["slowdown"]["max"] == 2.0
    assert t[0]["loop_gap_ms"] == {"min": 420.0, "median": 420.0, "max": 420.0}
    md = report.report_md({"accelerator": {"vm": "tcg"}, "reps": 2, "table": t, "runs": []})
    assert "| 2.00 / 2.00 / 2.00 | 420 / 420 / 420 | 1 of 2 | 0 of 2 |" in md

"""hpvc.bench.scale.planner: its results document, plot, report and growth words
(not a timing test: the figures are in docs/benchmarks.md "Scale: planner")."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from hpvc.bench.scale import planner


@pytest.fixture
def roots(snapshots: dict[str, Path], tmp_path: Path) -> Path:
    extracted = tmp_path / "roots"  # the already-extracted roots, side by side
    extracted.mkdir()
    for name, root in snapshots.items():
        (extracted / name).symlink_to(root, target_is_directory=True)
    return extracted


def test_fit_names_the_growth() -> None:
    xs = [100.0, 300.0, 1000.0, 3000.0, 10000.0]
    assert planner.fit(xs, [0.2] * 5)["growth"] == "constant"
    assert planner.fit(xs, [x**0.5 for x in xs])["growth"] == "less than linear"
    assert planner.fit(xs, [3e-5 * x for x in xs]) == {"slope": 1.0, "growth": "linear"}
    assert planner.fit(xs, [x * math.log(x) for x in xs])["growth"] == "n log n"
    assert planner.fit(xs, [x * x for x in xs]) == {"slope": 2.0, "growth": "worse than linear"}
    assert planner.fit([100.0], [0.1])["slope"] is None


def test_run_writes_results_plot_and_report(roots: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    seen: list[str] = []
    doc = planner.run(out, 2, sizes=[8, 16], per_host=10, topologies=roots, progress=seen.append)
    assert json.loads((out / "planner.json").read_text())["series"] == doc["series"]
    assert (out / "planner.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["plot"] == "planner.png" and len(seen) == 2 * 2 * 2
    assert [s["scenario"] for s in doc["series"]] == ["hpc-hugepages", "commodity-fill"]
    for s in doc["series"]:
        assert [p["hosts"] for p in s["points"]] == [8, 16]
        assert [p["nodes"] for p in s["points"]] == [80, 160]
        for p in s["points"]:
            for m in planner.MEASURES:
                assert len(p[m]) == 2 and min(p[m]) >= 0
            assert p["wall"]["min"] <= p["wall"]["median"] <= p["wall"]["max"]
            assert 1 <= p["hosts_used"] <= p["hosts"]
        assert s["points"][-1]["hosts_used"] >= 2  # spans hosts: an overlay was timed
        assert s["wall_fit"]["growth"] in {"constant", "less than linear", "linear", "n log n"} | {
            "worse than linear"
        }
    assert doc["goal_met"] is None and doc["goal"]["median_s"] is None
    lines = planner.report_lines(doc)
    assert lines[0] == "### Planner" and "![planner](planner.png)" in lines
    assert sum(1 for x in lines if x.startswith("| hpc-hugepages | ")) == 2
    assert any("not measured" in x for x in lines)


def _doc(median: float) -> dict[str, Any]:
    w = {"min": median, "median": median, "max": median}
    point: dict[str, Any] = {"hosts": 1000, "nodes": 10000, "hosts_used": 399}
    point |= {"wall": w, "cpu": w, "collect": w, "overlay": w}
    point["cpu_us_per_node"] = median / 10000 * 1e6
    fit = {"slope": 1.0, "growth": "linear"}
    fits = {f"{k}_fit": fit for k in ("wall", "cpu", "collect", "overlay")}
    return {
        "sizes": [1000],
        "topologies": ["a"],
        "nodes_per_host": 10,
        "reps": 1,
        "cpu_model": "x",
        "python": "3.11",
        "date": "d",
        "series": [{"scenario": "s", "points": [point], **fits}],
        "goal": {**planner.GOAL, "median_s": median, "cpu_median_s": median},
        "wall_over_cpu": 1.0,
        "goal_met": median < planner.GOAL["seconds"],
    }


def test_report_says_whether_the_goal_is_met() -> None:
    assert any(
        ": met (slower scenario: median 0.200 s" in x for x in planner.report_lines(_doc(0.2))
    )
    assert any(
        "NOT met (slower scenario: median 0.400 s wall" in x
        for x in planner.report_lines(_doc(0.4))
    )


def test_bad_arguments_exit_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert planner.main(["--out", str(out), "--sizes", "ten"]) == 2
    assert planner.main(["--out", str(out), "--reps", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(x.startswith("hpvc: ") for x in err)
    assert not out.exists()

"""`hpvc bench plan` produces a results document and report (not a timing test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpvc.cli import main


def test_bench_plan_writes_results(
    snapshots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extracted = tmp_path / "roots"  # the already-extracted roots, side by side
    extracted.mkdir()
    for name, root in snapshots.items():
        (extracted / name).symlink_to(root, target_is_directory=True)
    out = tmp_path / "out"
    args = ["bench", "plan", "--hosts", "16", "--nodes", "60", "--repeat", "2"]
    with pytest.raises(SystemExit) as e:
        main([*args, "--topologies", str(extracted), "--out", str(out), "--json"])
    assert e.value.code == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc == json.loads(capsys.readouterr().out)
    assert doc["hosts"] == 16 and doc["nodes"] == 60 and len(doc["topologies"]) >= 8
    for s in doc["scenarios"]:
        assert len(s["wall_s"]) == 2 and s["wall"]["min"] <= s["wall"]["median"] <= s["wall"]["max"]
        assert 1 <= s["hosts_used"] <= 16
        nodes = sum(g.get("count", 1) for g in s["spec"]["nodes"])
        assert nodes == 60
    report = (out / "report.md").read_text()
    assert "| hpc-hugepages |" in report and "| commodity-fill |" in report


def test_bench_plan_without_snapshots_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "plan", "--topologies", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("hpvc: ")

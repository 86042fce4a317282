"""hpvc / Podman ratios of `hpvc bench startup`: paired per repetition, goals, report."""

from __future__ import annotations

import pytest

from hpvc.bench.startup import podman_report


def _runs() -> tuple[list[dict[str, float]], dict[str, list[dict[str, float]]]]:
    hpvc = [{"rep": 0, "up_s": 0.4, "down_s": 0.3}, {"rep": 1, "up_s": 0.6, "down_s": 0.6}]
    peer = {
        "parallel": [
            {"rep": 1, "start_s": 1.2, "rm_s": 0.5},
            {"rep": 0, "start_s": 1.0, "rm_s": 0.6},
        ],
        "sequential": [
            {"rep": 0, "start_s": 2.0, "rm_s": 0.6},
            {"rep": 1, "start_s": 2.0, "rm_s": 1.0},
        ],
    }
    return hpvc, peer


def test_ratios_are_paired_by_repetition() -> None:
    hpvc, peer = _runs()
    doc = podman_report.size_doc(8, hpvc, peer)
    up = doc["ratios"]["up_vs_parallel_start"]
    assert (up["n"], up["min"], up["max"]) == (2, pytest.approx(0.4), pytest.approx(0.5))
    assert up["of_medians"] == pytest.approx(0.5 / 1.1)
    assert doc["ratios"]["down_vs_rm"]["max"] == pytest.approx(1.2)
    assert doc["podman"]["sequential"]["start"]["median"] == 2.0
    assert doc["goals"] == {
        "up median <= 0.5 s": True,
        "up <= 0.8x podman parallel start (median ratio)": True,
        "up <= 0.5x podman parallel start (median ratio)": True,
        "down <= 0.8x podman rm (median ratio)": False,
    }


def test_goals_only_at_eight_nodes_and_report_rows() -> None:
    hpvc, peer = _runs()
    size = {"nodes": 4, "up": {}, "down": {}, "peer": podman_report.size_doc(4, hpvc, peer)}
    assert "goals" not in size["peer"]
    assert podman_report.report_lines({"sizes": [size]}) == []
    skipped = {"peer": {"skipped": "podman not found"}, "sizes": [size]}
    assert podman_report.report_lines(skipped) == ["", "Podman side skipped: podman not found."]

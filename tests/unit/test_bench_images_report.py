"""``bench.images.report``: ratios paired per repetition, goals decided from medians."""

from __future__ import annotations

from typing import Any

import pytest

from hpvc.bench.images import report

FACTS = {"host": "h", "cpu_model": "c", "cpus": 2, "kernel": "k", "date": "d",
         "podman": "p", "skopeo": "s", "umoci": "u", "loadavg_start": [1.0],
         "loadavg_end": [1.0]}  # fmt: skip
SETUP = {"base": "hpc", "extra_mib": 700, "nodes": 8, "repeat": 3}
ARCHIVES = [
    {"label": "base", "layers": 1, "archive_bytes": 300 * report.MB},
    {"label": "big", "layers": 2, "archive_bytes": 1000 * report.MB},
]


def samples(hpvc: list[float], load: list[float], again: float) -> list[dict[str, Any]]:
    """Both archives timed alike: hpvc and podman load as given, the rest fixed."""
    out: list[dict[str, Any]] = []
    for rep, (h, p) in enumerate(zip(hpvc, load, strict=True)):
        ways = {"hpvc": h, "hpvc_again": again, "podman_load": p, "tar": 1.0, "skopeo_umoci": 2.0}
        for image in ("base", "big"):
            for config, s in ways.items():
                at = {"rep": rep, "order": len(out), "image": image}
                out.append({**at, "config": config, "seconds": s})
    return out


def runs(built: list[float], imported: list[float]) -> list[dict[str, Any]]:
    return [{"rep": rep, "order": 0, "config": side, "up_s": up, "down_s": 1.0,
             "up_inner_s": up / 2}
            for rep, pair in enumerate(zip(built, imported, strict=True))
            for side, up in zip(report.SIDES, pair, strict=True)]  # fmt: skip


DISK = {
    "base_alone": {"store_bytes": 600, "blobs_bytes": 300, "image_folder_bytes": {"base": 300}},
    "big_alone": {"store_bytes": 2000, "blobs_bytes": 1000, "image_folder_bytes": {"big": 1000}},
    "both": {"store_bytes": 2300, "blobs_bytes": 1000,
             "image_folder_bytes": {"base": 300, "big": 1000}},
}  # fmt: skip


def test_ratios_are_paired_within_a_repetition_and_goals_follow_the_medians() -> None:
    doc = report.document(
        FACTS, SETUP, ARCHIVES,
        samples([10.0, 6.0, 9.0], [5.0, 6.0, 10.0], 0.05),
        runs([2.0, 2.0, 2.0], [2.1, 2.4, 2.0]),
        DISK,
    )  # fmt: skip
    r = doc["imports"]["base"]["ratios"]["hpvc/podman_load"]
    assert r["values"] == pytest.approx([2.0, 1.0, 0.9])
    assert (r["min"], r["median"], r["max"]) == pytest.approx((0.9, 1.0, 2.0))
    assert doc["imports"]["base"]["ratios"]["hpvc/tar"]["median"] == pytest.approx(9.0)
    assert doc["cluster"]["ratio"]["median"] == pytest.approx(1.05)
    met = {g["what"].split(" (")[0]: g["met"] for g in doc["goals"]}
    assert list(met.values()) == [True] * 5
    d = doc["disk"]
    assert (d["sum_alone_bytes"], d["both_bytes"], d["saved_bytes"]) == (2600, 2300, 300)
    assert d["blobs_saved_bytes"] == 300
    assert "NOT met" not in report.report_md(doc)


def test_a_slow_import_a_slow_second_import_and_a_slower_up_fail_their_goals() -> None:
    doc = report.document(
        FACTS, SETUP, ARCHIVES,
        samples([10.0, 12.0, 11.0], [5.0, 6.0, 10.0], 0.2),
        runs([2.0, 2.0, 2.0], [2.3, 2.4, 2.0]),
        DISK,
    )  # fmt: skip
    assert [g["met"] for g in doc["goals"]] == [False] * 5
    assert report.report_md(doc).count("NOT met") == 5

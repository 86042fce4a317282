"""`hpvc bench images` for real on tiny images, 2 repetitions (about 30 s).

The base is a busybox-only root filesystem made an hpvc image in a store of
the test's own; the big image adds 2 MiB. Checks that every way is timed on
both archives in every repetition (the order rotating), that the ratios and
medians are those of the samples, that a store holding both images keeps the
shared base layer once, and that nothing is left behind (clusters, Podman's
private store, temporary folders); it asserts no speed (architecture rule 8).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

import pytest

from hpvc.cli import main
from hpvc.image.importer import import_image
from tests.helpers import prefix_leftovers, requires
from tests.integration.test_image_import import busybox_rootfs

CONFIGS = {"hpvc", "hpvc_again", "podman_load", "tar", "skopeo_umoci"}


def scratch_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("hpvc-bench-images-*")}


def test_bench_images_times_every_way_and_the_ratios_are_the_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    requires("root", "podman", "skopeo", "umoci", "busybox", "crun", "ip")
    store = tmp_path / "images"
    monkeypatch.setenv("HPVC_IMAGE_DIR", str(store))
    import_image("tiny", f"dir:{busybox_rootfs(tmp_path / 'rootfs')}", store=store)
    before = scratch_folders()
    out = tmp_path / "out"
    argv = ["bench", "images", "--base", "tiny", "--extra-mib", "2", "--nodes", "2"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--repeat", "2", "--out", str(out), "--json"])
    assert e.value.code in (0, None)
    doc = json.loads((out / "results.json").read_text())
    assert doc == json.loads(capsys.readouterr().out)
    assert (out / "images.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (doc["benchmark"], doc["repeat"], doc["nodes"], doc["base"]) == ("images", 2, 2, "tiny")
    assert [(a["label"], a["layers"]) for a in doc["archives"]] == [("base", 1), ("big", 2)]

    samples = doc["samples"]
    got = sorted((s["rep"], s["image"], s["config"]) for s in samples)
    assert got == sorted((r, i, c) for r in (0, 1) for i in ("base", "big") for c in CONFIGS)
    assert all(s["seconds"] > 0 for s in samples)
    # The ways and the archives rotate between repetitions.
    first = [next(s for s in samples if s["rep"] == r) for r in (0, 1)]
    assert (first[0]["image"], first[0]["config"]) != (first[1]["image"], first[1]["config"])

    def secs(image: str, config: str) -> list[float]:
        by = {
            s["rep"]: s["seconds"] for s in samples if (s["image"], s["config"]) == (image, config)
        }
        return [by[0], by[1]]

    for image, d in doc["imports"].items():
        for config in CONFIGS:
            assert d["seconds"][config]["median"] == pytest.approx(
                statistics.median(secs(image, config))
            )
        for peer in ("podman_load", "tar", "skopeo_umoci"):
            r = d["ratios"][f"hpvc/{peer}"]
            want = [h / p for h, p in zip(secs(image, "hpvc"), secs(image, peer), strict=True)]
            assert r["values"] == pytest.approx(want)
            assert r["median"] == pytest.approx(statistics.median(want))
            assert (r["min"], r["max"]) == pytest.approx((min(want), max(want)))

    runs = doc["cluster_runs"]
    assert sorted((r["rep"], r["config"]) for r in runs) == [
        (0, "built"), (0, "imported"), (1, "built"), (1, "imported")
    ]  # fmt: skip
    up = {(r["rep"], r["config"]): r["up_s"] for r in runs}
    want = [up[(rep, "imported")] / up[(rep, "built")] for rep in (0, 1)]
    assert doc["cluster"]["ratio"]["values"] == pytest.approx(want)

    # Two images on one base keep the base's layer once: less than each alone.
    disk = doc["disk"]
    blobs_alone = disk["base_alone"]["blobs_bytes"] + disk["big_alone"]["blobs_bytes"]
    assert disk["both"]["blobs_bytes"] < blobs_alone
    assert disk["both_bytes"] < disk["sum_alone_bytes"]
    assert set(disk["both"]["image_folder_bytes"]) == {"base", "big"}

    assert len(doc["goals"]) == 5 and all(isinstance(g["met"], bool) for g in doc["goals"])
    assert scratch_folders() <= before
    assert prefix_leftovers(f"bi{os.getpid() % 100000}") == []
    assert sorted(p.name for p in (store / "names").iterdir()) == ["tiny"]

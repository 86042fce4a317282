"""`hpvc bench io` for real: one repetition, 1 s fio runs.

Checks that the benchmark writes all three parts with positive numbers and
leaves nothing behind (no loop device, mount, cluster or scratch directory of
its own); it asserts no timings (architecture rule 8).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from hpvc.cli import main
from tests.helpers import requires

MARK = "hpvc-bench-io-"  # in the path of the benchmark's loop file and mount


def mine() -> list[str]:
    """Loop devices, mounts, containers and cgroups of this process's benchmark."""
    cluster = f"bio{os.getpid() % 100000}"
    found: list[str] = []
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True)
    found += [x for x in loops.stdout.splitlines() if MARK in x]
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    found += [x for x in mounts if MARK in x or f"/clusters/{cluster}/" in x]
    r = subprocess.run(["crun", "list", "-q"], capture_output=True, text=True, check=False)
    found += [c for c in r.stdout.split() if c.startswith(f"hpvc-{cluster}-")]
    found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/hpvc/{cluster}")]
    found += [f"dir {p}" for p in Path(tempfile.gettempdir()).glob(f"{MARK}*")]
    return found


def positive(s: dict[str, Any]) -> None:
    assert 0 < s["min"] <= s["median"] <= s["max"]


def test_bench_io_one_repetition(tmp_path: Path) -> None:
    requires("root", "crun", "fio")
    before = mine()
    try:
        main(["bench", "io", "--repeat", "1", "--seconds", "1", "--out", str(tmp_path)])
    except SystemExit as e:
        assert e.code in (0, None), f"hpvc bench io exited with {e.code}"
    assert mine() == before
    doc = json.loads((tmp_path / "results.json").read_text())
    assert all(doc[k] for k in ("host", "kernel", "fio", "fio_in_nodes", "disk", "date"))
    assert doc["fio_job"]["runtime_s"] == 1
    assert [(t["node"], t["direction"]) for t in doc["throttle"]] == [
        ("t10", "read"),
        ("t10", "write"),
        ("t20", "read"),
        ("t20", "write"),
    ]
    for t in doc["throttle"]:
        assert t["target_bps"] > 0 and len(t["samples"]) == 1
        positive(t["measured_bps"])
    assert [w["job"] for w in doc["weight"]] == ["seq_read_256k", "rand_read_4k"]
    for w in doc["weight"]:
        positive(w["ratio"])
        positive(w["w100_bps"])
        positive(w["w900_bps"])
    for j in doc["overhead"]["jobs"]:
        assert set(j["bps"]) == {"native", "open", "high"}
        for s in (*j["bps"].values(), *j["ratios"].values()):
            positive(s)
    report = (tmp_path / "report.md").read_text()
    assert "Throttle accuracy" in report and "Weight split" in report and "Overhead" in report

"""`hpvc bench locality` and `hpvc bench startup` for real, one repetition each.

These check that the benchmarks run and write complete results, and that they
leave nothing behind; they assert no timings (benchmarks measure speed, tests
do not: architecture rule 8).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from hpvc.cli import main
from tests.helpers import requires

HOST_KEYS = ("host", "cpu_model", "kernel", "crun", "date", "repeat")


def ours() -> tuple[str, ...]:
    """Prefixes of the clusters this process's benchmarks create (names carry our PID)."""
    pid = os.getpid() % 100000
    return (f"hpvc-bl{pid}", f"hpvc-bs{pid}")


def scratch_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("hpvc-bench-*")}


def leftovers() -> list[str]:
    found: list[str] = []
    r = subprocess.run(["crun", "list", "-q"], capture_output=True, text=True, check=False)
    found += [c for c in r.stdout.split() if c.startswith(ours())]
    netns = Path("/run/netns")
    if netns.is_dir():
        found += [p.name for p in netns.iterdir() if p.name.startswith(ours())]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    found += [w.rstrip(":") for w in links.stdout.split() if w.startswith(ours())]
    found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob("*/hpvc/b[ls]*") if _mine(p)]
    return found


def _mine(p: Path) -> bool:
    return any(p.name.startswith(x.removeprefix("hpvc-")) for x in ours())


def run_cli(argv: list[str]) -> None:
    try:
        main(argv)
    except SystemExit as e:
        assert e.code in (0, None), f"hpvc {' '.join(argv)} exited with {e.code}"


def positive_summary(s: dict[str, Any]) -> None:
    assert {"min", "median", "max"} <= set(s)
    assert 0 < s["min"] <= s["median"] <= s["max"]


@pytest.fixture
def clean() -> Any:
    requires("root", "crun", "mpi")
    before = scratch_dirs()
    yield
    assert leftovers() == []
    assert scratch_dirs() - before == set(), "the benchmark's temporary state was kept"


def test_bench_locality_one_repetition(clean: None, tmp_path: Path) -> None:
    run_cli(["bench", "locality", "--repeat", "1", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "report.md").read_text().count("\n| latency_4B") == 3
    assert all(doc[k] for k in (*HOST_KEYS, "open_mpi"))
    assert list(doc["configs"]) == ["native", "shm", "none"]
    for name, cfg in doc["configs"].items():
        assert len(cfg["runs"]) == 1, name
        for key in doc["metrics"]:
            m = cfg["metrics"][key]
            assert len(m["samples"]) == 1 and m["samples"][0] > 0, (name, key)
            positive_summary(m)
    # The container runs really ran in the cluster's compute nodes.
    assert doc["configs"]["shm"]["runs"][0]["rank0"] == "compute0"
    assert doc["configs"]["none"]["runs"][0]["rank0"] == "compute0"
    assert set(doc["ratios"]) == {"shm", "none"}
    for ratios in doc["ratios"].values():
        for key in doc["metrics"]:
            positive_summary(ratios[key])
            assert isinstance(ratios[key]["meets_goal"], bool)


def test_bench_startup_one_repetition(clean: None, tmp_path: Path) -> None:
    run_cli(
        ["bench", "startup", "--nodes", "1,2", "--repeat", "1", "--no-peer", "--out", str(tmp_path)]
    )
    doc = json.loads((tmp_path / "results.json").read_text())
    assert "| 2 |" in (tmp_path / "report.md").read_text()
    assert all(doc[k] for k in HOST_KEYS)
    assert [s["nodes"] for s in doc["sizes"]] == [1, 2]
    for s in doc["sizes"]:
        assert sum(g["count"] for g in s["groups"]) == s["nodes"]
        assert len(s["runs"]) == 1
        assert all(s["runs"][0][k] > 0 for k in ("up_s", "down_s", "up_inner_s"))
        # Timed as a user runs it: the wall clock holds the CLI's start too.
        assert s["runs"][0]["up_s"] > s["runs"][0]["up_inner_s"]
        positive_summary(s["up"])
        positive_summary(s["down"])
    cli = {r["command"]: r for r in doc["cli"]["commands"]}
    assert {"python -c pass", "hpvc --help", "hpvc ls", "hpvc node ls"} <= set(cli)
    [status] = [c for c in cli if c.startswith("hpvc status ") and c != "hpvc status --help"]
    for row in cli.values():
        assert len(row["runs"]) == 5
        positive_summary(row)
        assert isinstance(row["meets_goal"], bool) or row["command"] == "python -c pass"
    assert cli[status]["median"] > cli["python -c pass"]["median"]
    assert "CLI start" in (tmp_path / "report.md").read_text()


def test_bench_startup_through_a_resident_hpvc(clean: None, tmp_path: Path) -> None:
    run_cli(
        ["bench", "startup", "--nodes", "1", "--repeat", "1", "--no-peer", "--resident",
         "--out", str(tmp_path)]
    )  # fmt: skip
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["resident"] is True
    assert "through a resident hpvc" in (tmp_path / "report.md").read_text()
    [size] = doc["sizes"]
    assert size["runs"][0]["up_s"] > size["runs"][0]["up_inner_s"] > 0
    cli = {r["command"]: r for r in doc["cli"]["commands"]}
    positive_summary(cli["hpvc ls"])


def podman_leftovers() -> list[str]:
    """This process's Podman containers, networks and images (named hpvc-bench-PID)."""
    mine = f"hpvc-bench-{os.getpid()}"
    found: list[str] = []
    for argv in (
        ["ps", "-a", "--format", "{{.Names}}"],
        ["network", "ls", "--format", "{{.Name}}"],
        ["images", "--format", "{{.Repository}}"],
    ):
        r = subprocess.run(["podman", *argv], capture_output=True, text=True, check=True)
        found += [w for w in r.stdout.split() if mine in w]
    return found


def test_bench_startup_with_podman(clean: None, tmp_path: Path) -> None:
    requires("podman")
    bridges_before = _links("cni-podman")
    run_cli(["bench", "startup", "--nodes", "8", "--repeat", "1", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["peer"]["tool"] == "podman" and doc["peer"]["runtime"] == "crun"
    assert "podman parallel start" in (tmp_path / "report.md").read_text()
    [size] = doc["sizes"]
    assert size["nodes"] == 8
    hpvc = size["runs"][0]
    peer = size["peer"]
    for mode in ("parallel", "sequential"):
        [r] = peer["podman"][mode]["runs"]
        assert r["rep"] == hpvc["rep"] == 0
        assert r["start_s"] > 0 and r["rm_s"] > 0
    # The ratios are those of this run's samples.
    par = peer["podman"]["parallel"]["runs"][0]
    seq = peer["podman"]["sequential"]["runs"][0]
    ratios = peer["ratios"]
    assert ratios["up_vs_parallel_start"]["median"] == pytest.approx(hpvc["up_s"] / par["start_s"])
    assert ratios["up_vs_sequential_start"]["median"] == pytest.approx(
        hpvc["up_s"] / seq["start_s"]
    )
    assert ratios["down_vs_rm"]["median"] == pytest.approx(hpvc["down_s"] / par["rm_s"])
    assert all(isinstance(met, bool) for met in peer["goals"].values())
    assert podman_leftovers() == []
    assert _links("cni-podman") <= bridges_before


def _links(prefix: str) -> set[str]:
    r = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return {w.split("@")[0].rstrip(":") for w in r.stdout.split() if w.startswith(prefix)}


def test_bench_startup_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "startup", "--nodes", "1,x"])
    assert e.value.code == 2
    assert "hpvc: --nodes 1,x: not a list of numbers" in capsys.readouterr().err

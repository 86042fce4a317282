"""The hpcc suite for real: native and a tuned container, one repetition, a tiny N.

Checks that every metric comes back positive from both sides, that the
container run really ran in the cluster's node with our input, and that
nothing is left behind; no timings are asserted (architecture rule 8).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from hpvc.bench import ratios
from hpvc.bench.hpcc import parse as hpcc_parse
from hpvc.bench.hpcc import report as hpcc_report
from hpvc.bench.hpcc import runner as hpcc
from hpvc.errors import InputError
from tests.helpers import prefix_leftovers, requires

TINY_N = 512  # a few seconds a side; the real size is hpcc_input.problem_size()


def ours() -> str:
    """Prefix of the clusters this process's hpcc suite creates (names carry our PID)."""
    return f"hc{os.getpid() % 100000}"


def scratch_dirs() -> set[str]:
    tmp = Path(tempfile.gettempdir())
    return {p.name for pat in ("hpvc-bench-*", "hpvc-hpcc-*") for p in tmp.glob(pat)}


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The suite's temporary directories in a folder of this test's own (others' tests on
    this shared machine make hpvc-bench-* in /tmp too); short, for the state's sockets."""
    base = Path(tempfile.mkdtemp(prefix="hpvc-t"))
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    monkeypatch.undo()
    left = sorted(p.name for p in base.iterdir())
    shutil.rmtree(base, ignore_errors=True)
    assert left == [], f"the suite's temporary state was kept: {left}"


def leftovers() -> list[str]:
    prefix = f"hpvc-{ours()}"
    found = prefix_leftovers(ours())
    ps = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True, check=True)
    found += [
        line
        for line in ps.stdout.splitlines()
        if f"{prefix}-" in line and "qemu" in line and not line.startswith("Z")
    ]
    return found


def hpcc_installed() -> None:
    """Like tests.helpers.requires (which has no "hpcc" check): CI refuses to skip."""
    if shutil.which("hpcc") is None:
        if os.environ.get("HPVC_REQUIRE_ALL") == "1":
            pytest.fail("required by HPVC_REQUIRE_ALL=1: hpcc not installed (make setup)")
        pytest.skip("hpcc not installed (make setup)")


@pytest.fixture
def clean(private_tmp: Path) -> Any:
    requires("root", "crun", "mpi", "ip")
    hpcc_installed()
    before = scratch_dirs()
    yield
    assert leftovers() == []
    assert scratch_dirs() - before == set(), "the suite's temporary state was kept"


def test_hpcc_native_and_container_one_repetition(clean: None) -> None:
    doc = hpcc.run(["native", "container"], repeat=1, procs=2, n_override=TINY_N)
    assert doc["suite"] == "hpcc" and doc["input"]["n"] == TINY_N
    assert list(doc["configs"]) == ["native", "container"]
    spec = doc["configs"]["container"]["spec"]
    assert 'kind = "container"' in spec and 'hugepages = "2M"' in spec
    keys = {m.key for m in hpcc_parse.METRICS}
    for config in ("native", "container"):
        got = {s["metric"]: s for s in doc["samples"] if s["config"] == config}
        assert set(got) == keys, config
        for s in got.values():
            assert s["value"] > 0 and s["rep"] == 0 and s["suite"] == "hpcc", s
    assert sorted(r["order"] for r in doc["runs"]) == [0, 1]
    # Rank 0 ran where it should (hpcc's own header says), with our input (HPL_N checked).
    hosts = {r["config"]: r["rank0"] for r in doc["runs"]}
    assert hosts == {"native": platform.node(), "container": "compute0"}
    rows = ratios.ratio_rows(doc["samples"])
    assert all(r["ratio"]["median"] > 0 for r in rows if r["config"] == "container")
    assert "### container" in hpcc_report.report_md(doc)
    # Both sides ran Debian's OpenBLAS, read from rank 0's /proc/PID/maps (issue 33).
    ran = doc["blas"]["ran"]
    assert set(ran) == {"native", "container"} and doc["blas"]["same_everywhere"], ran
    assert all(names == ["OpenBLAS 0.3.21 (pthread)"] for names in ran.values()), ran
    assert doc["sizing"]["asked_n"] == TINY_N and doc["sizing"]["probe"] is None


def test_hpcc_rejects_an_unknown_config() -> None:
    with pytest.raises(InputError) as e:
        hpcc.run(["native", "bare-metal"], repeat=1)
    assert e.value.exit_code == 2 and "bare-metal" in e.value.what


def test_hpcc_in_a_vm_one_repetition(clean: None) -> None:
    requires("qemu")
    doc = hpcc.run(["vm"], repeat=1, procs=2, n_override=TINY_N // 2)
    assert doc["accelerator"] in ("kvm", "tcg")
    assert doc["configs"]["vm"]["n"] == TINY_N // 2
    assert 'kind = "vm"' in doc["configs"]["vm"]["spec"]
    got = {s["metric"]: s["value"] for s in doc["samples"]}
    assert set(got) == {m.key for m in hpcc_parse.METRICS} and all(v > 0 for v in got.values())
    assert doc["runs"][0]["rank0"] == "compute0"  # hpcc ran in the guest
    assert doc["blas"]["ran"] == {"vm": ["OpenBLAS 0.3.21 (pthread)"]}  # the guest's own
    if doc["accelerator"] == "tcg":
        assert "vm" in doc["not_comparable"]

"""`hpvc bench network` for real, 2 short repetitions (about 20 s).

Checks that the benchmark runs on the two-host test bed, writes every sample
of both sides and a report with the paired ratios, and leaves nothing behind
(namespaces, journals, servers); it asserts no speed (architecture rule 8).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from hpvc.cli import main
from tests.helpers import requires


def ours() -> list[str]:
    """Namespaces, scratch directories and servers of this process's test bed."""
    tag = f"n{os.getpid() % 100000}"
    found = [p.name for p in Path("/run/netns").glob(f"hvt{tag}-*")]
    found += [p.name for p in Path(tempfile.gettempdir()).glob(f"hpvc-testbed-{tag}-*")]
    for tool in ("iperf3", "sockperf"):
        r = subprocess.run(["pgrep", "-P", str(os.getpid()), "-x", tool], capture_output=True)
        found += [f"{tool} {pid}" for pid in r.stdout.decode().split()]
    return found


def test_bench_network_writes_both_sides_and_the_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requires("root", "ip", "nft", "iperf3", "sockperf")
    out = tmp_path / "network"
    with pytest.raises(SystemExit) as e:
        main(["bench", "network", "--repeat", "2", "--seconds", "1", "--out", str(out), "--json"])
    assert e.value.code in (0, None)
    doc = json.loads((out / "results.json").read_text())
    assert doc == json.loads(capsys.readouterr().out)
    assert (doc["benchmark"], doc["repeat"], doc["seconds"]) == ("network", 2, 1)
    got = {(s["rep"], s["side"], s["metric"]) for s in doc["samples"]}
    assert got == {
        (r, side, m)
        for r in (0, 1)
        for side in ("fabric", "node")
        for m in ("bandwidth", "latency")
    }
    for s in doc["samples"]:
        assert s["value"] > 0, s
    # The pair measured first alternates between repetitions.
    firsts = [s["side"] for s in doc["samples"] if s["order"] == 0 and s["metric"] == "latency"]
    assert firsts == ["fabric", "node"]
    for key in ("bandwidth", "latency"):
        row = doc["rows"][key]
        assert row["ratio"]["n"] == 2 and len(row["ratios"]) == 2
        assert {"min", "median", "max"} <= set(row["fabric"]) & set(row["node"])
    assert [g["row"] for g in doc["goals"]] == ["bandwidth", "latency"]
    # As on two machines: each host receives on its own CPU, no br_netfilter on bridges.
    bed = doc["testbed"]
    if len(os.sched_getaffinity(0)) >= 2:
        assert bed["rx_cpus"] == doc["pinning"]
    assert bed["bridge_netfilter"] is False
    assert all(v == 0 for k in bed["bridge_netfilter_knobs"].values() for v in k.values())
    md = (out / "report.md").read_text()
    assert "node/fabric bandwidth >= 0.90" in md and "node/fabric latency <= 1.2" in md
    assert "node/fabric min / median / max" in md
    assert ours() == []

"""`bench isolation` for real, with tiny settings (about half a minute).

Checks that every configuration yields samples, that the competing load really
burned CPU in its tenant's cgroup, that the partitioned nodes sat on disjoint
CPUs, and that nothing is left behind. It asserts no timings (architecture rule 8).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from hpvc.bench.isolation import report as isolation_report
from hpvc.bench.isolation import runner as iso
from hpvc.bench.isolation import stats as isolation_stats
from hpvc.units import parse_cpulist
from tests.helpers import prefix_leftovers, requires


def prefix() -> str:
    """Clusters this process's benchmark creates are named bi<pid>h and bi<pid>c."""
    return f"bi{os.getpid() % 100000}"


def scratch_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("hpvc-bench-*")}


def children() -> list[int]:
    """Live processes whose parent is this test process (a crun exec not reaped, say)."""
    me = str(os.getpid())
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
        except OSError:
            continue
        if fields.get("PPid", "").strip() == me and fields.get("State", "")[:1] != "Z":
            out.append(int(status.parent.name))
    return out


def leftovers() -> list[str]:
    found = prefix_leftovers(prefix())
    found += [f"process {pid}" for pid in children()]
    return found


@pytest.fixture
def clean() -> Any:
    requires("root", "crun", "mpi", "ip")
    before = scratch_dirs()
    yield
    assert leftovers() == []
    assert scratch_dirs() - before == set(), "the benchmark's temporary state was kept"


def test_isolation_tiny_run(clean: None) -> None:
    doc = iso.run(repeat=1, samples_per_config=2, hpcc_n=1000)
    assert doc["suite"] == "isolation" and all(doc[k] for k in ("host", "crun", "date"))
    assert list(doc["configs"]) == ["idle", "partitioned", "shared"]
    metrics = [m["metric"] for m in doc["metrics"]]
    for config, cfg in doc["configs"].items():
        assert cfg["describe"] and len(cfg["specs"]) == (1 if config == "idle" else 2)
        for m in metrics:
            values = [
                s["value"] for s in doc["samples"] if s["config"] == config and s["metric"] == m
            ]
            assert len(values) == 2 and all(v > 0 for v in values), (config, m)
            s = doc["summary"][config][m]
            assert s["n"] == 2 and 0 < s["min"] <= s["median"] <= s["max"]
    assert sorted({s["order"] for s in doc["samples"]}) == list(range(6))
    # The competing load burned CPU in the tenant's cgroup during every loaded sample.
    assert doc["load_verified"] is True
    loaded = [x for x in doc["load"] if x["config"] in isolation_stats.LOADED]
    least = isolation_stats.MIN_LOAD_CPUS
    assert len(loaded) == 4 and all(x["tenant_cpus"] >= least for x in loaded)
    assert all(x["hpc_cpus"] > 0 for x in doc["load"])
    # What the kernel held: partitioned apart, shared together.
    visits = {v["config"]: v for v in doc["visits"]}
    part = visits["partitioned"]
    assert set(parse_cpulist(part["hpc_cpus"])).isdisjoint(parse_cpulist(part["tenant_cpus"]))
    shared = visits["shared"]
    assert set(parse_cpulist(shared["hpc_cpus"])) <= set(parse_cpulist(shared["tenant_cpus"]))
    assert all(isinstance(g["met"], bool) for g in doc["goals"])
    assert "| shared |" in isolation_report.report_md(doc)

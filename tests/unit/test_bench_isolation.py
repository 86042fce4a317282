"""`bench isolation`: specs and their plans, statistics, parsing, report (no root)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpvc.bench.hpcc import input as hpcc_input
from hpvc.bench.isolation import layout as isolation_layout
from hpvc.bench.isolation import report as isolation_report
from hpvc.bench.isolation import runner as iso
from hpvc.bench.isolation import stats as isolation_stats
from hpvc.cluster import inspect
from hpvc.cluster.inspect import HostView
from hpvc.errors import HpvcError, InputError
from hpvc.topology import Topology, read_topology
from tests.unit.topogen import make_topology

NAMES = ("bi1h", "bi1c")
SUBNETS = ("10.232.0.0/24", "10.232.1.0/24")


@pytest.fixture(scope="module")
def real(snapshots: dict[str, Path]) -> dict[str, Topology]:
    return {name: read_topology(root) for name, root in snapshots.items()}


def this_host() -> Topology:
    """Like the 2-CPU VM the figures come from: 1 socket, 1 NUMA node, 2 cores."""
    return make_topology(packages=1, cores_per_node=2, threads=1, with_1g=False)


def layouts(topo: Topology) -> dict[str, isolation_layout.Layout]:
    p = iso.partitioning(HostView(topo))
    return isolation_layout.layouts(p, len(topo.online_cpus), NAMES, SUBNETS)


def plan_pair(lay: isolation_layout.Layout, topo: Topology) -> tuple[Any, Any]:
    """The HPC cluster's plan, then the tenant's beside it (None: no tenant)."""
    texts = [lay.hpc] if lay.tenant is None else [lay.hpc, lay.tenant]
    plans = inspect.plan_together(texts, HostView(topo))
    return plans[0], (plans[1] if len(plans) > 1 else None)


def planned(topo: Topology) -> dict[str, tuple[Any, Any]]:
    return {c: plan_pair(lay, topo) for c, lay in layouts(topo).items()}


def check_layouts(topo: Topology) -> isolation_layout.Partitioning:
    """The configurations' plans: apart when partitioned, together when shared."""
    p = iso.partitioning(HostView(topo))
    plans = planned(topo)
    idle_hpc, idle_tenant = plans["idle"]
    part_hpc, part_tenant = plans["partitioned"]
    shared_hpc, shared_tenant = plans["shared"]
    assert idle_tenant is None
    assert idle_hpc.nodes[0].cpuset == part_hpc.nodes[0].cpuset  # idle is placed as partitioned
    hpc_node, tenant_node = part_hpc.nodes[0], part_tenant.nodes[0]
    assert hpc_node.pinning == "dedicated" and len(hpc_node.vcpus) == p.vcpus
    assert tenant_node.pinning == "shared"
    assert set(hpc_node.cpuset).isdisjoint(tenant_node.cpuset)
    assert set(hpc_node.cpuset) | set(tenant_node.cpuset) <= set(topo.online_cpus)
    if p.mode == "hpc":
        held = set(part_hpc.hosts[0].hpc_packages)
        pkg = topo.cpu_package()
        assert held and not {pkg[c] for c in tenant_node.cpuset} & held
    # Shared: both float, and every CPU the HPC node may use the tenant may use too.
    assert shared_hpc.nodes[0].pinning == "shared"
    assert set(shared_hpc.nodes[0].cpuset) <= set(shared_tenant.nodes[0].cpuset)
    # The tenant's spec is the same in both loaded configurations.
    lays = layouts(topo)
    assert lays["partitioned"].tenant == lays["shared"].tenant
    assert [lay.load for lay in lays.values()] == [False, True, True]
    return p


def test_layouts_on_a_two_cpu_one_socket_host() -> None:
    topo = this_host()
    p = check_layouts(topo)
    assert (p.mode, p.partition, p.vcpus) == ("dedicated", "commodity", 1)
    part_hpc, part_tenant = planned(topo)["partitioned"]
    assert part_hpc.nodes[0].cpuset == (0,) and part_tenant.nodes[0].cpuset == (1,)
    shared_hpc, shared_tenant = planned(topo)["shared"]
    assert shared_hpc.nodes[0].cpuset == shared_tenant.nodes[0].cpuset == (0, 1)
    assert len(part_tenant.nodes[0].vcpus) == 2  # unconfined, it would load both CPUs


def test_specs_parse_and_say_what_they_mean() -> None:
    lays = layouts(this_host())
    for lay in lays.values():
        for text in (lay.hpc, lay.tenant):
            if text is None:
                continue
            spec = inspect.spec_of(text)
            assert spec.kind == "container" and spec.tuning.hugepages == "none"
    tenant = inspect.spec_of(lays["shared"].tenant or "")
    assert tenant.name == NAMES[1] and tenant.tuning.partition == "commodity"
    assert tenant.tuning.locality == "none"  # its own PID namespace: down ends every loop


@pytest.mark.parametrize(
    ("snapshot", "mode"),
    [
        ("8em64t-2s2ca2c", "hpc"),
        ("16em64t-4s2c2t", "hpc"),
        ("64amd64-4s2n4ca2co", "hpc"),
        ("20em64t-hybrid-1p6c2t+2ca4co1t", "dedicated"),
        ("offline-cpu0-node0", "dedicated"),
        ("2i386-2t-hugepagesizecount", "dedicated"),
    ],
)
def test_layouts_on_real_machines(real: dict[str, Topology], snapshot: str, mode: str) -> None:
    topo = real[snapshot]
    p = check_layouts(topo)
    assert p.mode == mode
    if snapshot == "16em64t-4s2c2t":  # hyper-threads: the HPC node holds a whole core
        assert p.vcpus == 2
        node = planned(topo)["partitioned"][0].nodes[0]
        assert any(set(node.cpuset) == set(c.cpus) for pk in topo.packages for c in pk.cores)
    if snapshot == "2i386-2t-hugepagesizecount":  # one core of 2 threads: a thread each
        assert p.vcpus == 1


def test_a_one_cpu_host_is_refused() -> None:
    topo = make_topology(packages=1, cores_per_node=1, threads=1, with_1g=False)
    with pytest.raises(InputError, match="cannot hold a pinned HPC node"):
        iso.partitioning(HostView(topo))


def test_describe_names_the_partitioning() -> None:
    assert (
        "socket(s) whole"
        in isolation_layout.describe(isolation_layout.Partitioning("hpc", 1), 1)["partitioned"]
    )
    d = isolation_layout.describe(isolation_layout.Partitioning("commodity", 1), 1)["partitioned"]
    assert "pinned to a core" in d and "no hpc partition" in d
    assert (
        "sibling"
        in isolation_layout.describe(isolation_layout.Partitioning("commodity", 1), 2)[
            "partitioned"
        ]
    )


# --- statistics ------------------------------------------------------------------------


def rows(config: str, metric: str, values: list[float]) -> list[dict[str, Any]]:
    return [
        {
            "suite": "isolation",
            "config": config,
            "metric": metric,
            "unit": "GFLOP/s",
            "higher_is_better": True,
            "rep": 0,
            "order": i,
            "value": v,
        }
        for i, v in enumerate(values)
    ]


def test_stats() -> None:
    s = isolation_stats.stats([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert s["mean"] == 5.0 and s["median"] == 4.5 and (s["min"], s["max"]) == (2.0, 9.0)
    assert s["stdev"] == pytest.approx(2.138, abs=1e-3)  # the sample (n-1) deviation
    assert isolation_stats.stats([3.0])["stdev"] == 0.0


def test_summary_relative_to_idle_and_goals() -> None:
    samples = (
        rows("idle", "HPL", [10.0, 11.0, 12.0])
        + rows("partitioned", "HPL", [9.0, 10.5, 12.0])
        + rows("shared", "HPL", [5.0, 8.0, 11.0])
        + rows("idle", "DGEMM", [6.0, 6.0, 6.0])
        + rows("partitioned", "DGEMM", [6.0, 5.0, 4.0])
    )
    s = isolation_stats.summarize(samples)
    assert s["idle"]["HPL"]["rel_mean_vs_idle"] == 1.0
    assert s["idle"]["HPL"]["rel_stdev_vs_idle"] == 1.0
    assert s["partitioned"]["HPL"]["n"] == 3
    assert s["partitioned"]["HPL"]["rel_mean_vs_idle"] == pytest.approx(10.5 / 11.0)
    assert s["partitioned"]["HPL"]["rel_stdev_vs_idle"] == pytest.approx(1.5)
    assert s["shared"]["HPL"]["rel_stdev_vs_idle"] == pytest.approx(3.0)
    assert s["partitioned"]["DGEMM"]["rel_stdev_vs_idle"] is None  # idle's stdev is 0
    g = {x["metric"]: x for x in isolation_stats.goals(s)}
    assert g["HPL"] == {
        "metric": "HPL",
        "config": "partitioned",
        "stdev_vs_idle_at_most": 2.0,
        "value": pytest.approx(1.5),
        "met": True,
    }
    assert g["DGEMM"]["met"] is False and g["STREAM_Triad"]["value"] is None


def test_rotations() -> None:
    assert isolation_stats.rotations(4) == [
        ["idle", "partitioned", "shared"],
        ["partitioned", "shared", "idle"],
        ["shared", "idle", "partitioned"],
        ["idle", "partitioned", "shared"],
    ]


# --- hpcc output, counters, load -------------------------------------------------------

HPCC_OUT = """junk before
Begin of Summary section.
Success=1
HPL_N=1800
HPL_Tflops=0.00536579
SingleDGEMM_Gflops=6.0068
SingleSTREAM_Triad=38.3822
End of Summary section.
"""


def test_parse_hpcc_takes_the_last_summary() -> None:
    older = HPCC_OUT.replace("6.0068", "1.0")
    got = isolation_stats.parse_hpcc(older + HPCC_OUT, 1800)
    assert got == {"HPL": pytest.approx(5.36579), "DGEMM": 6.0068, "STREAM_Triad": 38.3822}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no summary section"),
        (HPCC_OUT.replace("HPL_N=1800", "HPL_N=1000"), "ran N=1000, not 1800"),
        (HPCC_OUT.replace("Success=1", "Success=0"), "Success != 1"),
        (HPCC_OUT.replace("SingleDGEMM_Gflops=6.0068\n", ""), "SingleDGEMM_Gflops"),
        (HPCC_OUT.replace("6.0068", "nan?"), "SingleDGEMM_Gflops"),
        (HPCC_OUT.replace("6.0068", "0"), "not a rate"),
        (HPCC_OUT.replace("6.0068", "nan"), "not a rate"),
    ],
)
def test_parse_hpcc_refuses_bad_output(text: str, why: str) -> None:
    with pytest.raises(HpvcError, match=why):
        isolation_stats.parse_hpcc(text, 1800)


def test_hpcc_input_is_one_process_of_our_size() -> None:
    text = hpcc_input.input_text(1800, iso.HPCC_NB, 1, 1)
    lines = text.splitlines()
    assert lines[5].split()[0] == "1800" and lines[7].split()[0] == "80"
    assert lines[10].split()[0] == "1" and lines[11].split()[0] == "1"  # P x Q = 1 x 1


def test_load_row_and_verification() -> None:
    where = {"config": "shared", "rep": 1, "order": 4}
    before = {"hpc": 10.0, "tenant": 20.0, "host": 100.0, "steal": 1.0}
    after = {"hpc": 12.0, "tenant": 23.0, "host": 106.0, "steal": 1.5}
    row = isolation_stats.load_row(where, 4.0, before, after, 0.5)
    assert row["config"] == "shared" and row["order"] == 4 and row["wall_s"] == 4.0
    assert (row["hpc_cpus"], row["tenant_cpus"]) == (0.5, 0.75)
    assert row["other_cpus"] == pytest.approx(0.25) and row["steal_cpus"] == 0.125
    idle = isolation_stats.load_row(
        {**where, "config": "idle"}, 4.0, {**before, "tenant": None}, after, 0.5
    )
    assert idle["tenant_cpus"] is None and idle["other_cpus"] == pytest.approx(1.0)
    assert isolation_stats.load_verified([row, idle])
    assert not isolation_stats.load_verified([{**row, "tenant_cpus": 0.1}, idle])
    assert not isolation_stats.load_verified([idle])  # no loaded sample at all proves nothing
    summary = isolation_stats.load_summary([row, idle])
    assert summary["shared"]["tenant_cpus"]["mean"] == 0.75
    assert summary["idle"]["tenant_cpus"] is None and summary["partitioned"]["samples"] == 0


def test_sample_rows_are_the_shared_interface() -> None:
    where = {"config": "partitioned", "rep": 2, "order": 7}
    out = isolation_stats.sample_rows(where, {"HPL": 5.0, "DGEMM": 6.0, "STREAM_Triad": 30.0})
    assert [r["metric"] for r in out] == ["HPL", "DGEMM", "STREAM_Triad"]
    assert out[0] == {
        "suite": "isolation",
        "config": "partitioned",
        "metric": "HPL",
        "unit": "GFLOP/s",
        "higher_is_better": True,
        "rep": 2,
        "order": 7,
        "value": 5.0,
    }


@pytest.mark.parametrize(("repeat", "samples", "n"), [(0, 3, 1800), (1, 1, 1800), (3, 3, 50)])
def test_bad_settings_are_input_errors(repeat: int, samples: int, n: int) -> None:
    with pytest.raises(InputError) as e:
        iso.preflight(repeat, samples, n)
    assert e.value.exit_code == 2


# --- the document and its report -------------------------------------------------------


def fake_doc() -> dict[str, Any]:
    topo = this_host()
    p = iso.partitioning(HostView(topo))
    lays = isolation_layout.layouts(p, len(topo.online_cpus), NAMES, SUBNETS)
    r = isolation_report.Outcome(lays, p, 1, 2, 2000)
    values = {"idle": [6.0, 6.2], "partitioned": [5.9, 6.1], "shared": [3.0, 4.5]}
    for config, vals in values.items():
        r.visits.append({"config": config, "rep": 0, "hpc_cpus": "0", "tenant_cpus": "1"})
        for v in vals:
            where = {"config": config, "rep": 0, "order": len(r.load)}
            tenant = None if config == "idle" else 0.0
            before = {"hpc": 0.0, "tenant": tenant, "host": 0.0, "steal": 0.0}
            after = {"hpc": 4.0, "tenant": 4.0, "host": 9.0, "steal": 0.0}
            r.load.append(isolation_stats.load_row(where, 5.0, before, after, 0.5))
            r.samples += isolation_stats.sample_rows(
                where, {"HPL": v, "DGEMM": v, "STREAM_Triad": 10 * v}
            )
    facts = {
        "host": "h",
        "cpu_model": "AMD EPYC",
        "cpus": 2,
        "kernel": "6.1",
        "crun": "crun 1.8",
        "open_mpi": "Open MPI 4.1",
        "date": "2026-01-01T00:00:00Z",
    }
    return isolation_report.document(facts, r, 1, 42.0, [0.0, 0.0, 0.0])


def test_document() -> None:
    doc = fake_doc()
    assert doc["suite"] == "isolation" and doc["partition_mode"] == "dedicated"
    assert list(doc["configs"]) == ["idle", "partitioned", "shared"]
    assert len(doc["configs"]["idle"]["specs"]) == 1
    assert len(doc["configs"]["shared"]["specs"]) == 2
    assert len(doc["samples"]) == 3 * 2 * 3
    assert doc["load_verified"] is True
    assert [g["metric"] for g in doc["goals"]] == ["HPL", "DGEMM", "STREAM_Triad"]
    assert doc["summary"]["shared"]["HPL"]["rel_mean_vs_idle"] == pytest.approx(3.75 / 6.1)


def test_report_md() -> None:
    md = isolation_report.report_md(fake_doc())
    assert md.count("\n| HPL (GFLOP/s) |") == 3
    assert md.count("\n| STREAM_Triad (GB/s) |") == 3
    assert "| shared | 2 | 3.75 | 1.06 |" in md
    assert "- HPL: partitioned stdev <= 2.0 x idle's: met (1.00)" in md
    burned = f"burned >= {isolation_stats.MIN_LOAD_CPUS} CPUs during every loaded sample): yes"
    assert burned in md
    assert "| idle | 0.80 (0.80-0.80) | - | 1.00 (1.00-1.00) |" in md
    assert "| 0 / 1 |" in md
    assert "Partition mode on this host: dedicated." in md

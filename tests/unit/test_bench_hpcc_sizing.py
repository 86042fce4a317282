"""HPL's N from the cache, memory and a time budget (hpcc.sizing), and the BLAS
named from the files a run had mapped (hpcc.blas). Pure: hosts are numbers, a
fake probe, or the topology snapshots read from their files; only the CLI's
refusals read this host's free memory (and change nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.bench.hpcc import blas, sizing
from hpvc.bench.hpcc import input as hpcc_input
from hpvc.bench.hpcc import runner as hpcc
from hpvc.errors import InputError
from hpvc.host import hwinfo
from hpvc.topology import read_topology
from tests.unit.test_image import run_cli

MIB = 2**20
# The machine of issue 33: a Xeon reporting a 480 MiB L3, 7875 MiB free for a node;
# with the reference BLAS one native run at N=15872 took over 6 minutes (~7 GFLOP/s).
XEON_L3 = 480 * MIB
XEON_MEM = 7875
XEON_REFERENCE = sizing.Probe(n=2048, wall_s=25.0, hpl_s=2.3, hpl_gflops=2.5)
# This project's 2-CPU EPYC VM (32 MiB L3) with OpenBLAS: a probe as measured here.
EPYC_L3 = 32 * MIB
EPYC_OPENBLAS = sizing.Probe(n=2048, wall_s=5.4, hpl_s=0.16, hpl_gflops=36.6)


def test_the_cache_alone_gives_the_issues_n_on_the_xeon() -> None:
    got = sizing.choose(llc_bytes=XEON_L3, procs=2, mem_mib=64 * 1024)
    assert got.cache_n == 15872 == got.n  # no probe: no budget cap, and memory enough
    assert got.budget_n is None and got.predicted_s is None


def test_the_budget_scales_the_xeon_down_to_a_run_within_it() -> None:
    got = sizing.choose(llc_bytes=XEON_L3, procs=2, mem_mib=XEON_MEM, probe=XEON_REFERENCE)
    step = sizing.step(2)
    assert got.n == got.budget_n and got.n < got.cache_n
    assert got.n % step == 0
    assert sizing.predict_s(got.n, XEON_REFERENCE) <= sizing.BUDGET_S
    assert sizing.predict_s(got.n + step, XEON_REFERENCE) > sizing.BUDGET_S
    assert got.predicted_s is not None and got.predicted_s <= sizing.BUDGET_S
    said = " ".join(got.reasons)
    assert "time budget" in said and "15872" in said
    assert "partly measure the cache" in said  # the matrix is now under 4x the L3


def test_a_faster_blas_or_a_longer_budget_never_gives_a_smaller_n() -> None:
    fast = sizing.Probe(2048, XEON_REFERENCE.wall_s, 0.3, 20.0)
    ns = [
        sizing.choose(llc_bytes=XEON_L3, procs=2, mem_mib=10**6, probe=p, budget_s=b).n
        for p in (XEON_REFERENCE, fast)
        for b in (30.0, 60.0, 600.0)
    ]
    assert ns[:3] == sorted(ns[:3]) and ns[3:] == sorted(ns[3:])
    assert all(a <= b for a, b in zip(ns[:3], ns[3:], strict=True))
    assert ns[-1] > ns[0]


def test_the_epyc_keeps_its_cache_size_within_the_budget() -> None:
    got = sizing.choose(llc_bytes=EPYC_L3, procs=2, mem_mib=18000, probe=EPYC_OPENBLAS)
    assert got.n == got.cache_n == hpcc_input.problem_size(hpcc_input.MATRIX_MIB, 2, EPYC_L3)
    assert got.budget_n is not None and got.budget_n >= got.n
    assert len(got.reasons) == 1 and got.reasons[0].startswith("cache")


@pytest.mark.parametrize("mem", [600, 1024, 2048, 4096])
def test_memory_caps_n_so_its_node_fits(mem: int) -> None:
    got = sizing.choose(llc_bytes=XEON_L3, procs=2, mem_mib=mem)
    assert hpcc_input.node_memory_mib(got.n) <= mem
    assert hpcc_input.node_memory_mib(got.n + sizing.step(2)) > mem
    assert got.n == got.memory_n < got.cache_n
    assert any("by memory" in r for r in got.reasons)


def test_an_asked_n_is_kept_over_the_budget_and_says_so() -> None:
    got = sizing.choose(
        llc_bytes=XEON_L3, procs=2, mem_mib=64 * 1024, probe=XEON_REFERENCE, asked_n=15872
    )
    assert got.n == 15872 == got.asked_n
    assert got.predicted_s is not None and got.predicted_s > sizing.BUDGET_S
    assert any("over the 60 s budget" in r for r in got.reasons)


@pytest.mark.parametrize("asked", [0, 15872])  # 15872 needs 7936 MiB: over the Xeon's 7875
def test_an_asked_n_that_cannot_run_is_refused(asked: int) -> None:
    with pytest.raises(InputError) as e:
        sizing.choose(llc_bytes=XEON_L3, procs=2, mem_mib=XEON_MEM, asked_n=asked)
    assert "--hpl-n" in e.value.what


@pytest.mark.parametrize("procs", [1, 2, 4, 6])
def test_probe_n_and_budget_n_are_whole_blocks_per_rank(procs: int) -> None:
    step = hpcc_input.NB * procs
    assert sizing.probe_n(procs) % step == 0 and sizing.probe_n(procs) >= step
    tiny = sizing.Probe(2048, 1000.0, 900.0, 0.01)  # nothing fits: still one step
    assert sizing.budget_n(tiny, 1.0, procs) == step


@pytest.mark.parametrize(
    "name", ["40intel64-4n10c+pci-conflicts", "64amd64-4s2n4ca2co", "16amd64-8n2c"]
)
def test_sizes_on_the_snapshots_fit_their_memory_and_cache_rule(
    snapshots: dict[str, Path], name: str
) -> None:
    root = snapshots[name]
    topo = read_topology(root)
    mem = sum(n.free_mib for n in topo.numa_nodes)
    llc = hwinfo.llc_bytes(root)
    assert llc > 0 and mem > 0
    procs = min(4, len(topo.online_cpus))
    got = sizing.choose(llc_bytes=llc, procs=procs, mem_mib=mem, probe=EPYC_OPENBLAS)
    assert hpcc_input.node_memory_mib(got.n) <= mem
    assert got.n <= got.cache_n and got.n % sizing.step(procs) == 0
    assert got.predicted_s is not None and got.predicted_s <= sizing.BUDGET_S


def test_identify_names_the_libraries_debian_ships() -> None:
    ob = "/usr/lib/x86_64-linux-gnu/openblas-pthread/"
    assert blas.identify([ob + "libblas.so.3", ob + "libopenblasp-r0.3.21.so"]) == (
        "OpenBLAS 0.3.21 (pthread)"
    )
    assert blas.identify(["/usr/lib/x86_64-linux-gnu/openblas-serial/libopenblas-r0.3.21.so"]) == (
        "OpenBLAS 0.3.21 (serial)"
    )
    assert blas.identify(["/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0"]) == (
        "Netlib reference BLAS"
    )
    assert blas.identify([]).startswith("unknown")


def test_mapped_paths_are_read_from_the_marked_lines_only() -> None:
    text = f"{blas.MAPPED}/b/libblas.so.3\nHPL_N=4096\n{blas.MAPPED}/a/x.so\n{blas.MAPPED}/a/x.so\n"
    assert blas.mapped_paths(text) == ["/a/x.so", "/b/libblas.so.3"]


def test_every_rank_gets_the_same_blas_settings() -> None:
    assert blas.env("openblas") == {
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "LD_LIBRARY_PATH": blas.OPENBLAS_DIR,
    }
    assert "LD_LIBRARY_PATH" not in blas.env("system")
    text = hpcc_input.input_text(1000, 128, 1, 2)
    assert hpcc.node_argv("/d", text, "openblas")[-1] == blas.OPENBLAS_DIR
    assert hpcc.node_argv("/d", text, "system")[-1] == ""


def test_missing_openblas_is_named(tmp_path: Path) -> None:
    assert blas.missing("system", tmp_path) is None
    assert blas.OPENBLAS_PACKAGE in (blas.missing("openblas", tmp_path) or "")
    lib = tmp_path / blas.OPENBLAS_DIR.lstrip("/") / "libblas.so.3"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    assert blas.missing("openblas", tmp_path) is None


def test_summary_says_when_the_sides_ran_different_libraries() -> None:
    runs = [
        {"config": "native", "blas": "OpenBLAS 0.3.21 (pthread)"},
        {"config": "container", "blas": "OpenBLAS 0.3.21 (pthread)"},
    ]
    assert blas.summary("openblas", runs)["same_everywhere"] is True
    runs.append({"config": "vm", "blas": "Netlib reference BLAS"})
    got = blas.summary("openblas", runs)
    assert got["same_everywhere"] is False and got["image"] == "hpc-openblas"
    assert got["ran"]["vm"] == ["Netlib reference BLAS"]


@pytest.mark.parametrize(
    "args,said",
    [
        (["--hpl-n", "100000"], "--hpl-n 100000: needs 305408 MiB"),
        (["--blas", "mkl"], "--blas mkl: unknown"),
        (["--time-budget", "0"], "--time-budget"),
    ],
)
def test_bad_hpcc_options_are_one_line_exit_2_and_nothing_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    out = tmp_path / "run"
    code, _, err = run_cli(["bench", "run", "--suite", "hpcc", "--out", str(out), *args], capsys)
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()

"""The hpcc suite's pure parts (input file, problem size, output parsing, ratios, report)
and the runner's checks that need no root (preflight, rotations, settle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpvc.bench import ratios
from hpvc.bench.hpcc import configs as hpcc_configs
from hpvc.bench.hpcc import input as hpcc_input
from hpvc.bench.hpcc import parse as hpcc_parse
from hpvc.bench.hpcc import report as hpcc_report
from hpvc.bench.hpcc import runner as hpcc
from hpvc.cluster import inspect
from hpvc.errors import HpvcError, InputError

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "hpccoutf-sample.txt"  # a real run: N=4096, 2 ranks, this 2-CPU VM
EXAMPLE = Path("/usr/share/doc/hpcc/examples/_hpccinf.txt")  # Debian's hpcc package


def test_input_text_puts_n_nb_and_grid_on_their_hpl_dat_lines() -> None:
    lines = hpcc_input.input_text(4096, 128, 1, 2).splitlines()
    # HPL.dat: line 6 Ns, 8 NBs, 11 Ps, 12 Qs; the counts above each are 1.
    assert lines[5].split()[:2] == ["4096", "Ns"]
    assert lines[7].split()[:2] == ["128", "NBs"]
    assert lines[10].split()[:2] == ["1", "Ps"]
    assert lines[11].split()[:2] == ["2", "Qs"]
    assert [lines[i].split()[0] for i in (4, 6, 9)] == ["1", "1", "1"]
    assert lines[3].split()[0] == "8"  # device out: a file (hpccoutf.txt)
    assert lines[31].startswith("#####") and len(lines) == 36  # hpcc's PTRANS lines follow


def test_input_text_matches_debians_example_but_for_the_four_values() -> None:
    if not EXAMPLE.is_file():
        pytest.skip(f"{EXAMPLE} not installed (apt-get install hpcc)")
    ours = hpcc_input.input_text(1000, 80, 2, 2).splitlines()
    theirs = EXAMPLE.read_text().splitlines()
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.split() == b.split()  # same tokens; only spacing may differ


@pytest.mark.parametrize("procs,want", [(1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (6, (2, 3))])
def test_grid_is_as_square_as_it_gets(procs: int, want: tuple[int, int]) -> None:
    assert hpcc_input.grid(procs) == want


@pytest.mark.parametrize("llc", [512 << 10, 8 << 20, 32 << 20, 256 << 20])
@pytest.mark.parametrize("procs", [1, 2, 4])
def test_problem_size_keeps_the_arrays_above_the_llc(llc: int, procs: int) -> None:
    for mem in (1, 16, 128, 1024):
        n = hpcc_input.problem_size(mem, procs, llc)
        assert 8 * n * n >= hpcc_input.LLC_FACTOR * llc
        assert n % (hpcc_input.NB * procs) == 0


def test_problem_size_grows_with_memory_and_fits_it() -> None:
    sizes = [hpcc_input.problem_size(mem, 2, 32 << 20) for mem in range(16, 4096, 16)]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    n = hpcc_input.problem_size(2048, 2, 32 << 20)
    assert 8 * n * n <= 2048 << 20


def test_problem_size_here_is_4096() -> None:
    """The size measured for a 2-CPU EPYC VM: 32 MiB L3, 128 MiB matrix, ~22 s native."""
    assert hpcc_input.problem_size(hpcc_input.MATRIX_MIB, 2, 32 << 20) == 4096


def test_node_memory_holds_the_run() -> None:
    assert hpcc_input.node_memory_mib(1000) == hpcc_input.MIN_NODE_MIB
    for n in (4096, 8192, 20000):
        mib = hpcc_input.node_memory_mib(n)
        assert mib % 256 == 0 and mib * 2**20 >= 4 * 8 * n * n


def test_parse_a_real_output() -> None:
    got = hpcc_parse.parse(SAMPLE.read_text())
    assert set(got) == {m.key for m in hpcc_parse.METRICS}
    assert got["HPL"] == pytest.approx(9.31081)  # HPL_Tflops=0.00931081, in GFLOP/s
    assert got["DGEMM"] == pytest.approx(4.2404)
    assert got["STREAM_Triad"] == pytest.approx(16.6603)
    assert got["STREAM_Copy"] == pytest.approx(15.5011)
    assert got["RandomAccess"] == pytest.approx(0.0851639)
    assert got["FFT"] == pytest.approx(4.01473)
    assert got["PingPong_latency"] == pytest.approx(0.129944)
    assert got["PingPong_bandwidth"] == pytest.approx(17.0822)
    assert hpcc_parse.summary_fields(SAMPLE.read_text())["HPL_N"] == "4096"


def test_parse_takes_the_last_run_of_an_appended_file() -> None:
    text = SAMPLE.read_text()
    older = text.replace("HPL_Tflops=0.00931081", "HPL_Tflops=0.001")
    assert hpcc_parse.parse(older + text)["HPL"] == pytest.approx(9.31081)
    assert hpcc_parse.parse(text + older)["HPL"] == pytest.approx(1.0)


def test_checked_refuses_another_n_or_a_failed_check() -> None:
    text = SAMPLE.read_text()
    assert hpcc_parse.checked(text, 4096, "x")["HPL"] > 0
    with pytest.raises(HpvcError, match="N=4096, not 1000"):
        hpcc_parse.checked(text, 1000, "x")
    with pytest.raises(HpvcError, match="Success"):
        hpcc_parse.checked(text.replace("Success=1", "Success=0"), 4096, "x")


@pytest.mark.parametrize("cut", ["End of Summary section.", "Begin of Summary section."])
def test_parse_a_cut_short_output_raises_with_its_tail(cut: str) -> None:
    text = SAMPLE.read_text()
    short = text[: text.index(cut)]
    with pytest.raises(HpvcError) as e:
        hpcc_parse.parse(short)
    assert "no summary section" in e.value.why
    assert short.strip().splitlines()[-1] in e.value.why  # the tail, to see what happened


def test_parse_empty_output_raises() -> None:
    with pytest.raises(HpvcError, match="no output"):
        hpcc_parse.parse("")


def test_parse_a_summary_without_a_metric_raises() -> None:
    text = SAMPLE.read_text().replace("StarFFT_Gflops=", "StarFFT_gone=")
    with pytest.raises(HpvcError, match="StarFFT_Gflops"):
        hpcc_parse.parse(text)


def test_node_argv_is_one_line_per_argument() -> None:
    argv = hpcc.node_argv("/tmp/d", hpcc_input.input_text(1000, 128, 1, 2))
    assert argv[:2] == ["sh", "-c"] and argv[4] == "/tmp/d"
    assert all("\n" not in a for a in argv)  # survives ssh's quoting for VM ranks
    assert argv[5].replace("\\n", "\n") == hpcc_input.input_text(1000, 128, 1, 2)


def _s(config: str, metric: str, rep: int, value: float, hib: bool = True) -> dict[str, Any]:
    return {
        "suite": "hpcc",
        "config": config,
        "metric": metric,
        "unit": "u",
        "higher_is_better": hib,
        "rep": rep,
        "order": 0,
        "value": value,
    }


def test_ratio_rows_pair_by_repetition() -> None:
    samples = [
        _s("native", "HPL", 0, 10.0),
        _s("native", "HPL", 1, 20.0),
        _s("native", "HPL", 2, 40.0),
        _s("c", "HPL", 2, 20.0),  # order of samples does not matter, the rep does
        _s("c", "HPL", 0, 10.0),
        _s("c", "HPL", 1, 30.0),
    ]
    rows = {(r["config"], r["metric"]): r for r in ratios.ratio_rows(samples)}
    base, c = rows[("native", "HPL")], rows[("c", "HPL")]
    assert base["ratio"] is None
    assert (base["min"], base["median"], base["max"]) == (10.0, 20.0, 40.0)
    assert (c["min"], c["median"], c["max"]) == (10.0, 20.0, 30.0)
    # Paired: 10/10, 30/20, 20/40, not the ratio of the medians (20/20).
    assert c["ratio"] == {"n": 3, "min": 0.5, "median": 1.0, "max": 1.5}


def test_ratio_rows_invert_latency() -> None:
    samples = [
        _s("native", "PingPong_latency", 0, 2.0, hib=False),
        _s("c", "PingPong_latency", 0, 4.0, hib=False),
        _s("d", "PingPong_latency", 0, 1.0, hib=False),
    ]
    rows = {r["config"]: r for r in ratios.ratio_rows(samples)}
    assert rows["c"]["ratio"]["median"] == 0.5  # twice the latency: half as good
    assert rows["d"]["ratio"]["median"] == 2.0


def test_ratio_rows_without_a_baseline_pair_give_no_ratio() -> None:
    samples = [_s("native", "HPL", 0, 10.0), _s("c", "HPL", 1, 10.0), _s("c", "FFT", 0, 1.0)]
    rows = {(r["config"], r["metric"]): r for r in ratios.ratio_rows(samples)}
    assert rows[("c", "HPL")]["ratio"] is None  # rep 1 has no native
    assert rows[("c", "FFT")]["ratio"] is None  # no native FFT at all
    assert [r["config"] for r in ratios.ratio_rows(samples, baseline="c")] == ["native", "c", "c"]


def test_ratio_rows_keep_suites_apart() -> None:
    samples = [_s("native", "HPL", 0, 10.0), {**_s("c", "HPL", 0, 5.0), "suite": "other"}]
    rows = ratios.ratio_rows(samples)
    assert [r["ratio"] for r in rows] == [None, None]


def _doc(configs: list[str], n: int = 4096) -> dict[str, Any]:
    samples = []
    for rep in range(3):
        for c in configs:
            for m in hpcc_parse.METRICS:
                v = (1.0 + rep) * (0.98 if c != "native" else 1.0)
                samples.append({**_s(c, m.key, rep, v, m.higher_is_better), "unit": m.unit})
    described = {c: {"describe": c, "spec": None, "n": 1000 if c == "vm" else n} for c in configs}
    runs = [{"config": c, "rep": r, "order": 0, "wall_s": 1.0} for r in range(3) for c in configs]
    facts = {
        "host": "h",
        "cpu_model": "cpu",
        "cpus": 2,
        "kernel": "k",
        "crun": "crun 1",
        "date": "d",
    }
    return hpcc_report.document(
        facts, configs, described, samples, runs, n, 32 << 20, 2, "tcg", [0.0, 0.0, 0.0]
    )


def test_document_goals_and_report() -> None:
    doc = _doc(["native", "container", "vm"])
    assert doc["input"] == {
        "n": 4096,
        "nb": 128,
        "p": 1,
        "q": 2,
        "llc_bytes": 32 << 20,
        "matrix_bytes": 8 * 4096**2,
    }
    assert doc["repeat"] == 3 and doc["suite"] == "hpcc"
    assert {g["metric"] for g in doc["goals"]} == {"HPL", "DGEMM", "STREAM_Triad", "STREAM_Copy"}
    assert all(g["config"] == "container" and g["vs"] == "native" for g in doc["goals"])
    assert "vm" in doc["not_comparable"] and "tcg" in doc["not_comparable"]["vm"]
    report = hpcc_report.report_md(doc)
    assert report.count("### ") == 3
    # Ratios 0.98 (latency inverted: 1/0.98) meet the 0.97 goal.
    assert (
        "| HPL | GFLOP/s | 0.98 | 1.96 | 2.94 | 0.980 | 0.980 | 0.980 | >= 0.97 | yes |" in report
    )
    assert "| PingPong_latency | us | 0.98 | 1.96 | 2.94 | 1.020 | 1.020 | 1.020 |  |  |" in report
    vm = report[report.index("### vm") :]
    assert "| HPL | GFLOP/s | 0.98 | 1.96 | 2.94 | n/a |" in vm  # TCG, another N: no ratio


def test_goal_not_met_says_no() -> None:
    rows = [
        {"config": "container", "metric": "HPL", "ratio": {"min": 0.9, "median": 0.96, "max": 1.0}}
    ]
    goals = [
        {"metric": "HPL", "config": "container", "vs": "native", "median_ratio_at_least": 0.97}
    ]
    assert ratios.goal_of(rows[0], goals, "native") is False
    assert ratios.goal_of({**rows[0], "metric": "FFT"}, goals, "native") is None


@pytest.mark.parametrize(
    "configs,repeat,procs,match",
    [
        ([], 1, 2, "no configuration"),
        (["native", "bogus"], 1, 2, "unknown"),
        (["native", "native"], 1, 2, "twice"),
        (["native"], 0, 2, "--repeat"),
        (["native"], 1, 0, "--procs"),
        (["native"], 1, 10_000, "--procs"),
    ],
)
def test_preflight_refuses_bad_input(
    configs: list[str], repeat: int, procs: int, match: str
) -> None:
    with pytest.raises(InputError, match=match) as e:
        hpcc.preflight(configs, repeat, procs)
    assert e.value.exit_code == 2


def test_rotations_put_every_config_first_once() -> None:
    got = list(hpcc.rotations(["a", "b", "c"], 3))
    assert [c for r, _, c in got if r == 1] == ["b", "c", "a"]
    firsts = [c for _, order, c in got if order == 0]
    assert sorted(firsts) == ["a", "b", "c"]


def test_spec_text_sets_the_ablated_tuning_only() -> None:
    def tuning(name: str) -> set[str]:
        text = hpcc_configs.spec_text(hpcc_configs.CONFIGS[name], "hc1c", "10.9.9.0/24", 2, 512)
        return {x for x in text.splitlines() if " = " in x}

    base = tuning("container")
    assert {'pinning = "dedicated"', 'hugepages = "2M"', 'numa = "mirror"'} <= base
    assert base - tuning("container-nopin") == {'pinning = "dedicated"'}
    assert base - tuning("container-nohuge") == {'hugepages = "2M"'}
    assert base - tuning("container-nonuma") == {'numa = "mirror"'}
    assert base ^ tuning("vm") == {'kind = "container"', 'kind = "vm"'}


def test_settle_falls_back_to_shared_only_where_that_fits(
    snapshots: dict[str, Path], tmp_path: Path
) -> None:
    # 2 CPUs: a dedicated 2-vCPU VM needs a third for its emulator threads.
    # 8 CPUs: it fits. No 2M pool: neither way fits, the spec stays as asked.
    small = snapshots.get("2i386-2t-hugepagesizecount")
    big = snapshots.get("8em64t-2s2ca2c")
    nopool = snapshots.get("16amd64-8n2c")
    if small is None or big is None or nopool is None:
        pytest.skip("topology snapshots 2i386-2t-hugepagesizecount/8em64t-2s2ca2c/... not found")
    vm = hpcc_configs.CONFIGS["vm"]
    got, text = hpcc.settle(vm, tmp_path, "hc1v", "10.9.9.0/24", 2, 1000, root=big)
    assert got == vm and 'pinning = "dedicated"' in text
    got, text = hpcc.settle(vm, tmp_path, "hc1v", "10.9.9.0/24", 2, 1000, root=small)
    assert got.pinning == "shared" and 'pinning = "shared"' in text
    assert "pinning shared: " in got.describe and "emulator" in got.describe
    assert (tmp_path / "hc1v.toml").read_text() == text
    got, text = hpcc.settle(vm, tmp_path, "hc1v", "10.9.9.0/24", 2, 1000, root=nopool)
    assert got == vm and (tmp_path / "hc1v.toml").read_text() == text
    assert inspect.why_spec_file_not_fit(tmp_path / "hc1v.toml", nopool) is not None

"""`hpvc bench run/report/compare`: samples, goals, reports, plots and adapters.

No root and no real benchmark: suite documents are made up here (or read from
the committed runs in docs/results), and `bench run` runs fake suites.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hpvc.bench import common, harness, plots, report
from hpvc.cli import app, main
from hpvc.errors import HpvcError, InputError

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def sample(
    suite: str,
    config: str,
    metric: str,
    value: float,
    rep: int,
    hib: bool = True,
    unit: str = "GFLOP/s",
    order: int = 0,
) -> dict[str, Any]:
    return {
        "suite": suite,
        "config": config,
        "metric": metric,
        "unit": unit,
        "higher_is_better": hib,
        "rep": rep,
        "order": order,
        "value": value,
    }


def series(suite: str, config: str, metric: str, values: list[float], **kw: Any) -> list[Any]:
    return [sample(suite, config, metric, v, rep, **kw) for rep, v in enumerate(values)]


def hpcc_doc(hpl: list[float], lat: list[float]) -> dict[str, Any]:
    """native vs container: HPL (rate) and latency (time, lower is better)."""
    s = series("hpcc", "native", "HPL", [10.0, 12.0, 11.0])
    s += series("hpcc", "container", "HPL", hpl)
    s += series("hpcc", "container-nopin", "HPL", [8.0, 9.0, 10.0])
    s += series("hpcc", "native", "latency", [2.0, 2.0, 2.0], hib=False, unit="us")
    s += series("hpcc", "container", "latency", lat, hib=False, unit="us")
    goals = [
        {"metric": m, "config": "container", "vs": "native", "median_ratio_at_least": 0.97}
        for m in ("HPL", "latency")
    ]
    return {"samples": s, "goals": goals, "problem": "N=2000"}


def isolation_doc() -> dict[str, Any]:
    s = series("isolation", "idle", "DGEMM", [10.0, 10.2, 9.8, 10.1])
    s += series("isolation", "partitioned", "DGEMM", [10.0, 9.0, 11.0, 10.0])
    s += series("isolation", "shared", "DGEMM", [6.0, 9.0, 3.0, 8.0])
    # The suite says met; the samples say otherwise (stdev ratio ~ 4.6): samples win.
    goals = [
        {"metric": "DGEMM", "config": "partitioned", "stdev_vs_idle_at_most": 2.0, "met": True}
    ]
    return {"samples": s, "goals": goals}


def committed(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((REPO / "docs/results" / name / "results.json").read_text())
    return doc


def run_doc(hpcc: dict[str, Any] | None = None) -> dict[str, Any]:
    """A whole `bench run` document: the four suites (io and startup from docs/results)."""
    io_doc = committed("io")
    io_doc["samples"], io_doc["goals"] = harness.io_samples(io_doc)
    st = committed("startup")
    for size in st["sizes"]:  # this committed run predates the per-phase times
        size.setdefault("phases", {})
    st_samples, st_goals = harness.startup_samples(st)
    suites = {
        "hpcc": hpcc or hpcc_doc([9.9, 12.6, 10.0], [4.0, 1.0, 2.0]),
        "isolation": isolation_doc(),
        "io": io_doc,
        "startup": {"kinds": {"container": st}, "samples": st_samples, "goals": st_goals},
    }
    return {
        "harness": {
            "argv": ["hpvc", "bench", "run"],
            "started": "2026-11-22T10:00:00Z",
            "finished": "2026-11-22T10:15:00Z",
            "wall_s": 900.0,
            "suites": list(suites),
            "targets": ["native", "container"],
            "repeat": 3,
            "configs": {},
            "suite_wall_s": {},
        },
        "host": {"host": "vm", "cpu_model": "AMD EPYC", "cpus": 2},
        "accelerator": {"vm": "tcg"},
        "suites": suites,
        "samples": [x for d in suites.values() for x in d["samples"]],
    }


def write_run(path: Path, doc: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps(doc))
    return path


def exit_code(argv: list[str]) -> int:
    """Run the real entry point (which maps HpvcError to its exit code)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    return int(e.value.code or 0)


# --- numbers from samples ---------------------------------------------------------


def test_paired_ratios_pair_by_repetition_and_invert_lower_is_better() -> None:
    s = hpcc_doc([9.9, 12.6, 10.0], [4.0, 1.0, 2.0])["samples"]
    hpl = report.paired_ratios(s, "HPL", "container", "native")
    assert hpl == pytest.approx([0.99, 1.05, 10.0 / 11.0])
    # latency is a time: native / container, so > 1 means the container is faster
    assert report.paired_ratios(s, "latency", "container", "native") == pytest.approx(
        [0.5, 2.0, 1.0]
    )
    # a repetition only one side ran is left out, not paired with another one
    partial = [x for x in s if not (x["config"] == "native" and x["rep"] == 1)]
    assert report.paired_ratios(partial, "HPL", "container", "native") == pytest.approx(
        [0.99, 10.0 / 11.0]
    )


def test_several_samples_per_repetition_are_averaged_before_pairing() -> None:
    s = [*series("isolation", "idle", "X", [10.0, 20.0]), sample("isolation", "idle", "X", 30, 1)]
    s += series("isolation", "shared", "X", [5.0, 12.5])
    assert report.paired_ratios(s, "X", "shared", "idle") == pytest.approx([0.5, 0.5])


def test_goals_are_decided_from_the_samples() -> None:
    doc = run_doc()
    got = {(g.suite, g.text.split(":")[0]): g for g in report.goal_results(doc)}
    hpl = got[("hpcc", "container HPL")]
    assert hpl.met is True and hpl.value == pytest.approx(0.99)
    lat = got[("hpcc", "container latency")]
    assert lat.met is True and lat.value == pytest.approx(1.0)
    iso = got[("isolation", "partitioned DGEMM")]
    assert iso.met is False and iso.value is not None and iso.value > 2.0  # suite said met
    assert got[("startup", "container up_s_8")].met is True
    throttles = [g for g in report.goal_results(doc) if g.suite == "io"]
    assert len(throttles) == 4 and all(g.met for g in throttles)
    bad = run_doc(hpcc_doc([9.0, 10.0, 10.0], [4.0, 4.0, 2.0]))
    miss = {g.text.split(":")[0]: g for g in report.goal_results(bad) if g.suite == "hpcc"}
    assert miss["container HPL"].met is False and miss["container latency"].met is False


def test_goal_without_samples_is_not_decided() -> None:
    g = report.evaluate(
        "hpcc",
        {"metric": "HPL", "config": "vm", "median_ratio_at_least": 0.9},
        hpcc_doc([1, 1, 1], [1, 1, 1])["samples"],
    )
    assert g.met is None and g.figure == "no samples"


# --- adapters --------------------------------------------------------------------------


def test_io_adapter_on_the_committed_run() -> None:
    doc = committed("io")
    samples, goals = harness.io_samples(doc)
    for x in samples:
        assert set(x) == set(harness.SAMPLE_KEYS) and isinstance(x["value"], float)
    by = {c: [x for x in samples if x["config"] == c] for c in {x["config"] for x in samples}}
    assert set(by) == {"throttled", "weighted", "native", "open", "high"}
    assert len(by["throttled"]) == 4 * 3 * 2 and len(by["weighted"]) == 2 * 3 * 3
    t10 = report.select(samples, "throttled", "t10_read_vs_target")
    assert sorted(t10) == pytest.approx(
        sorted(x["bw_bytes"] / 10e6 for x in doc["throttle"][0]["samples"])
    )
    # each repetition's throttle runs have the order they ran in (rotated)
    for rep in range(3):
        orders = {x["order"] for x in by["throttled"] if x["rep"] == rep}
        assert orders == {0, 1, 2, 3}
    assert [g["metric"] for g in goals] == [
        "t10_read_vs_target",
        "t10_write_vs_target",
        "t20_read_vs_target",
        "t20_write_vs_target",
    ]
    assert all(g["within_pct"] == 5.0 and g["config"] == "throttled" for g in goals)
    # the overhead ratios the harness pairs are the ones io computed itself
    job = doc["overhead"]["jobs"][0]
    ratios = report.paired_ratios(samples, f"{job['job']}_MBps", "open", "native")
    assert ratios == pytest.approx(job["ratios"]["open/native"]["samples"])
    split = report.select(samples, "weighted", "seq_read_256k_w900_per_w100")
    assert sorted(split) == pytest.approx(sorted(x["ratio"] for x in doc["weight"][0]["samples"]))


def test_startup_adapter_on_the_committed_runs() -> None:
    doc = committed("startup")
    samples, goals = harness.startup_samples(doc)
    assert len(samples) == 3 * 5 * 2
    assert {x["config"] for x in samples} == {"container"}
    assert not any(x["higher_is_better"] for x in samples)
    up8 = report.select(samples, "container", "up_s_8")
    assert sorted(up8)[2] == pytest.approx(doc["sizes"][2]["up"]["median"])
    assert goals == [{"metric": "up_s_8", "config": "container", "median_below": 2.0}]
    vm_samples, vm_goals = harness.startup_samples(committed("startup-vm"))
    assert {x["config"] for x in vm_samples} == {"vm"} and vm_goals == []
    assert {x["metric"] for x in vm_samples} >= {"up_s_1", "up_s_2", "up_s_4", "down_s_4"}


# --- what runs ----------------------------------------------------------------------------


def test_targets_map_to_configs() -> None:
    plans = {p.suite: p for p in harness.plan_suites(list(harness.SUITES), ["native", "container"])}
    assert plans["hpcc"].configs == ("native", *harness.HPCC_CONTAINER)
    assert plans["isolation"].configs == ("idle", "partitioned", "shared")
    assert plans["io"].configs == ("container",)
    assert plans["startup"].configs == ("container",)
    only_vm = {p.suite: p for p in harness.plan_suites(list(harness.SUITES), ["vm"])}
    assert only_vm["hpcc"].configs == ("vm",) and "native" in only_vm["hpcc"].note
    assert only_vm["startup"].configs == ("vm",)
    for s in ("io", "isolation"):
        assert only_vm[s].configs == () and "container" in only_vm[s].note
    native = {p.suite: p for p in harness.plan_suites(["hpcc", "startup"], ["native"])}
    assert native["hpcc"].configs == ("native",) and native["startup"].configs == ()
    assert harness.parse_suites("all") == list(harness.SUITES)
    assert harness.parse_suites("io,hpcc,io") == ["io", "hpcc"]


@pytest.mark.parametrize(
    "args",
    [
        ["--suite", "linpack"],
        ["--suite", ""],
        ["--targets", "native,cloud"],
        ["--suite", "io", "--targets", "native"],  # io is container-only: nothing left
        ["--startup-nodes", "1,x"],
        ["--repeat", "0"],
    ],
)
def test_bad_run_arguments_exit_2(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code(["bench", "run", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err and (err.startswith("hpvc: ") or "Invalid value" in err)
    assert not (tmp_path / "results.json").exists()


def test_bad_suite_through_cli_runner_is_an_input_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["bench", "run", "--suite", "nope", "--out", str(tmp_path)])
    assert isinstance(r.exception, InputError) and r.exception.exit_code == 2
    assert "--suite nope" in r.exception.line()


def test_run_records_a_failed_suite_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, tuple[str, ...]] = {}

    def fake(name: str, doc: dict[str, Any]) -> Any:
        def runner(p: harness.SuitePlan, s: harness.Settings, progress: Any) -> dict[str, Any]:
            seen[name] = p.configs
            progress("repetition 1/1")
            return doc

        return runner

    def broken(p: harness.SuitePlan, s: harness.Settings, progress: Any) -> dict[str, Any]:
        raise HpvcError("bench io", "fio not found", "apt-get install fio")

    full = run_doc()
    monkeypatch.setattr(common, "host_facts", lambda mpi=True: {"host": "test"})
    monkeypatch.setattr(common, "accelerator", lambda: {"vm": "tcg"})
    monkeypatch.setitem(harness.RUNNERS, "hpcc", fake("hpcc", full["suites"]["hpcc"]))
    monkeypatch.setitem(harness.RUNNERS, "isolation", fake("isolation", isolation_doc()))
    monkeypatch.setitem(harness.RUNNERS, "io", broken)
    monkeypatch.setitem(harness.RUNNERS, "startup", fake("startup", full["suites"]["startup"]))
    out = tmp_path / "run"
    assert exit_code(["bench", "run", "--out", str(out)]) == 1
    cap = capsys.readouterr()
    assert cap.err.strip().splitlines()[-1].startswith("hpvc: bench run: 1 suite(s) failed (io)")
    assert "[hpcc 1/4] step 2" in cap.err  # progress: suite k/n, step, elapsed
    assert seen["hpcc"] == ("native", *harness.HPCC_CONTAINER)
    doc = json.loads((out / "results.json").read_text())
    assert doc["suites"]["io"]["error"] == "bench io: fio not found (apt-get install fio)"
    assert doc["harness"]["finished"] and doc["harness"]["repeat"] == 3
    assert doc["harness"]["targets"] == ["native", "container"]
    assert doc["harness"]["argv"][:5] == [
        "hpvc",
        "bench",
        "run",
        "--suite=all",
        "--targets=native,container",
    ]
    assert set(doc["harness"]["suite_wall_s"]) == set(harness.SUITES)
    assert len(doc["samples"]) == sum(len(d["samples"]) for d in doc["suites"].values())
    text = (out / "report.md").read_text()
    assert "| io | suite failed: bench io: fio not found (apt-get install fio) |  | no |" in text
    for name in ("hpcc", "isolation", "startup"):
        assert (out / f"{name}.png").read_bytes().startswith(PNG)


def test_run_skips_container_only_suites_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vm = committed("startup-vm")
    got: list[tuple[str, ...]] = []

    def startup(p: harness.SuitePlan, s: harness.Settings, progress: Any) -> dict[str, Any]:
        got.append(p.configs)
        samples, goals = harness.startup_samples(vm)
        return {"kinds": {"vm": vm}, "samples": samples, "goals": goals}

    monkeypatch.setattr(common, "host_facts", lambda mpi=True: {"host": "test"})
    monkeypatch.setattr(common, "accelerator", lambda: {"vm": "tcg"})
    monkeypatch.setitem(harness.RUNNERS, "startup", startup)
    out = tmp_path / "run"
    args = ["bench", "run", "--suite", "io,startup", "--targets", "vm", "--out", str(out)]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert got == [("vm",)]
    assert list(doc["suites"]) == ["io", "startup"]
    assert "container" in doc["suites"]["io"]["skipped"]
    assert {x["config"] for x in doc["samples"]} == {"vm"}
    text = (out / "report.md").read_text()
    assert "Skipped: container-only" in text
    assert (out / "startup.png").read_bytes().startswith(PNG)


# --- report and plots ----------------------------------------------------------------------


def test_report_has_goal_table_and_per_suite_sections(tmp_path: Path) -> None:
    doc = run_doc()
    text = report.report_md(doc, {"hpcc": "hpcc.png"})
    assert "| hpcc | container HPL: median ratio vs native ≥ 0.97 | 0.99 | yes |" in text
    assert "| isolation | partitioned DGEMM: stdev / stdev of idle ≤ 2 |" in text
    assert "| no |" in text.split("## hpcc")[0]  # the isolation goal, from the samples
    assert "| startup | container up_s_8: median < 2 |" in text
    assert "![hpcc](hpcc.png)" in text
    for s in harness.SUITES:
        assert f"\n## {s}\n" in text
    # hpcc rows: n, min/median/max, and the paired ratio min / median / max
    assert "| HPL (GFLOP/s) | native | 3 | 10 | 11 | 12 | 1 | 1 (baseline) |" in text
    assert "| HPL (GFLOP/s) | container | 3 | 9.9 | 10 | 12.6 |" in text
    assert "0.909 / 0.990 / 1.050 |" in text
    assert "| latency (us) | container | 3 | 1 | 2 | 4 |" in text
    assert "0.500 / 1.000 / 2.000 |" in text
    assert "Block I/O of container nodes" in text  # io's own report, kept
    assert "`hpvc up` / `hpvc down` of container clusters" in text


def test_configs_marked_not_comparable_get_no_ratio_and_no_goal(tmp_path: Path) -> None:
    doc = run_doc()
    hp = doc["suites"]["hpcc"]
    hp["samples"] += series("hpcc", "vm", "HPL", [1.0, 1.2, 1.1])
    hp["goals"].append({"metric": "HPL", "config": "vm", "median_ratio_at_least": 0.97})
    hp["not_comparable"] = {"vm": "VM under tcg (software emulation)"}
    text = report.report_md(doc)
    assert "| HPL (GFLOP/s) | vm | 3 | 1 | 1.1 | 1.2 | 0.1 | not comparable: VM under tcg" in text
    assert "| hpcc | vm HPL: median ratio vs native ≥ 0.97 | not comparable: VM under tcg" in text
    assert plots.plot_hpcc(hp, tmp_path / "hpcc.png")


def test_plots_are_png_files(tmp_path: Path) -> None:
    written = plots.write_all(run_doc(), tmp_path)
    assert written == {s: f"{s}.png" for s in harness.SUITES}
    for name in written.values():
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_no_plot_without_samples(tmp_path: Path) -> None:
    doc = run_doc()
    doc["suites"]["hpcc"] = {"error": "boom", "samples": [], "goals": []}
    assert "hpcc" not in plots.write_all(doc, tmp_path)
    assert not (tmp_path / "hpcc.png").exists()


def test_report_rerenders_from_results_json(tmp_path: Path) -> None:
    d = write_run(tmp_path / "a", run_doc())
    r = CliRunner().invoke(app, ["bench", "report", str(d), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["report"] == str(d / "report.md") and set(out["plots"]) == set(harness.SUITES)
    assert {g["met"] for g in out["goals"]} == {True, False}
    assert "## Goals" in (d / "report.md").read_text()
    for s in harness.SUITES:
        assert (d / f"{s}.png").read_bytes().startswith(PNG)


# --- compare ----------------------------------------------------------------------------


def test_compare_is_direction_aware(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", run_doc())
    faster = run_doc(hpcc_doc([11.0, 13.2, 12.1], [1.0, 1.0, 1.0]))  # HPL +10%, latency 1/2
    b = write_run(tmp_path / "b", faster)
    r = CliRunner().invoke(app, ["bench", "compare", str(a), str(b), "--json"])
    assert r.exit_code == 0, r.output
    rows = {(x["suite"], x["config"], x["metric"]): x for x in json.loads(r.stdout)}
    hpl = rows[("hpcc", "container", "HPL")]
    assert hpl["median_a"] == pytest.approx(10.0) and hpl["median_b"] == pytest.approx(12.1)
    assert hpl["b_vs_a"] == pytest.approx(1.21)
    assert rows[("hpcc", "container", "latency")]["b_vs_a"] == pytest.approx(2.0)  # B faster
    assert rows[("hpcc", "native", "HPL")]["b_vs_a"] == pytest.approx(1.0)
    assert ("io", "throttled", "t10_read_vs_target") in rows
    # B vs A is A vs B upside down
    back = report.compare(faster, run_doc())
    inv = {(x["suite"], x["config"], x["metric"]): x["b_vs_a"] for x in back}
    assert inv[("hpcc", "container", "latency")] == pytest.approx(0.5)
    table = CliRunner().invoke(app, ["bench", "compare", str(a), str(b)])
    assert table.exit_code == 0 and "B vs A" in table.stdout


def test_compare_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a", run_doc())
    assert exit_code(["bench", "compare", str(a), str(tmp_path / "missing")]) == 2
    assert "no results.json" in capsys.readouterr().err
    only_io = run_doc()
    only_io["suites"] = {"io": only_io["suites"]["io"]}
    b = write_run(tmp_path / "b", only_io)
    no_io = run_doc()
    del no_io["suites"]["io"]
    c = write_run(tmp_path / "c", no_io)
    assert exit_code(["bench", "compare", str(b), str(c)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("hpvc: bench compare: the runs share no measured suite") and "\n" not in err
    )
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "results.json").write_text(json.dumps(committed("io")))
    assert exit_code(["bench", "compare", str(a), str(tmp_path / "d")]) == 2
    r = CliRunner().invoke(app, ["bench", "compare", str(a), str(tmp_path / "missing")])
    assert isinstance(r.exception, InputError)


def test_num_formats_non_finite() -> None:
    assert report.num(math.inf) == "inf" and report.num(1234.5678) == "1235"


def test_goals_of_configs_not_measured_are_left_out() -> None:
    """--targets native,vm measures no container: its goals are not failures."""
    sample = {
        "suite": "hpcc", "config": "native", "metric": "HPL", "unit": "GFLOP/s",
        "higher_is_better": True, "rep": 0, "order": 0, "value": 1.0,
    }  # fmt: skip
    goal = {"metric": "HPL", "config": "container", "vs": "native", "median_ratio_at_least": 0.97}
    doc = {"suites": {"hpcc": {"samples": [sample], "goals": [goal]}}}
    assert report.goal_results(doc) == []
    doc["suites"]["hpcc"]["samples"].append({**sample, "config": "container", "value": 0.5})
    (only,) = report.goal_results(doc)
    assert only.met is False and only.value == pytest.approx(0.5)

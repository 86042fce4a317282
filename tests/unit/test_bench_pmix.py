"""hpvc bench pmix's pure part: the per-repetition rows into min/median/max,
srun/mpirun paired within a repetition, and the report (src/hpvc/bench/pmix)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from hpvc.bench.pmix import report, runner


def _rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    # repetition r: srun latency 2+r, mpirun 1+r (ratio (2+r)/(1+r)); bandwidths equal
    for r in range(3):
        for how, lat in (("srun", 2.0 + r), ("mpirun", 1.0 + r)):
            rows.append({"what": "pingpong", "config": how, "rep": r, "order": 0,
                         "latency_us": lat, "bandwidth_MBps": 100.0})  # fmt: skip
        rows.append({"what": "step_launch", "config": "plain", "rep": r, "order": 1,
                     "seconds": [0.2, 0.3]})  # fmt: skip
        rows.append({"what": "step_launch", "config": "hpvc", "rep": r, "order": 2,
                     "seconds": [0.25, 0.45]})  # fmt: skip
    return rows


def test_ratios_are_paired_within_a_repetition() -> None:
    doc = runner.document(_rows())
    lat = next(m for m in doc["mpi"] if m["metric"] == "latency_us")
    assert lat["srun_pmix"] == {"min": 2.0, "median": 3.0, "max": 4.0}
    assert lat["mpirun"] == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert lat["ratio_srun_mpirun"] == {"min": 4 / 3, "median": 1.5, "max": 2.0}
    bw = next(m for m in doc["mpi"] if m["metric"] == "bandwidth_MBps")
    assert bw["ratio_srun_mpirun"] == {"min": 1.0, "median": 1.0, "max": 1.0}
    # no hpcc rows: no hpcc metrics invented
    assert {m["what"] for m in doc["mpi"]} == {"pingpong"}


def test_step_launch_pools_every_timed_step() -> None:
    launch = runner.document(_rows())["step_launch"]
    assert launch["plain"] == {"min": 0.2, "median": 0.25, "max": 0.3}
    assert launch["hpvc"] == {"min": 0.25, "median": 0.35, "max": 0.45}
    assert abs(launch["added_median_s"] - 0.1) < 1e-9


def test_report_shows_each_metric_and_the_added_launch_time() -> None:
    doc = {"kind": "container", "slurm": "slurm-wlm 22.05.8", "repeat": 3,
           "submitted_by": "nobody", **runner.document(_rows())}  # fmt: skip
    md = report.report_md(doc)
    assert "| pingpong | latency_us (us) | 2.000 / 3.000 / 4.000 | 1.000 / 2.000 / 3.000 |" in md
    assert "Added by --hpvc (medians): +0.100 s." in md


def test_mpirun_runs_inside_the_node_without_slurms_variables() -> None:
    argv = runner._launch("mpirun", 8, Path("/w/one.toml"), "hpcc")
    assert argv[:4] == ["srun", "-N1", "-n1", "--hpvc=/w/one.toml"]  # one task: mpirun
    assert "unset" in argv[-1] and "mpirun --mca plm isolated" in argv[-1]
    srun = runner._launch("srun", 8, Path("/w/one.toml"), "hpcc")
    assert "-n8" in srun and "--mpi=pmix" in srun


def test_guests_get_the_program_in_the_command_line(tmp_path: Path) -> None:
    """A guest sees nothing of the job's directory: the ping-pong travels in
    the command, one copy per task, and HPCC's output comes back from rank 0."""
    binary = tmp_path / "pingpong"
    binary.write_bytes(b"\x7fELF-not-really")
    before, path = runner._carried(binary)
    assert path == "/tmp/pingpong.$$"
    assert base64.b64encode(binary.read_bytes()).decode() in before
    argv = runner._launch("srun", 2, Path("/w/one.toml"), f"{path} 1 1", before, runner.RANK0)
    assert argv[-1].startswith(f"echo {base64.b64encode(binary.read_bytes()).decode()}")
    assert argv[-1].endswith("then cat hpccoutf.txt; fi")

"""The pure parts of ``hpvc bench spark --slurm``: the job's specs, the
driver's command line, the report (goal, first-task table), and the
native side held to the job's CPUs (bench.spark.pinning, real taskset)."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from hpvc.bench.spark import pinning, report
from hpvc.bench.spark import slurm as bench
from hpvc.errors import HpvcError, InputError
from hpvc.slurm import policy
from hpvc.spark import model
from hpvc.spark.native import Daemon, NativeSpark, stop_group


def test_the_jobs_spec_passes_the_site_and_differs_only_by_its_services() -> None:
    site = policy.Site(images=("hpc", "spark"))
    full, _ = policy.load(bench.spec(4), "bench", site)
    plain, _ = policy.load(bench.spec(4, services=False), "bench", site)
    assert full.shared.server == "nfs" and full.shared.size == 4096
    assert full.spark is not None and full.spark.worker_memory == bench.WORKER_MIB
    assert plain.shared.server == "host" and plain.spark is None
    assert (
        [(g.role, g.count, g.memory) for g in full.nodes]
        == [(g.role, g.count, g.memory) for g in plain.nodes]
        == [("head", 1, bench.HEAD_MIB), ("compute", bench.HOSTS, bench.NODE_MIB)]
    )
    # Three hosts: head0 and compute0 on the first, a compute node on each other.
    assert policy.split(full, bench.HOSTS) == [["head0", "compute0"], ["compute1"], ["compute2"]]
    tomllib.loads(bench.spec(1))


def test_the_driver_runs_the_image_terasort_against_head0_with_whole_worker_executors() -> None:
    argv = bench.submit_line(["sort", "/shared/r0/in", "/shared/r0/out"])
    assert argv[:2] == ["env", f"JAVA_HOME={model.IMAGE_JAVA_HOME}"]
    assert argv[argv.index("--master") + 1] == "spark://head0:7077"
    assert f"spark.executor.memory={bench.WORKER_MIB}m" in argv
    assert f"spark.cores.max={bench.HOSTS}" in argv
    assert argv[-4:] == [model.IMAGE_JAR, "sort", "/shared/r0/in", "/shared/r0/out"]


def _doc(native: list[float], virtual: list[float]) -> dict[str, object]:
    samples = []
    for config, values in (("native", native), ("slurm-nfs", virtual)):
        for rep, v in enumerate(values):
            samples.append({"suite": "spark-slurm", "config": config, "rep": rep,
                            "unit": "s", "metric": "sort 1GiB", "value": v,
                            "higher_is_better": False})  # fmt: skip
    for config, values in (("with NFS and Spark", [9.0, 11.0]), ("without", [3.0, 2.0])):
        for rep, v in enumerate(values):
            samples.append({"suite": "spark-slurm", "config": config, "rep": rep, "unit": "s",
                            "metric": "srun -N3 hostname, new job", "value": v,
                            "higher_is_better": False})  # fmt: skip
    host = {"date": "d", "host": "h", "cpu_model": "c", "cpus": 2, "kernel": "k",
            "loadavg_start": [1.0]}  # fmt: skip
    return {"host": host, "configs": list(bench.CONFIGS), "sizes": ["1GiB"], "repeat": 2,
            "hosts": 3, "workers": 3, "worker_mib": 1024, "node_mib": 3072,
            "submitted_by": "u", "samples": samples,
            "goal": {"metric": "sort", "config": "slurm-nfs",
                     "median_ratio_at_least": 0.95}}  # fmt: skip


def test_report_judges_the_goal_on_paired_ratios_and_tables_the_first_task() -> None:
    met = report.slurm_report_md(_doc([10.0, 12.0], [10.0, 12.0]))
    assert "slurm-nfs/native, sort 1GiB (>= 0.95): min/median/max 1.000 / 1.000 / 1.000: met" in met
    missed = report.slurm_report_md(_doc([10.0, 12.0], [20.0, 12.0]))
    assert "min/median/max 0.500 / 0.750 / 1.000: NOT met" in missed
    assert "### with NFS and Spark" in met and "### without" in met


def _pinned_doc() -> dict[str, object]:
    doc = _doc([10.0, 12.0], [20.0, 24.0])
    samples = doc["samples"]
    assert isinstance(samples, list)
    for rep, v in enumerate([19.0, 24.0]):
        samples.append({"suite": "spark-slurm", "config": "native-pinned", "rep": rep,
                        "unit": "s", "metric": "sort 1GiB", "value": v,
                        "higher_is_better": False})  # fmt: skip
    doc["configs"] = ["native", "native-pinned", "slurm-nfs"]
    doc["share_cpus"] = {"n1": [0], "n2": [0], "n3": [0]}
    return doc


def test_report_judges_the_job_against_native_on_the_same_cpus_too() -> None:
    md = report.slurm_report_md(_pinned_doc())
    assert (
        "slurm-nfs/native, sort 1GiB (>= 0.95): min/median/max 0.500 / 0.500 / 0.500: NOT met" in md
    )
    # 19/20 and 24/24: paired with native-pinned of the same repetition.
    assert (
        "slurm-nfs/native-pinned, sort 1GiB (>= 0.95): min/median/max 0.950 / 0.975 / 1.000: met"
        in md
    )
    assert "n1 CPUs 0; n2 CPUs 0; n3 CPUs 0" in md
    assert "## Against native-pinned" in md


def test_unknown_or_incomplete_configs_are_refused_before_anything() -> None:
    for configs in (("native", "slurm-nfs", "podman"), ("native-pinned", "slurm-nfs")):
        with pytest.raises(InputError, match="needs native and slurm-nfs"):
            bench.run([1 << 30], 1, configs=configs)


def test_place_cpus_lists_each_hosts_share_in_host_order_and_refuses_a_missing_one() -> None:
    cpus = {"n2": (1,), "n1": (0, 1, 2, 3, 8), "n3": (0,)}
    assert pinning.place_cpus(cpus, ["n1", "n2", "n3"]) == ["0-3,8", "1", "0"]
    with pytest.raises(HpvcError, match="n4"):
        pinning.place_cpus(cpus, ["n1", "n4"])


def test_pinned_holds_each_daemon_and_the_driver_to_its_place_then_frees_them(
    tmp_path: Path,
) -> None:
    """Real processes, real taskset: the master at place 0, worker-1 at place 1;
    the driver's prefix gains ``taskset -c``; all of it undone after."""
    everywhere = os.sched_getaffinity(0)
    first, last = min(everywhere), max(everywhere)
    native = NativeSpark(
        tmp_path, 2, places=[("10.0.0.1", ["on", "n1"]), ("10.0.0.2", ["on", "n2"])]
    )
    for name in ("master", "worker-1"):
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        native.daemons.append(Daemon(name, proc, tmp_path / f"{name}.log"))
    try:
        with pinning.pinned(native, [str(first), str(last)]):
            assert os.sched_getaffinity(native.daemons[0].proc.pid) == {first}
            assert os.sched_getaffinity(native.daemons[1].proc.pid) == {last}
            assert native.places[0][1] == ["on", "n1", "taskset", "-c", str(first)]
        for d in native.daemons:
            assert os.sched_getaffinity(d.proc.pid) == everywhere
        assert native.places[0][1] == ["on", "n1"]
    finally:
        for d in native.daemons:
            stop_group(d.proc, grace_s=1)


def test_samples_carry_the_sorts_own_phases_from_its_teratime_line() -> None:
    out = (
        "TERASORT records=10 partitions=3\n"
        "TERATIME cmd=sort startup_s=4.500 sample_s=1.250 sort_s=20.000 total_s=21.300\n"
    )
    step = {"TERATIME": {"total_s": 1.0}}
    result = {"sort_wall_s": 30.0, "steps": {"sort": model.parse_result(out), "gen": step,
                                        "validate": step}}  # fmt: skip
    got = {s["metric"]: s["value"] for s in bench._samples("slurm-nfs", 0, "1GiB", result)}
    assert got["sort 1GiB"] == 21.3 and got["sort step wall 1GiB"] == 30.0
    assert (got["sort 1GiB: startup"], got["sort 1GiB: sample"], got["sort 1GiB: sort"]) == (
        4.5,
        1.25,
        20.0,
    )
    assert "sort 1GiB: total" not in got

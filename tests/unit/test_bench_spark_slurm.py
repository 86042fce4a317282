"""The pure parts of ``hpvc bench spark --slurm``: the job's specs, the
driver's command line, and the report (goal, first-task table)."""

from __future__ import annotations

import tomllib

from hpvc.bench.spark import report
from hpvc.bench.spark import slurm as bench
from hpvc.slurm import policy
from hpvc.spark import model


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

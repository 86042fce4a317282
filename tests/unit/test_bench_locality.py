"""``hpvc bench locality``'s results document and report, for Open MPI and MPICH
(pure: made-up samples, no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from hpvc.bench.locality import runner


def fake_run(rep: int, scale: float) -> dict[str, Any]:
    sizes = [
        {"bytes": m.bytes, "latency_us": scale, "bandwidth_MBps": 1000 / scale}
        for m in runner.METRICS
    ]
    return {"rep": rep, "order": 0, "wall_s": 1.0, "rank0": "compute0", "sizes": sizes}


FACTS = {
    "host": "h",
    "cpu_model": "cpu",
    "cpus": 2,
    "kernel": "k",
    "crun": "crun 1",
    "date": "d",
    "mpi_version": "MPICH 4.0.2",
}


@pytest.mark.parametrize(
    ("mpi", "shm_path"),
    [("openmpi", "btl vader,self"), ("mpich", "hpvc's PMI: both nodes one host")],
)
def test_document_and_report_say_which_mpi_and_path(mpi: str, shm_path: str) -> None:
    runs = {c: [fake_run(0, s)] for c, s in (("native", 1.0), ("shm", 1.0), ("none", 10.0))}
    doc = runner.document(FACTS, runs, mpi)
    assert doc["mpi"] == mpi and doc["meets_goal"]
    assert doc["configs"]["shm"]["path"].startswith(shm_path)
    report = runner.report_md(doc)
    assert "MPICH 4.0.2" in report and f"shm: {runner.CONFIGS['shm']}, {shm_path}" in report


def test_both_mpis_are_known() -> None:
    assert set(runner.MPIS) == {"openmpi", "mpich"}
    assert runner.MPIS["mpich"].image == "mpich" and runner.MPIS["mpich"].mpicc == "mpicc.mpich"

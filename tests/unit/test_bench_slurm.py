"""The Slurm launch-latency benchmark's document and report, from made-up runs."""

from __future__ import annotations

import pytest

from hpvc.bench import slurm
from hpvc.errors import InputError


def rows() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for rep in range(3):
        for what in slurm.WHAT:
            out.append(
                {
                    "what": what,
                    "config": "plain",
                    "seconds": 0.1 + rep * 0.01,
                    "rep": rep,
                    "order": 0,
                }
            )
            out.append(
                {"what": what, "config": "hpvc", "seconds": 1.0 + rep * 0.1, "rep": rep, "order": 1}
            )
    return out


def test_document_adds_medians_and_samples() -> None:
    doc = slurm.document({"host": "h", "cpu_model": "c", "cpus": 2, "date": "d"}, rows(), 3)
    first = doc["table"][0]
    assert first["plain"]["median"] == pytest.approx(0.11)
    assert first["hpvc"]["median"] == pytest.approx(1.1)
    assert first["added_median_s"] == pytest.approx(0.99)
    assert len(doc["samples"]) == 3 * len(slurm.WHAT) * 2
    assert {s["higher_is_better"] for s in doc["samples"]} == {False}
    md = slurm.report_md(doc)
    assert (
        "| srun -N1 true, a new job | 0.100 / 0.110 / 0.120 | 1.000 / 1.100 / 1.200 | +0.990 |"
        in md
    )


def test_repeat_must_be_positive() -> None:
    with pytest.raises(InputError, match="at least 1"):
        slurm.run(0)

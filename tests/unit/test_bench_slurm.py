"""The Slurm launch-latency benchmark's document and report, from made-up runs."""

from __future__ import annotations

import pytest

from hpvc.bench.slurm import runner as slurm
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
        "| srun -N1 (one echo per host), a new job | 0.100 / 0.110 / 0.120"
        " | 1.000 / 1.100 / 1.200 | +0.990 |" in md
    )


def test_repeat_must_be_positive() -> None:
    with pytest.raises(InputError, match="at least 1"):
        slurm.run(0)


OUT = (
    "hpvc-times 1 0.210 0.350 cli=0.050,image=0.000,plan=0.010,host=0.020,nodes=0.100,share=0.030\n"
    "hpvc-times 1 0.210 0.400 cli=0.060,image=0.000,plan=0.010,host=0.020,nodes=0.150,share=0.040\n"
    "hpvc-times 2 0.210 0.012 running=0.001\n"
    "hpvc-times 3 - - -\n"
)


def test_breakdown_takes_the_slowest_host_and_splits_its_node_up() -> None:
    got = slurm.breakdown(OUT, "1", 0.8)
    assert got is not None
    assert got["check"] == pytest.approx(0.21)
    assert got["node_up"] == pytest.approx(0.40)
    assert got["nodes"] == pytest.approx(0.15)
    # node up's own phases add up to 0.28 of its 0.40 s: the rest was its start
    assert got["start"] == pytest.approx(0.12)
    assert got["rest"] == pytest.approx(0.8 - 0.21 - 0.40)
    in_allocation = slurm.breakdown(OUT, "1", 0.8, checked=False)
    assert in_allocation is not None and "check" not in in_allocation
    assert in_allocation["rest"] == pytest.approx(0.8 - 0.40)
    assert slurm.breakdown(OUT, "3", 0.1) is None  # no --hpvc
    assert slurm.breakdown(OUT, "4", 0.1) is None  # no such step


def test_the_report_breaks_the_first_step_down() -> None:
    rs = rows()
    for r in rs:
        if r["config"] == "hpvc" and r["what"] in ("srun_N1", "alloc_first_step_N3"):
            checked = r["what"] == "srun_N1"
            r["phases"] = slurm.breakdown(OUT, "1", float(r["seconds"]), checked)  # type: ignore[arg-type]
    doc = slurm.document({"host": "h", "cpu_model": "c", "cpus": 2, "date": "d"}, rs, 3)
    [n1, first] = doc["phases"]
    assert (n1["what"], n1["runs"]) == ("srun_N1", 3)
    assert first["median_s"]["node_up"] == pytest.approx(0.40)
    assert first["median_s"]["rest"] == pytest.approx(1.1 - 0.40)
    assert "check" not in first["median_s"]  # at salloc, not in the step
    md = slurm.report_md(doc)
    assert "| `hpvc node check` in srun, as the user | 0.210 |  |" in md
    assert "|   overlay, netns, veth, crun | 0.150 | 0.150 |" in md


VM_OUT = (
    "hpvc-times 1 0.200 9.000 cli=0.100,image=0.010,plan=0.050,host=0.100,start=0.700,"
    "boot=7.500,configure=0.000,share=0.200\n"
)


def test_the_vm_layout_measures_one_and_two_hosts_and_names_the_accelerator() -> None:
    layout = slurm.LAYOUTS["vm"]
    assert (layout.sizes, layout.alloc) == ((1, 2), 2)
    assert "kinds=container,vm" in layout.site and 'kind = "vm"' in layout.spec("10.1.2.0/24")
    got = slurm.breakdown(VM_OUT, "1", 9.5)
    assert got is not None
    # the backend's own "start" (disks, taps, QEMU) is not the interpreter's start
    assert got["qemu"] == pytest.approx(0.7) and got["boot"] == pytest.approx(7.5)
    assert got["start"] == pytest.approx(9.0 - 8.66)
    labels = slurm.what_labels(layout.sizes, layout.alloc)
    rs = []
    for rep in range(3):
        for what in labels:
            for config, base in (("plain", 0.1), ("hpvc", 0.2)):
                seconds = base + (9.5 if config == "hpvc" and "later" not in what else 0)
                phases = got if config == "hpvc" and what == "srun_N2" else None
                rs.append({"what": what, "config": config, "seconds": seconds, "rep": rep,
                           "order": 0, "phases": phases})  # fmt: skip
    doc = slurm.document(
        {"host": "h", "cpu_model": "c", "cpus": 2, "date": "d"}, rs, 3, layout=layout
    )
    doc["accelerator"] = "tcg"
    assert [t["what"] for t in doc["table"]] == [
        "srun_N1", "srun_N2", "alloc_first_step_N2", "alloc_later_step_N2"
    ]  # fmt: skip
    later = doc["table"][-1]
    assert later["added_median_s"] == pytest.approx(0.1)  # the per-step cost once up
    md = slurm.report_md(doc)
    assert "VMs ran under TCG (software emulation: not KVM figures)." in md
    assert "|   VMs: the guests boot to hpvc-ready (their agent listening) | 7.500 |" in md
    assert "| later srun -N2 in the same allocation (virtual cluster running) |" in md


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(InputError, match="--kind container or --kind vm"):
        slurm.run(1, kind="zone")

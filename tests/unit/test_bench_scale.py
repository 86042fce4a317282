"""hpvc bench scale's pure parts: the growth fit, the per-host-count table and
goals built from runs, the tasks' lines, and the refusals of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.bench.scale import report
from hpvc.bench.scale.slurm import check_hosts, parse_tasks, spec_text
from hpvc.bench.scale.vm import vm_spec_text
from hpvc.cli.bench_scale import parse_hosts
from hpvc.errors import InputError

HOSTS = [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize(
    ("power", "words"),
    [(0, "about constant"), (0.5, "less than linear"), (1, "about linear"),
     (2, "worse than linear")],
)  # fmt: skip
def test_fit_names_the_growth(power: float, words: str) -> None:
    f = report.fit([float(h) for h in HOSTS], [0.3 * h**power for h in HOSTS])
    assert f["slope"] == pytest.approx(power, abs=1e-9)
    assert f["growth"] == words


def test_fit_of_one_count_says_so() -> None:
    assert report.fit([4.0], [1.0])["slope"] is None


def run(resident: bool, hosts: int, rep: int, config: str, first: float, cpu: float) -> dict:
    hp = config == "hpvc"
    return {
        "resident": resident, "hosts": hosts, "rep": rep, "config": config,
        "first_task_s": first, "wall_s": first + 0.1, "cpu_s": cpu,
        "epilog_s": {f"n{i + 1}": 0.1 * (i + 1) for i in range(hosts)} if hp else {},
        "phases": {"node_up": first - 0.1, "nodes": 0.2} if hp else None,
    }  # fmt: skip


def test_document_pairs_each_repetition_and_judges_the_goals() -> None:
    rows = []
    for h in (2, 32):
        for rep in range(3):
            rows.append(run(True, h, rep, "plain", 0.1 + rep, 1.0))
            # --hpvc adds 0.2 s per host count unit and 0.5 CPU s per host
            rows.append(run(True, h, rep, "hpvc", 0.1 + rep + 0.01 * h, 1.0 + 0.5 * h))
    doc = report.document({"hosts": [2, 32]}, rows)
    top = doc["table"]["resident"][-1]
    assert top["hosts"] == 32
    assert top["added_first_task_s"]["median"] == pytest.approx(0.32)
    assert top["hpvc_cpu_per_host_s"]["median"] == pytest.approx(0.5)
    assert top["epilog_slowest_host_s"]["median"] == pytest.approx(3.2)
    assert top["phases_median_s"]["nodes"] == pytest.approx(0.2)
    assert doc["growth"]["resident"]["hpvc_cpu_per_host"]["growth"] == "about constant"
    goals = {g["what"].split(",")[0]: g["met"] for g in doc["goals"]}
    assert goals == {"first task on 32 hosts": True, "epilog per host on 32 hosts": False}
    assert "NOT met" in report.report_md(doc | FACTS)


FACTS = {
    "reps": 3, "cpus": 2, "host": "h", "cpu_model": "c", "date": "d",
    "nodes_per_host": 2, "submitted_by": "nobody", "vm": "VMs not measured",
}  # fmt: skip


def test_parse_tasks_reads_each_tasks_clock_job_and_host() -> None:
    out = "first-task 1.5 42 n3\nhpvc-times 1 - - -\nfirst-task 1.25 42 n1\nnoise\n"
    assert parse_tasks(out) == [(1.5, 42, "n3"), (1.25, 42, "n1")]


def test_spec_has_the_asked_nodes_per_host() -> None:
    text = spec_text("10.1.2.0/24", 8, per_host=2)
    assert 'subnet = "10.1.2.0/24"' in text and "count = 15" in text


@pytest.mark.parametrize("bad", [[0], [33], []])
def test_host_counts_outside_the_test_cluster_are_refused(bad: list[int]) -> None:
    with pytest.raises(InputError):
        check_hosts(bad)


@pytest.mark.parametrize("bad", ["1,x", "", ","])
def test_host_list_must_be_numbers(bad: str) -> None:
    with pytest.raises(InputError):
        parse_hosts(bad)


def test_forwarding_batch_is_the_full_mesh_in_bridge_batch_lines() -> None:
    """What hpvc.host.vxlan writes with one `bridge -batch` (issue 33: one
    batch, not one pyroute2 request per entry): per other host one all-zeros
    entry, per remote node one entry on the link and one on the bridge port."""
    from hpvc.host.vxlan import forwarding_batch
    from hpvc.plan.overlay import Overlay, Vtep

    remotes = tuple(
        Vtep(f"n{h}", f"10.250.0.{h}", tuple((f"c{h}{k}", "ip", f"02:00:00:00:0{h}:0{k}")
                                             for k in range(2)))
        for h in (2, 3)
    )  # fmt: skip
    lines = forwarding_batch("hpvc-vx1", Overlay(42, "10.250.0.1", remotes, 1450)).splitlines()
    assert len(lines) == 2 * (1 + 2 * 2)
    assert lines[0] == "fdb append 00:00:00:00:00:00 dev hpvc-vx1 dst 10.250.0.2 self permanent"
    assert "fdb replace 02:00:00:00:03:01 dev hpvc-vx1 dst 10.250.0.3 self permanent" in lines
    assert lines[-1] == "fdb replace 02:00:00:00:03:01 dev hpvc-vx1 master static"
    assert forwarding_batch("hpvc-vx1", Overlay(42, "10.250.0.1", (), 1450)) == ""


# --kind vm (issue 33 item 2: VMs at what TCG allows)


def test_vm_counts_past_what_tcg_allows_are_refused_in_one_line() -> None:
    assert check_hosts([4, 1, 2], "vm") == [1, 2, 4]
    assert check_hosts([8], "container") == [8]
    with pytest.raises(InputError) as e:
        check_hosts([1, 2, 8], "vm")
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert "TCG" in str(e.value) and "--hosts 1,2,4" in str(e.value)
    with pytest.raises(InputError):
        check_hosts([1], "kvm")


@pytest.mark.parametrize(
    "args",
    [["--kind", "vm", "--hosts", "1,2,8"], ["--kind", "kvm", "--hosts", "1"],
     ["--kind", "vm", "--part", "all", "--hosts", "1"]],
)  # fmt: skip
def test_cli_refuses_bad_vm_runs_before_starting_anything(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 2, no results directory, and the Slurm run never entered."""
    from typer.testing import CliRunner

    from hpvc.bench.scale import slurm as scale_slurm
    from hpvc.cli import app

    entered: list[object] = []
    monkeypatch.setattr(scale_slurm, "run", lambda *a, **k: entered.append(a))
    part = [] if "--part" in args else ["--part", "slurm"]
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["bench", "scale", *part, *args, "--out", str(out)])
    assert isinstance(r.exception, InputError) and r.exception.exit_code == 2
    assert not entered and not out.exists()


def test_vm_spec_has_one_vm_per_host() -> None:
    text = vm_spec_text("10.1.2.0/24", 4)
    assert 'kind = "vm"' in text and "count = 4" in text and 'role = "head"' not in text


def test_parse_tasks_reads_guest_lines_without_a_host() -> None:
    assert parse_tasks("first-task 2.5 7 \nfirst-task 2.0 7 n2\n") == [(2.5, 7, ""), (2.0, 7, "n2")]


def test_vm_document_labels_growth_as_emulation_and_reports_qemu_memory() -> None:
    rows = []
    for h in (1, 2, 4):
        for rep in range(3):
            rows.append(run(True, h, rep, "plain", 0.5, 1.0))
            hp = run(True, h, rep, "hpvc", 3.0 + h, 2.0 + 4 * h)
            rows.append(hp | {"qemu_rss_per_host_mib": 200.0 + rep})
    doc = report.document({"kind": "vm", "hosts": [1, 2, 4]}, rows)
    top = doc["table"]["resident"][-1]
    assert top["qemu_rss_per_host_mib"]["median"] == pytest.approx(201.0)
    growth = doc["growth"]["resident"]
    assert growth["qemu_memory_per_host"]["growth"] == "about constant (TCG emulation)"
    assert all(f["growth"].endswith("(TCG emulation)") for f in growth.values())
    assert doc["goals"] == []
    md = report.report_md(doc | FACTS | {"kind": "vm", "nodes_per_host": 1})
    assert "QEMU MiB per host" in md and "| 4 |" in md and "200 / 201 / 202" in md
    assert "one VM node per host (TCG emulation)" in md and "not judged for VMs" in md
    container = report.report_md(report.document({"hosts": [1, 2, 4]}, rows) | FACTS)
    assert "QEMU" not in container and "TCG emulation)" not in container

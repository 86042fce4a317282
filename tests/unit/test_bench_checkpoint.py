"""``hpvc bench checkpoint``'s pure parts: sizing, pause arithmetic, the report,
and its refusals before anything starts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpvc.bench.checkpoint import report, runner
from hpvc.cli import bench_checkpoint as cli
from hpvc.errors import InputError


def test_fill_is_the_fraction_when_the_host_has_room() -> None:
    assert report.fill_mib(2, 1024, 0.5, 20000) == (512, "")


def test_fill_is_sized_down_to_the_host_and_says_so() -> None:
    got, note = report.fill_mib(4, 4096, 0.5, 8000)
    # (8000 - 2048) // 4 - 384 = 1104 MiB per node, not 2048
    assert got == 1104
    assert "sized down from 2048 to 1104 MiB" in note and "4 nodes" in note


def test_fill_never_goes_below_64_mib() -> None:
    assert report.fill_mib(8, 4096, 0.5, 1000)[0] == 64


def test_union_of_pause_windows() -> None:
    assert report.union_s([]) == 0
    assert report.union_s([[0, 1], [2, 3]]) == pytest.approx(2)
    assert report.union_s([[0, 2], [1, 3]]) == pytest.approx(3)  # overlapping
    assert report.union_s([[1, 3], [0, 4]]) == pytest.approx(4)  # nested, out of order
    assert report.union_s([[0, 1], [1, 2.5]]) == pytest.approx(2.5)


def test_methods_alternate() -> None:
    assert report.alternate(3) == [["hpvc", "pcocc"], ["pcocc", "hpvc"], ["hpvc", "pcocc"]]


def _cfg(hpvc_pause: list[float], peer_pause: list[float], kind: str = "vm") -> dict[str, object]:
    peer = "pcocc" if kind == "vm" else "podman"

    def side(p: list[float], restore: bool) -> dict[str, list[float]]:
        d = {"checkpoint_s": [x + 1 for x in p], "job_pause_s": p,
             "node_pause_max_s": [x / 2 for x in p], "size": [512 << 20] * len(p),
             "job_goes_on": [True] * len(p)}  # fmt: skip
        return d | ({"restore_s": [3.0] * len(p)} if restore else {})

    return {"kind": kind, "nodes": 2, "memory_mib": 1024, "fill_mib": 512, "sized_down": "",
            "hpvc": side(hpvc_pause, True), peer: side(peer_pause, kind != "vm")}  # fmt: skip


def test_ratios_at_the_medians() -> None:
    r = report.ratios(_cfg([1.0, 2.0, 9.0], [4.0, 4.0, 1.0]))
    assert r["job_pause_s"] == pytest.approx(2.0 / 4.0)
    assert r["checkpoint_s"] == pytest.approx(3.0 / 5.0)
    assert "restore_s" not in r  # pcocc's restore is not measured


def _doc(**kinds: list[dict[str, object]]) -> dict[str, object]:
    host = {"date": "d", "cpu_model": "c", "cpus": 2, "kernel": "k", "hpvc": "v",
            "loadavg_start": [1.0]}  # fmt: skip
    return {"host": host, "accelerator": {"vm": "tcg"}, "reps": 3, **kinds}


def test_report_lists_every_method_of_each_kind() -> None:
    doc = _doc(vm=[_cfg([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])],
               container=[_cfg([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], "container")])  # fmt: skip
    text = report.report_md(doc)
    assert (
        "| 2 x 1 GiB (job holds 512 MiB) | hpvc | 2.00 / 3.00 / 4.00 | 1.00 / 2.00 / 3.00" in text
    )
    assert "| pcocc | 5.00 / 6.00 / 7.00 | 4.00 / 5.00 / 6.00" in text
    assert "| 512 / 512 / 512 | 3.00 / 3.00 / 3.00 | 3/3 |" in text
    assert "| 512 / 512 / 512 | - | 3/3 |" in text  # pcocc: no restore measured
    assert "job pause 0.40" in text
    assert "## Container clusters" in text and "| podman | 3.00 / 3.00 / 3.00" in text
    assert "Ratios hpvc / podman at the medians" in text and "restore 1.00" in text


def test_a_size_the_host_cannot_hold_is_reported_as_not_measured() -> None:
    skipped = {"nodes": 4, "memory_mib": 4096, "skipped": "cluster does not fit: memory"}
    doc = _doc(vm=[_cfg([1.0], [2.0]), skipped])
    text = report.report_md(doc)
    assert "- 4 x 4 GiB: cluster does not fit: memory" in text
    assert text.count("| hpvc |") == 1


@pytest.mark.parametrize(
    ("sizes", "mems", "reps", "fill", "word"),
    [
        ([1], [1024], 1, 0.5, "--nodes"),
        ([9], [1024], 1, 0.5, "--nodes"),
        ([2], [128], 1, 0.5, "--memory"),
        ([2], [1024], 0, 0.5, "--reps"),
        ([2], [1024], 1, 0.95, "--fill"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(
    sizes: list[int], mems: list[int], reps: int, fill: float, word: str
) -> None:
    with pytest.raises(InputError) as e:
        runner.preflight(["vm"], sizes, mems, reps, fill)
    assert e.value.line().startswith(word) and e.value.exit_code == 2


def test_a_locality_other_than_none_or_shm_is_refused() -> None:
    with pytest.raises(InputError) as e:
        runner.preflight(["container"], [2], [1024], 1, 0.5, "numa")
    assert e.value.line().startswith("--locality") and e.value.exit_code == 2


def test_cli_parses_sizes() -> None:
    assert cli.parse_memories("1GiB, 4GiB,512MiB") == [1024, 4096, 512]
    assert cli.parse_counts("2,4") == [2, 4]
    with pytest.raises(InputError):
        cli.parse_memories("lots")
    with pytest.raises(InputError):
        cli.parse_counts("two")


def test_nodes_keep_their_memory_when_the_host_has_it() -> None:
    assert report.node_mib(4, 4096, 17000) == (4096, "")


def test_nodes_are_given_less_where_the_host_has_less_and_it_is_said() -> None:
    got, note = report.node_mib(4, 4096, 15000)
    assert got == 3584  # 15000 // 4 = 3750, down to a multiple of 256
    assert "given 3584 MiB each, not 4096" in note and "15000 MiB available" in note
    assert report.node_mib(8, 4096, 1000)[0] == 256  # never below 256 MiB


def test_report_names_nodes_given_less_memory() -> None:
    sized = {"memory_mib": 4096, "node_mib": 3584, "nodes_sized_down": "given 3584 MiB each"}
    cfg = _cfg([1.0], [2.0], "container") | sized
    doc = _doc(container=[cfg])
    doc["host"]["loadavg_end"] = [2.5]  # type: ignore[index]
    text = report.report_md(doc)
    assert "| 2 x 3584 MiB (of 4 GiB) (job holds 512 MiB) | hpvc |" in text
    assert "- 2 x 4 GiB: given 3584 MiB each" in text and "at the end [2.5]." in text


def test_down_is_run_again_only_when_a_node_s_tasks_were_still_exiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hpvc.errors import HpvcError

    calls: list[str] = []
    still = HpvcError("down c", "cgroup /hpvc/c (remove cgroup /hpvc/c: tasks are still in it")

    def down(name: str, store: object, progress: object) -> None:
        calls.append(name)
        if len(calls) == 1:
            raise still

    monkeypatch.setattr(runner.lifecycle, "down", down)
    monkeypatch.setattr(runner, "DOWN_AGAIN_S", 0)
    runner._down("c", None, lambda m: None)  # type: ignore[arg-type]
    assert calls == ["c", "c"]

    def broken(name: str, store: object, progress: object) -> None:
        raise HpvcError("down c", "something else")

    monkeypatch.setattr(runner.lifecycle, "down", broken)
    with pytest.raises(HpvcError):
        runner._down("c", None, lambda m: None)  # type: ignore[arg-type]


def test_nodes_leave_room_for_what_is_held_at_the_restore() -> None:
    got, note = report.node_mib(4, 4096, 20700, held=1.0)  # Podman's half + the page cache
    assert got == 2560  # 20700 / (4 x 2) = 2587, down to a multiple of 256
    assert "1.0 x a node's memory held elsewhere" in note


def test_a_checkpoint_is_dropped_from_the_page_cache_before_its_restore(tmp_path: Path) -> None:
    """Both methods' restores read their files from the disk (runner.drop_cached):
    the files' pages leave the cache, as ``fincore`` (util-linux) counts them."""
    if shutil.which("fincore") is None:
        pytest.fail("fincore (util-linux) is missing")
    (tmp_path / "node").mkdir()
    for name in ("node/pages.img", "upper.tar"):
        (tmp_path / name).write_bytes(os.urandom(1 << 20))

    def cached() -> int:
        files = [str(p) for p in sorted(tmp_path.rglob("*")) if p.is_file()]
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return sum(int(x) for x in out.split())

    assert cached() > 0  # just written: in the cache
    runner.drop_cached(tmp_path)
    assert cached() == 0

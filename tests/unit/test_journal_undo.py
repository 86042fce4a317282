"""Undo stops at the first failed step, keeps it and all older ones, writes no
byte, never recreates a folder a step removed; teardown and down wait for
every node; a record is saved on a full disk from the reserve."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from hpvc.cluster import lifecycle
from hpvc.errors import HpvcError
from hpvc.host.journal import Args, Journal, undoer
from hpvc.store import ClusterRecord, Store
from hpvc.store import records as state

DONE: list[str] = []
FAILING: set[str] = set()


@undoer("test-step", what=lambda a: f"step {a['n']}")
def _undo_step(args: Args) -> None:
    if args["n"] in FAILING:
        raise HpvcError(f"step {args['n']}", "refused", "let it be")
    DONE.append(args["n"])


@undoer("test-rmdir")
def _undo_rmdir(args: Args) -> None:
    folder = Path(args["path"])
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    DONE.append("rmdir")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    DONE.clear()
    FAILING.clear()


def steps(j: Journal) -> list[Any]:
    return [c.args.get("n", c.kind) for c in j.entries()]


def test_a_failed_step_stops_the_undo_and_keeps_every_older_step(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    for n in "abcd":
        j.record("test-step", n=n)
    inode = (tmp_path / "j.jsonl").stat().st_ino
    FAILING.add("b")
    assert j.undo_all() == ["step b (refused; let it be)"]
    assert DONE == ["d", "c"]  # "a" is older than the failed "b": never touched
    assert steps(j) == ["a", "b"]
    assert (tmp_path / "j.jsonl").stat().st_ino == inode  # cut in place, not rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.jsonl"]  # no temporary file
    FAILING.clear()
    assert j.undo_all() == []
    assert DONE == ["d", "c", "b", "a"]
    assert not (tmp_path / "j.jsonl").exists()


def test_a_step_that_removes_the_journals_folder_is_never_followed_by_a_write(
    tmp_path: Path,
) -> None:
    node = tmp_path / "node"
    j = Journal(node / "journal.jsonl")
    j.record("test-step", n="older")
    j.record("test-rmdir", path=str(node))
    j.record("test-step", n="newer")
    FAILING.add("older")
    (error,) = j.undo_all()
    assert DONE == ["newer", "rmdir"]
    assert "step older (refused" in error and "the journal went with its folder" in error
    assert not node.exists()  # not made again to hold the journal


def test_a_torn_line_is_dropped_and_cannot_swallow_the_next_record(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    j.record("test-step", n="a")
    with path.open("a") as f:
        f.write('{"kind": "test-st')  # a crash mid-write
    j.record("test-step", n="b")
    assert steps(j) == ["a", "b"]
    assert j.undo_all() == []
    assert DONE == ["b", "a"]


def test_a_kind_nobody_registered_stops_the_undo_too(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    j.record("test-step", n="a")
    with path.open("a") as f:
        f.write('{"args": {}, "kind": "martian", "module": "os"}\n')
    j.record("test-step", n="b")
    (error,) = j.undo_all()
    assert "no undo for 'martian'" in error and DONE == ["b"]
    assert steps(j) == ["a", "martian"]


# --- teardown and down ----------------------------------------------------------------


def cluster(store: Store, name: str, nodes: dict[str, list[str]]) -> None:
    store.save(ClusterRecord(name, {}, "", {}, "running", 0.0, 0.0))
    store.journal(name).record("test-step", n=f"{name}-cluster")
    for node, ns in nodes.items():
        for n in ns:
            store.node_journal(name, node).record("test-step", n=n)


def test_down_waits_for_every_node_and_says_what_is_left(tmp_path: Path) -> None:
    store = Store(tmp_path / "state")
    cluster(store, "c", {"n0": ["n0-folder", "n0-domain"], "n1": ["n1-folder", "n1-veth"]})
    FAILING.add("n0-domain")
    with pytest.raises(HpvcError) as e:
        lifecycle.down("c", store)
    assert e.value.exit_code == 1
    assert e.value.line() == (
        "down c: not finished: step n0-domain (refused; let it be); "
        "2 older step(s) kept until then (run hpvc down c again once that is fixed)"
    )
    assert DONE == ["n1-veth", "n1-folder"]  # the other node went; nothing older than n0's
    assert store.get("c").status == "deleting"
    assert steps(store.node_journal("c", "n0")) == ["n0-folder", "n0-domain"]
    assert steps(store.journal("c")) == ["c-cluster"]
    FAILING.clear()
    lifecycle.down("c", store)
    assert DONE[2:] == ["n0-domain", "n0-folder", "c-cluster"]
    assert store.load("c") is None and not store.cluster_dir("c").exists()


# --- a full state disk ----------------------------------------------------------------


def test_a_record_is_saved_into_the_reserve_when_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "state")
    rec = ClusterRecord("c", {}, "", {}, "running", 0.0, 0.0)
    store.save(rec)
    reserve = store.layout.reserve()
    assert reserve.stat().st_size == state.RESERVE_BYTES  # made by the first save
    blocks = reserve.stat().st_blocks
    assert blocks * 512 >= state.RESERVE_BYTES  # allocated, not sparse
    inode = reserve.stat().st_ino

    def no_space(path: Path, data: bytes) -> None:
        path.write_bytes(data[:10])  # a partial write, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(state, "_write_new", no_space)
    rec.status = "deleting"
    store.save(rec)
    record = store.cluster_dir("c") / "cluster.json"
    assert record.stat().st_ino == inode  # the reserve's blocks now hold the record
    assert store.get("c").status == "deleting"
    assert not (store.cluster_dir("c") / "cluster.json.tmp").exists()
    assert reserve.stat().st_size == state.RESERVE_BYTES  # room again: a new reserve
    reserve.unlink()
    with pytest.raises(OSError) as e:  # no reserve left: the error as it was
        store.save(rec)
    assert e.value.errno == errno.ENOSPC


def test_undo_progress_says_what_was_undone_not_the_raw_args(tmp_path: Path) -> None:
    """`hpvc scale` down printed `undo qemu {'name': ..., 'pidfile': ...}` (issue 32, item 5)."""
    j = Journal(tmp_path / "j.jsonl")
    j.record("test-step", n="a")
    folder = tmp_path / "gone"
    folder.mkdir()
    j.record("test-rmdir", path=str(folder), mode=0o700, extra={"x": 1})
    said: list[str] = []
    assert j.undo_all(said.append) == []
    assert said == [f"undo test-rmdir {folder}", "undo step a"]
    assert not any("{" in line for line in said)

"""Each VM cluster's QEMU uid (hpvc.host.qemu_user) and the QEMU arguments that use it."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from hpvc.host import qemu_user
from hpvc.host.journal import Journal
from hpvc.render import qemu_argv
from hpvc.render.qemu import SANDBOX
from tests.unit.test_render import ctx, hand_vm_plan

FIRST = qemu_user.FIRST_UID


def fake_proc(root: Path, uids: dict[int, int]) -> Path:
    """A /proc with one process per entry: pid -> its uid."""
    for pid, uid in uids.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "status").write_text(
            f"Name:\tx\nPid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        )
    return root


def after(uid: int, n: int) -> int:
    """The uid n places after ``uid`` in the search (it wraps around the range)."""
    return FIRST + (uid - FIRST + n) % qemu_user.COUNT


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    return fake_proc(tmp_path / "proc", {1: 0})


def claim(tmp: Path, cluster: str, proc: Path, journal: Journal | None = None) -> int:
    (tmp / "state" / "clusters" / cluster).mkdir(parents=True, exist_ok=True)  # its record's
    j = journal or Journal(tmp / "journals" / f"{cluster}.jsonl")
    return qemu_user.claim(j, tmp / "state", cluster, proc=proc)


def test_each_cluster_gets_its_own_uid_and_keeps_it(tmp_path: Path, proc: Path) -> None:
    a, b = claim(tmp_path, "a", proc), claim(tmp_path, "b", proc)
    assert a >= FIRST and b >= FIRST and a != b
    assert claim(tmp_path, "a", proc) == a  # scale, restart: the same uid again
    assert qemu_user.find(tmp_path / "state", "b") == b
    assert qemu_user.find(tmp_path / "state", "c") is None
    folder = tmp_path / "state" / qemu_user.UIDS_DIR
    assert folder.stat().st_mode & 0o777 == 0o700
    assert (folder / str(a)).read_text() == "a\n"


def test_a_uid_a_process_runs_as_is_never_given(tmp_path: Path) -> None:
    # Another state directory's QEMU (or anything else) already runs as the first try.
    first = qemu_user.first_try(tmp_path / "state")
    proc = fake_proc(tmp_path / "proc", {1: 0, 77: first, 78: after(first, 1)})
    assert claim(tmp_path, "a", proc) == after(first, 2)


def test_two_state_roots_start_at_different_uids(tmp_path: Path, proc: Path) -> None:
    # The Slurm test cluster's hosts: one machine, a state root each, shares
    # started at once (before either QEMU runs) must not get the same uid.
    roots = [tmp_path / "hpvc" / h for h in ("n1", "n2", "n3")]
    firsts = {qemu_user.first_try(r) for r in roots}
    assert len(firsts) == 3
    assert all(FIRST <= u < FIRST + qemu_user.COUNT for u in firsts)
    got = set()
    for r in roots:
        (r / "clusters" / "j1-0").mkdir(parents=True)
        got.add(qemu_user.claim(Journal(r / "j.jsonl"), r, "j1-0", proc=proc))
    assert got == firsts


def test_a_uid_the_host_knows_is_never_given(tmp_path: Path, proc: Path) -> None:
    known: set[int] = set()
    real = pwd.getpwuid

    def lookup(uid: int) -> pwd.struct_passwd:
        if uid in known:
            return pwd.struct_passwd(("site", "x", uid, uid, "", "/", "/bin/sh"))
        return real(uid)

    mp = pytest.MonkeyPatch()
    try:
        first = qemu_user.first_try(tmp_path / "state")
        known.update({first, after(first, 1)})
        mp.setattr(qemu_user.pwd, "getpwuid", lookup)
        assert claim(tmp_path, "a", proc) == after(first, 2)
    finally:
        mp.undo()


def test_undo_frees_the_uid_only_while_the_cluster_holds_it(tmp_path: Path, proc: Path) -> None:
    ja = Journal(tmp_path / "a.jsonl")
    a = claim(tmp_path, "a", proc, ja)
    stale = ja.entries()
    assert [c.kind for c in stale] == ["qemu-uid"]
    assert ja.undo_all() == []
    assert qemu_user.find(tmp_path / "state", "a") is None
    c = claim(tmp_path, "c", proc)
    assert c == a  # freed, so given again
    old = Journal(tmp_path / "stale.jsonl")  # a's journal replayed after the fact
    for change in stale:
        old.record(change.kind, **change.args)
    assert old.undo_all() == []
    assert qemu_user.find(tmp_path / "state", "c") == c  # c's claim stays


def test_every_uid_in_use_is_an_error(tmp_path: Path, proc: Path) -> None:
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(qemu_user, "COUNT", 2)
        claim(tmp_path, "a", proc)
        claim(tmp_path, "b", proc)
        with pytest.raises(qemu_user.HpvcError, match="all 2 uids"):
            claim(tmp_path, "c", proc)
    finally:
        mp.undo()


def test_process_uids_reads_every_uid_of_the_real_proc() -> None:
    assert os.getuid() in qemu_user.process_uids()


def test_qemu_drops_to_the_uid_in_a_sandbox() -> None:
    plan = hand_vm_plan()
    node = plan.node("compute0")
    argv = qemu_argv(plan, node, ctx(qemu_uid=FIRST + 5))
    i = argv.index("-runas")
    assert argv[i + 1] == f"{FIRST + 5}:{FIRST + 5}"
    j = argv.index("-sandbox")
    assert argv[j + 1] == SANDBOX
    opts = dict(o.split("=") for o in SANDBOX.split(",")[1:])
    assert SANDBOX.startswith("on,")
    assert opts == {
        "obsolete": "deny",
        "spawn": "deny",
        "resourcecontrol": "deny",
        "elevateprivileges": "allow",  # -runas needs setuid after the filter is in
    }
    plain = qemu_argv(plan, node, ctx())
    assert "-runas" not in plain and "-sandbox" not in plain
    assert argv[:i] + argv[j + 2 :] == plain
    with pytest.raises(ValueError, match="root"):
        qemu_argv(plan, node, ctx(qemu_uid=0))


def test_the_uid_of_a_cluster_whose_state_is_gone_is_given_again(
    tmp_path: Path, proc: Path
) -> None:
    a = claim(tmp_path, "a", proc)
    b = claim(tmp_path, "b", proc)
    (tmp_path / "state" / "clusters" / "a").rmdir()  # swept without its journal's undo
    assert claim(tmp_path, "c", proc) == a
    assert qemu_user.find(tmp_path / "state", "a") is None
    assert qemu_user.find(tmp_path / "state", "b") == b

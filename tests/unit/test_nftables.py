"""host/nftables.py: the one loader and deleter of hpvc's nftables tables, used by
host/vxlan.py and host/migration_guard.py (each journals its own undo kind first).

``subprocess.run`` is replaced by a recorder: these tests check what is fed to
``nft`` and in which order with the journal, not nftables itself (the tables
are loaded for real by tests/integration/test_vxlan.py and test_slurm_migrate.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpvc.errors import HpvcError, MissingDependency
from hpvc.host import migration_guard, nftables
from hpvc.host.journal import Journal

Fed = list[tuple[list[str], str | None]]


def recorder(
    monkeypatch: pytest.MonkeyPatch, rc: int = 0, stderr: str = "", seen: Journal | None = None
) -> Fed:
    fed: Fed = []

    def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if seen is not None:  # the undo is journaled before nft runs
            assert [c.kind for c in seen.entries()] == ["migration-guard"]
        text = kw.get("input")
        fed.append((argv, str(text) if text is not None else None))
        return subprocess.CompletedProcess(argv, rc, "", stderr)

    monkeypatch.setattr(nftables.shutil, "which", lambda _: "/usr/sbin/nft")
    monkeypatch.setattr(nftables.subprocess, "run", run)
    return fed


def test_the_guard_journals_then_feeds_its_rules(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    j = Journal(tmp_path / "j.jsonl")
    fed = recorder(monkeypatch, seen=j)
    table = migration_guard.guard_target(j, "tapx", "10.1.0.2", 49152, "10.1.0.1")
    ((argv, text),) = fed
    assert argv == ["/usr/sbin/nft", "-f", "-"]
    assert text == migration_guard.target_rules(table, "10.1.0.2", 49152, "10.1.0.1")
    assert [c.args for c in j.entries()] == [{"table": "hpvc-mig-tapx"}]


def test_a_refused_table_names_nfts_last_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    recorder(monkeypatch, rc=1, stderr="Error: syntax\nadd rule ...\n^^^ bad port\n")
    with pytest.raises(HpvcError, match=r"nftables table t1.*bad port"):
        nftables.load("/usr/sbin/nft", "t1", "add table inet t1\n")


def test_deleting_a_table_that_is_gone_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    fed = recorder(monkeypatch, rc=1, stderr="Error: No such file or directory")
    nftables.delete("hpvc-mig-x")
    assert fed == [(["/usr/sbin/nft", "delete", "table", "inet", "hpvc-mig-x"], None)]
    recorder(monkeypatch, rc=1, stderr="Error: Operation not permitted")
    with pytest.raises(HpvcError, match="not permitted"):
        migration_guard.remove("hpvc-mig-x")


def test_no_nft_is_a_missing_dependency_naming_the_need(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nftables.shutil, "which", lambda _: None)
    with pytest.raises(MissingDependency, match="migration between hosts"):
        migration_guard.guard_source(Journal(Path("/nonexistent/j")), "t", "10.1.0.2", 1, 5)
    nftables.delete("gone")  # nothing to delete with: not an error

"""The docs' examples hold (issue 32): every README.md block is run, a spec or
skipped with a why (tests/readme.py; tests/integration/test_readme.py runs
them), every examples/*.toml a document names exists and plans, and the
error line docs/spec.md shows is the one hpvc prints."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpvc.cli import main
from tests.readme import README, ROOT, Block, blocks

DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
SNAPSHOT = "64amd64-4s2n4ca2co"
NAMED = sorted(
    {m for d in DOCS for m in re.findall(r"examples/[\w.-]+\.toml", d.read_text())}
    - {"examples/bad.toml"}  # docs/spec.md's mistake, checked below
)


def test_every_readme_block_is_run_a_spec_or_skipped_with_a_why() -> None:
    found = blocks(README.read_text())
    assert len(found) >= 8
    for b in found:
        assert b.action in ("run", "spec", "skip"), b
        if b.action == "skip":
            assert len(b.reason) > 10, f"README.md:{b.line}: say why it is skipped"
        if b.action == "run":
            assert b.commands(), f"README.md:{b.line}: a run block with no command"
    assert [b.action for b in found].count("run") >= 4


def test_markers_arrows_and_allowed_exits_parse() -> None:
    md = (
        "1. Step\n\n"
        '   <!-- readme-test: run; "hpvc plan x.toml" may exit 2 (small host) -->\n\n'
        "       hpvc plan x.toml      # on this host\n"
        "       hpvc run demo -- hostname   # MPI → compute0, compute1\n\n"
        "<!-- readme-test: skip (takes minutes) -->\n```sh\nmake demo\n```\n"
    )
    run, skip = blocks(md)
    assert (run.line, run.action, skip.action, skip.reason) == (5, "run", "skip", "takes minutes")
    plan, mpi = run.commands()
    assert (plan.may_exit, plan.expect) == (2, ())
    assert (mpi.may_exit, mpi.expect) == (None, ("compute0", "compute1"))
    with pytest.raises(ValueError, match="unknown readme-test marker"):
        blocks("<!-- readme-test: maybe -->\n```\nx\n```\n")


def test_a_block_with_no_marker_runs() -> None:
    (b,) = blocks("Text\n\n    hpvc ls\n")
    assert b == Block(3, "hpvc ls", "run")


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("topo")
    tar = ROOT / "tests" / "data" / "topologies" / f"{SNAPSHOT}.tar.bz2"
    subprocess.run(["tar", "xjf", str(tar), "-C", str(out)], check=True)
    return out / SNAPSHOT


@pytest.mark.parametrize("name", NAMED)
def test_every_example_a_document_names_exists_and_plans(
    name: str, snapshot: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ROOT / name
    assert path.is_file(), f"{name} is named in the docs but does not exist"
    if name == "examples/hosts.toml":
        return  # an inventory, planned with --hosts by tests/unit/test_readme_topologies.py
    with pytest.raises(SystemExit) as e:
        main(["plan", str(path), "--topology-root", str(snapshot)])
    assert e.value.code == 0, capsys.readouterr().err


def test_the_spec_mistake_docs_spec_md_shows_is_what_hpvc_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = re.search(
        r"^ {4}(hpvc: examples/bad\.toml: .*)$", (ROOT / "docs/spec.md").read_text(), re.M
    )
    assert shown, "docs/spec.md no longer shows the examples/bad.toml line"
    (tmp_path / "examples").mkdir()
    good = (ROOT / "examples" / "cluster.toml").read_text()
    bad = re.sub(r'(?m)^hugepages = ".*"', 'hugepages = "4M"', good)
    assert bad != good
    (tmp_path / "examples" / "bad.toml").write_text(bad)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["plan", "examples/bad.toml"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == shown.group(1)
    shutil.rmtree(tmp_path / "examples")

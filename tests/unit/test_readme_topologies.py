"""The README's topology steps work as written in a fresh checkout (issue 32):
the snapshots are extracted by a README step into build/topologies/, and
examples/hosts.toml names them relative to itself."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hpvc.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXTRACT = (
    "mkdir -p build/topologies && for f in tests/data/topologies/*.tar.bz2;"
    ' do tar xjf "$f" -C build/topologies; done'
)


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout's examples/ and snapshots, with the README's extraction step run in it."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "tests" / "data" / "topologies", tmp_path / "tests/data/topologies")
    subprocess.run(["bash", "-c", EXTRACT], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HPVC_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def test_the_readme_extracts_the_snapshots_it_uses() -> None:
    readme = (ROOT / "README.md").read_text()
    assert EXTRACT in readme
    assert "/tmp/t/" not in readme
    assert "/tmp/hpvc-topo" not in (ROOT / "examples" / "hosts.toml").read_text()


def test_plan_with_the_example_inventory_from_the_repository_root(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", "examples/cluster.toml", "--hosts", "examples/hosts.toml"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "amd0" in out


@pytest.mark.parametrize(
    "argv", [["topology", "--root"], ["plan", "examples/cluster.toml", "--topology-root"]]
)
def test_the_readme_snapshot_root_reads(
    argv: list[str], checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main([*argv, "build/topologies/64amd64-4s2n4ca2co", "--json"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(("{", "["))

"""A topology root that cannot be read: the line names the option or the inventory
file and key it came from, and a fix that exists for that command (issue 32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPEC = str(ROOT / "examples" / "cluster.toml")


def _err(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("command", ["plan", "render"])
def test_topology_root_missing_names_topology_root_not_root(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nonexistent"
    out = ["-o", str(tmp_path / "out")] if command == "render" else []
    line = _err([command, SPEC, "--topology-root", str(missing), *out], capsys)
    assert line.startswith(f"hpvc: --topology-root: {missing} is not a directory (")
    assert "pass --topology-root a folder" in line
    assert "--root" not in line.replace("--topology-root", "")


def test_inventory_bad_topology_names_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        '[[hosts]]\nname = "a"\ntopology = "/"\n\n[[hosts]]\nname = "b"\ntopology = "nowhere"\n'
    )
    line = _err(["plan", SPEC, "--hosts", str(hosts)], capsys)
    assert line.startswith(f"hpvc: {hosts}: hosts[1].topology: {tmp_path / 'nowhere'} is not a")
    assert "relative to the inventory file" in line
    assert "--root" not in line

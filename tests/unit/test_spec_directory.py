"""A directory given where a spec file is wanted: one line saying so, exit 2 (issue 32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.cli import main


def test_up_directory_says_a_spec_file_is_wanted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HPVC_STATE_DIR", str(tmp_path / "state"))
    d = tmp_path / "specs"
    d.mkdir()
    with pytest.raises(SystemExit) as e:
        main(["up", str(d)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"hpvc: {d}: is a directory, not a spec file (give the path of a cluster spec .toml file)"
    ]
    assert "permissions" not in err

"""`hpvc node check` (srun --hpvc=FILE) on a spec the user cannot read, or one
that is missing: one line naming the file and the fix, exit 2, never click's
usage box (issue 32, item 4)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpvc.cli import run_here

SPEC = 'name = "s"\nkind = "container"\nimage = "hpc"\n\n[[nodes]]\nrole = "head"\n'


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        run_here(args)
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out + out.err


def test_unreadable_spec_is_one_line_with_the_permission_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "s.toml"
    p.write_text(SPEC)
    real_access = os.access
    monkeypatch.setattr(
        "os.access", lambda f, m, *a, **k: False if str(f) == str(p) else real_access(f, m)
    )
    real_read = Path.read_text

    def read_text(self: Path, *a: object, **k: object) -> str:
        if self == p:
            raise PermissionError(13, "Permission denied", str(p))
        return real_read(self)

    monkeypatch.setattr(Path, "read_text", read_text)
    code, out = _run(["node", "check", str(p)], capsys)
    assert code == 2
    assert "Usage:" not in out and "Invalid value" not in out
    line = " ".join(out.split())
    assert line.startswith(f"hpvc: --hpvc={p}: Permission denied")
    assert f"chmod a+r {p}" in line


def test_missing_spec_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "nope.toml"
    code, out = _run(["node", "check", str(p)], capsys)
    assert code == 2
    assert "Usage:" not in out
    assert " ".join(out.split()).startswith(f"hpvc: --hpvc={p}: No such file or directory")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_a_real_user_on_a_0000_spec_gets_one_line(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    p = tmp_path / "s.toml"
    p.write_text(SPEC)
    p.chmod(0)
    code = f"from hpvc.cli import run_here; run_here(['node', 'check', {str(p)!r}])"
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "300", "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"hpvc: --hpvc={p}: Permission denied (let the submitting user read it, e.g. chmod a+r {p})"
    ]

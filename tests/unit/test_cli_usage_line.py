"""A command-line mistake is one line with where to look, exit 2 (issue 32, item 10)."""

from __future__ import annotations

import pytest

from hpvc.cli import run_here


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        run_here(args)
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def test_a_missing_option_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["render", "examples/small.toml"], capsys)
    assert code == 2
    assert err.strip().splitlines() == [
        "hpvc: render: Missing option '--out' / '-o' (see hpvc render --help)"
    ]


def test_an_unknown_option_and_a_typo_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["ls", "--bogus"], capsys)
    assert code == 2 and err.strip() == "hpvc: ls: No such option: --bogus (see hpvc ls --help)"
    code, _, err = _run(["stauts", "x"], capsys)
    (line,) = err.strip().splitlines()
    assert code == 2 and line.startswith("hpvc: stauts: No such command 'stauts'.")
    assert "Did you mean 'status'?" in line and line.endswith("(see hpvc --help)")


def test_help_and_a_commands_own_exit_code_still_work(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--help"], capsys)
    assert code == 0 and "Usage: hpvc" in out
    code, _, err = _run(["exec", "nosuch", "x", "--", "true"], capsys)
    assert code == 2 and err.startswith("hpvc: cluster 'nosuch'")

"""`hpvc exec` reports a shell's 127/126 where crun exec says 255 (issue 32, item 15)."""

from __future__ import annotations

import os
from pathlib import Path

from hpvc.backends.crun.container import command_status

PATH = "/usr/local/bin:/usr/bin:/bin"


def _root(tmp_path: Path) -> Path:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "usr/bin/tool"
    tool.write_text("#!/bin/sh\n")
    os.chmod(tool, 0o755)
    data = tmp_path / "bin/data"
    data.write_text("not a program\n")
    os.chmod(data, 0o644)
    return tmp_path


def test_missing_command_is_127(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert command_status(root, "nosuchcmd", PATH) == 127
    assert command_status(root, "/opt/nosuchcmd", PATH) == 127


def test_not_executable_is_126(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert command_status(root, "data", PATH) == 126
    assert command_status(root, "/usr/bin", PATH) == 126  # a directory


def test_a_real_command_keeps_the_runtime_code(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert command_status(root, "tool", PATH) is None
    assert command_status(root, "/usr/bin/tool", PATH) is None

"""Journals name the module of each undo, so a process that loaded no backend undoes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


def _py(code: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return r.stdout.strip()


def test_undo_loads_the_module_that_registered_the_kind(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    _py(
        "from hpvc.backends.crun import container\n"
        "from hpvc.host.journal import Journal\n"
        f"Journal({str(path)!r}).record('overlay', path={str(tmp_path / 'not-mounted')!r})"
    )
    line = json.loads(path.read_text())
    assert line["module"] == "hpvc.backends.crun.container"
    out = _py(
        "import sys\n"
        "from hpvc.host.journal import Journal\n"
        "assert 'hpvc.backends.crun.container' not in sys.modules\n"
        f"print(Journal({str(path)!r}).undo_all(), 'hpvc.backends.crun.container' in sys.modules)"
    )
    assert out == "[] True"
    assert not path.exists()  # undone, so dropped


def test_a_journal_naming_a_module_an_older_hpvc_had_is_still_undone(tmp_path: Path) -> None:
    """Backends moved into folders: a journal written before names the old module."""
    path = tmp_path / "journal.jsonl"
    old = {"path": str(tmp_path / "not-mounted")}
    path.write_text(
        json.dumps({"kind": "overlay", "args": old, "module": "hpvc.backends.container"}) + "\n"
    )
    out = _py(f"from hpvc.host.journal import Journal\nprint(Journal({str(path)!r}).undo_all())")
    assert out == "[]"
    assert not path.exists()


def test_every_moved_module_exists_and_registers_undoers() -> None:
    from hpvc.host.journal import MOVED

    out = _py(
        "import importlib, json\n"
        "from hpvc.host.journal import MOVED, _UNDO\n"
        "for new in MOVED.values():\n"
        "    importlib.import_module(new)\n"
        "print(json.dumps(sorted({v.__module__ for v in _UNDO.values()})))"
    )
    registering = set(json.loads(out))
    assert "hpvc.backends.crun.container" in registering
    assert not set(MOVED) & set(MOVED.values())


def test_a_kind_nobody_registers_is_kept_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps({"kind": "martian", "args": {}, "module": "os"}) + "\n")
    out = _py(f"from hpvc.host.journal import Journal\nprint(Journal({str(path)!r}).undo_all())")
    assert "no undo for 'martian'" in out
    assert json.loads(path.read_text())["kind"] == "martian"


def test_recording_a_kind_nobody_can_undo_is_refused(tmp_path: Path) -> None:
    from hpvc.host.journal import Journal

    with pytest.raises(RuntimeError, match="no @undoer registered for 'martian'"):
        Journal(tmp_path / "j.jsonl").record("martian", x=1)
    assert not (tmp_path / "j.jsonl").exists()


def test_a_vm_node_folder_is_undone_by_a_process_that_loaded_no_backend(tmp_path: Path) -> None:
    """VM backends record their node folders too ("tree"): the module that undoes
    them must be named in the journal, whichever backend wrote it."""
    node = tmp_path / "clusters" / "c" / "nodes" / "n0"
    path = tmp_path / "journal.jsonl"
    registered = _py(
        "from pathlib import Path\n"
        "from hpvc.backends.vm import guest  # what a VM up imports, and no container code\n"
        "from hpvc.host.journal import _UNDO, Journal\n"
        "print('tree' in _UNDO)\n"
        f"Path({str(node)!r}).mkdir(parents=True)\n"
        f"guest.tree.record(Journal({str(path)!r}), Path({str(node)!r}))"
    )
    assert registered == "True"
    out = _py(f"from hpvc.host.journal import Journal\nprint(Journal({str(path)!r}).undo_all())")
    assert out == "[]" and not node.exists()

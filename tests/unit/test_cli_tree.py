"""The lazy command tree: every command is listed with its own summary, loads
when named, and the quick commands do not import what they do not use."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpvc.cli import tree


@pytest.mark.parametrize("name", list(tree.COMMANDS))
def test_each_summary_is_the_start_of_the_commands_own_help(name: str) -> None:
    cmd = tree.load(name)
    own = " ".join((cmd.help or "").split())
    summary = tree.COMMANDS[name][1]
    assert own.startswith(summary), f"{name}: {summary!r} is not how {own[:120]!r} starts"


def test_help_lists_every_command_without_loading_one() -> None:
    code = (
        "import sys\n"
        "from hpvc.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('hpvc.cli.') and m not in"
        " ('hpvc.cli.common', 'hpvc.cli.tree'))\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for name in tree.COMMANDS:
        assert re.search(rf"│ {name}\s", r.stdout), f"{name} missing from --help"
    assert "LOADED []" in r.stderr


def test_a_typo_gets_a_suggestion_among_all_commands() -> None:
    r = CliRunner().invoke(tree.app, ["stauts", "x"])
    assert r.exit_code == 2
    assert "Did you mean 'status'?" in r.output


# hpvc.spec itself is lazy (its Spark sizing rules are read by the plan); the schema is heavy
HEAVY = ("pydantic", "pyroute2", "hpvc.plan.planner", "hpvc.spec.model", "hpvc.backends.base")


@pytest.mark.parametrize("argv", [["ls", "--json"], ["node", "ls", "--json"]])
def test_listing_commands_do_not_import_the_planner_or_netlink(
    argv: list[str], tmp_path: Path
) -> None:
    code = (
        "import json, sys\n"
        "from hpvc.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"HPVC_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert json.loads(r.stdout) == []
    assert json.loads(r.stderr.strip().splitlines()[-1]) == []

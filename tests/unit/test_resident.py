"""The resident hpvc's client side: its request format, where it looks for
the server, which commands never go there, and that it costs little to load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpvc import resident
from tests.helpers import requires


def test_a_request_comes_back_as_it_was_sent() -> None:
    argv = ["node", "up", "--site", "subnets=10.88.0.0/16", "x=y", "é"]
    env = {"A": "1", "B": "with=equals", "EMPTY": "", "U": "ünï"}
    got = resident.decode(resident.encode(argv, env, 0o027))
    assert got == (resident.identity(), 0o027, argv, env)


def test_the_socket_follows_the_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPVC_RESIDENT_SOCKET", raising=False)
    monkeypatch.delenv("HPVC_STATE_DIR", raising=False)
    default = resident.socket_path()
    assert default.startswith("/run/hpvc/") and default.endswith(".sock")
    monkeypatch.setenv("HPVC_STATE_DIR", "/tmp/elsewhere")
    assert resident.socket_path() != default
    assert resident.socket_path() == resident.socket_path("/tmp/elsewhere")
    monkeypatch.setenv("HPVC_RESIDENT_SOCKET", "/tmp/x.sock")
    assert resident.socket_path() == "/tmp/x.sock"


@pytest.mark.parametrize(
    "argv", [["exec", "c", "n", "--", "sh"], ["run", "c"], ["node", "enter", "--job", "1"],
             ["bench", "startup"], ["serve"]],
)  # fmt: skip
def test_interactive_and_long_commands_stay_in_the_callers_process(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPVC_RESIDENT_SOCKET", "/nonexistent/never-connected.sock")
    assert resident.try_remote(argv) is None


def test_no_server_means_the_command_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPVC_RESIDENT_SOCKET", "/nonexistent/no-server.sock")
    assert resident.try_remote(["ls"]) is None
    monkeypatch.setenv("HPVC_RESIDENT", "0")
    assert resident.try_remote(["ls"]) is None


def test_the_client_loads_no_more_than_it_needs() -> None:
    code = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import hpvc.cli, hpvc.resident\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(r.stdout))
    heavy = {"typer", "rich", "pydantic", "pyroute2", "pathlib", "dataclasses", "hashlib"}
    assert not loaded & heavy, loaded & heavy


def test_the_server_sees_the_callers_own_supplementary_groups() -> None:
    """The groups of the connecting process, not the user's from /etc/group."""
    requires("root")  # setpriv --groups (util-linux, always there) needs it
    code = (
        "import socket\n"
        "from hpvc.resident_server import _peer_groups\n"
        "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "print(sorted(_peer_groups(a)))\n"
    )
    r = subprocess.run(
        ["setpriv", "--groups", "5,7", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.strip() == "[5, 7]"

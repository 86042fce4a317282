"""The resident hpvc's client side: its request format, where it looks for
the server, which commands never go there, and that it costs little to load."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpvc import resident, resident_server
from hpvc.host import caller
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


def test_the_server_reads_the_callers_groups_and_limits_from_the_kernel() -> None:
    """Groups (more than the 256 SO_PEERGROUPS gave), limits and cgroups of
    the connecting process, as /proc says, not the user's from /etc/group."""
    requires("root")  # setpriv --groups (util-linux, always there) needs it
    groups = list(range(1000, 1300))
    cmd = ["setpriv", "--groups", ",".join(map(str, groups))]
    cmd += ["prlimit", "--nofile=100:200", "sleep", "30"]
    proc = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 10
        while "sleep" not in Path(f"/proc/{proc.pid}/comm").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        got = caller.read(proc.pid, 0)
        assert got is not None
        assert got.groups == tuple(groups)
        assert (resource.RLIMIT_NOFILE, 100, 200) in got.limits
        assert got.cgroups == Path(f"/proc/{proc.pid}/cgroup").read_text()
        assert caller.read(proc.pid, 4321) is None  # another user's process
    finally:
        proc.kill()
        proc.wait()
    assert caller.read(proc.pid, 0) is None  # gone


def test_a_newline_in_argv_does_not_make_a_log_line() -> None:
    forged = "x\nhpvc serve: pid 1 uid 0: down everything -> 0 in 0.1 s"
    line = resident_server.shown(["status", forged, "plain/path.toml", "a b", ""])
    assert "\n" not in line
    assert line.startswith("status ") and " plain/path.toml " in line
    assert json.dumps(forged) in line and json.dumps("a b") in line


NEVER = ("recv", "recvmsg", "recv_into", "recvfrom", "recvmsg_into", "recvfrom_into")
CLIENT = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1].replace("@", "\\0", 1))
socket.send_fds(s, [b"x"], [0, 1, 2])
print(s.recv(16).hex(), flush=True)
sys.stdin.read()
"""


def test_the_root_loop_reads_nothing_a_client_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root only accepts, asks who, counts and forks (no fork here: os.fork is
    a stand-in); any receive from a client socket in root fails the test,
    and a user over the limit is turned away without root reading a byte."""
    requires("root")
    address = f"@hpvc-test-{os.getpid()}"  # abstract: any user may connect
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address.replace("@", "\0", 1))
    listener.listen(8)
    listener.setblocking(False)
    forks: list[int] = []

    def fork() -> int:
        forks.append(10_000_000 + len(forks))
        return forks[-1]

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("root received from a client")

    monkeypatch.setattr(os, "fork", fork)
    monkeypatch.setattr(socket, "recv_fds", never)
    for name in NEVER:
        monkeypatch.setattr(socket.socket, name, never)
    server = resident_server._Server(listener, lambda _a: 0, lambda _l: None, 2, 1.0)
    user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]
    clients = []
    try:
        for _ in range(3):  # one at a time: the third is the one over the limit
            clients.append(
                subprocess.Popen(
                    [*user, "-c", CLIENT, address],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            deadline = time.monotonic() + 10
            taken = len(forks)
            while len(forks) == taken:
                assert time.monotonic() < deadline, "no connection came"
                time.sleep(0.02)
                server.accept_all()
        assert list(server.relays.values()) == [65534, 65534]
        assert list(server.closers.values()) == [65534]  # it had sent: a fork closes it
        assert clients[2].stdout is not None
        assert clients[2].stdout.readline().strip() == (b"R" + bytes(4)).hex()
    finally:
        for c in clients:
            c.kill()
            c.wait()
        listener.close()

"""The resident hpvc (`hpvc serve`): commands run in its forks, as their caller.

A private server on a socket of the test's own, over a private state
directory; every command goes in through the real client (`python -m hpvc`,
the console script's path) and the server's log says which ran there.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.bench.slurm.cluster import Submitter
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import cli_env, image_ready, leftovers, spec_file

HPVC = [sys.executable, "-m", "hpvc"]


class Server:
    def __init__(self, proc: subprocess.Popen[str], log: Path, env: dict[str, str]) -> None:
        self.proc, self.log, self.env = proc, log, env

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def served(self, what: str) -> list[str]:
        return [line for line in self.lines() if f": {what} ->" in line]

    def wait_for(self, what: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.served(what)
            if got:
                return got[-1]
            time.sleep(0.05)
        raise AssertionError(f"server never finished {what!r}: {self.lines()}")


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder every user can reach (pytest's tmp_path is under a 0700 one):
    the socket and the tenants' specs live here."""
    d = Path(tempfile.mkdtemp(prefix="hpvc-resident-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server(base: Path) -> Iterator[Server]:
    requires("root", "crun")
    state = base / "state"
    state.mkdir(mode=0o700)
    env = {**cli_env(Store(state)), "HPVC_RESIDENT_SOCKET": str(base / "hpvc.sock")}
    log = base / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*HPVC, "serve"], env=env, cwd=ROOT, stdout=out, stderr=out, text=True
        )
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield Server(proc, log, env)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert not (base / "hpvc.sock").exists()  # the server removes its socket


def hpvc(
    srv: Server, *args: str, user: Submitter | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    pre = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups"] if user else []
    return subprocess.run(
        [*pre, *HPVC, *args],
        env={**srv.env, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_commands_run_in_the_server_and_give_what_they_give_here(
    server: Server, tmp_path: Path
) -> None:
    image_ready()
    name = f"rs{os.getpid() % 10000}"
    spec = spec_file(tmp_path, name, computes=1)
    up = hpvc(server, "up", spec, "--quiet", "--json")
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["cluster"] == name
    st = hpvc(server, "status", name, "--json")
    assert st.returncode == 0, st.stderr
    assert {n["state"] for n in json.loads(st.stdout)["nodes"]} == {"running"}
    local = hpvc(server, "ls", "--json", HPVC_RESIDENT="0")
    remote = hpvc(server, "ls", "--json")
    assert remote.returncode == local.returncode == 0
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    missing = hpvc(server, "status", "nope")
    assert missing.returncode == 2
    assert missing.stderr.strip() == "hpvc: cluster 'nope': no such cluster (see hpvc ls)"
    down = hpvc(server, "down", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == []
    for what in (f"up {spec} --quiet --json", f"status {name} --json", "ls --json",
                 "status nope", f"down {name}"):  # fmt: skip
        assert server.served(what), (what, server.lines())
    assert " -> 2 in " in server.served("status nope")[0]
    # HPVC_RESIDENT=0 ran here: the server saw one `ls --json`, not two.
    assert len(server.served("ls --json")) == 1


def test_a_users_command_runs_as_that_user(
    server: Server, base: Path, tmp_path: Path, tenants: tuple[Submitter, Submitter]
) -> None:
    a, b = tenants
    mine = base / "mine.toml"
    mine.write_text(Path(spec_file(tmp_path, "rsu", computes=1)).read_text())
    os.chown(mine, a.uid, a.gid)
    mine.chmod(0o600)
    roots = base / "roots.toml"
    roots.write_text(mine.read_text())
    roots.chmod(0o600)
    ok = hpvc(server, "node", "check", str(mine), user=a)
    assert ok.returncode == 0, ok.stderr
    # The same server runs the other tenant's commands as that tenant: a's
    # 0600 spec is not b's to read.
    theirs = hpvc(server, "node", "check", str(mine), user=b)
    assert theirs.returncode == 2, theirs.stderr
    assert server.served(f"node check {mine}"), server.lines()
    assert f"uid {b.uid}: node check {mine} -> 2" in server.served(f"node check {mine}")[-1]
    refused = hpvc(server, "node", "check", str(roots), user=a)
    assert refused.returncode == 2, refused.stderr
    assert hpvc(server, "node", "check", str(roots)).returncode == 0  # root may read it
    # Root's state is root's: the same one-line refusal as without the server.
    ls = hpvc(server, "ls", user=a)
    assert ls.returncode == 2 and "permission denied" in ls.stderr
    assert f"uid {a.uid}: node check {mine} -> 0" in server.served(f"node check {mine}")[0]
    assert f"uid {a.uid}: node check {roots} -> 2" in server.served(f"node check {roots}")[0]


def test_signals_reach_the_command_and_a_vanished_client_takes_it_along(
    server: Server,
) -> None:
    store = Store(Path(server.env["HPVC_STATE_DIR"]))
    for sig, expect in ((signal.SIGTERM, 143), (signal.SIGKILL, None)):
        name = f"rw{sig}"
        with store.cluster_lock(name, "the test", lambda _: None):
            client = subprocess.Popen(
                [*HPVC, "down", name],
                env=server.env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(1.5)  # the command waits for the test's lock
            assert client.poll() is None
            assert not server.served(f"down {name}")
            client.send_signal(sig)
            _out, err = client.communicate(timeout=30)
            line = server.wait_for(f"down {name}")
        if expect is not None:
            assert client.returncode == expect, err
            assert line.split("-> ")[1].startswith(f"{expect} ")
        else:
            assert line.endswith("(the client went away)")


def test_files_a_command_makes_get_the_callers_umask(
    server: Server, base: Path, tmp_path: Path
) -> None:
    spec = spec_file(tmp_path, "rsm", computes=1)
    out = base / "rendered"
    r = subprocess.run(
        [*HPVC, "render", spec, "--out", str(out)],
        env=server.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        umask=0o077,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert server.served(f"render {spec} --out {out}")
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mode & 0o077 == 0 for p in files), files


# --- issue 25: hostile tenants against the server ------------------------------------------

FLOOD = """
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.send(b"x")  # one byte, then nothing
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()
"""


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            kids = [int(k) for k in task.read_text().split()]
            out += kids
            todo += kids
    return out


def test_one_tenants_flood_stops_neither_the_server_nor_another_tenant(
    server: Server, base: Path, tmp_path: Path, tenants: tuple[Submitter, Submitter]
) -> None:
    a, b = tenants
    spec = base / "b.toml"
    spec.write_text(Path(spec_file(tmp_path, "rsf", computes=1)).read_text())
    os.chown(spec, b.uid, b.gid)
    user = ["setpriv", f"--reuid={a.uid}", f"--regid={a.gid}", "--init-groups"]
    flood = subprocess.Popen(
        [*user, sys.executable, "-c", FLOOD, server.env["HPVC_RESIDENT_SOCKET"], "400"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "400"  # all connected: none waits in line
        root_fds = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
        assert root_fds < 32, root_fds  # root holds no client's socket
        ok = hpvc(server, "node", "check", str(spec), user=b)
        assert ok.returncode == 0, ok.stderr
        assert f"uid {b.uid}: node check {spec} -> 0" in server.wait_for(f"node check {spec}")
        # The flooder's own command still runs: in its own process.
        own = hpvc(server, "node", "check", str(spec), user=a)
        assert own.returncode == 0, own.stderr
        assert not [line for line in server.served(f"node check {spec}") if f"uid {a.uid}:" in line]
        assert any(f"uid {a.uid}: 16 connections open" in line for line in server.lines())
        assert server.proc.poll() is None
    finally:
        flood.kill()
        flood.wait()


def _lowest_free_fd(pid: int) -> int:
    used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    return next(n for n in range(len(used) + 1) if n not in used)


def test_out_of_descriptors_on_accept_is_survived(server: Server) -> None:
    pid = server.proc.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (_lowest_free_fd(pid), before[1]))
    try:
        client = subprocess.Popen(
            [*HPVC, "ls", "--json"], env=server.env, cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 20
        while not any("accept: Too many open files" in line for line in server.lines()):
            assert time.monotonic() < deadline, server.lines()
            time.sleep(0.05)
        time.sleep(0.5)  # a few more tries, each an EMFILE
        assert server.proc.poll() is None, server.lines()
        assert client.poll() is None  # it waits in line
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
    out, _ = client.communicate(timeout=60)
    assert client.returncode == 0
    json.loads(out)
    assert server.wait_for("ls --json")


@contextlib.contextmanager
def _cgroup(name: str) -> Iterator[list[Path]]:
    made = []
    try:
        for controller in ("memory", "pids"):
            d = Path("/sys/fs/cgroup", controller, name)
            d.mkdir()
            made.append(d)
        yield made
    finally:
        for d in reversed(made):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)  # ours: the test's client
            deadline = time.monotonic() + 10
            while True:
                try:
                    d.rmdir()
                    break
                except OSError:
                    assert time.monotonic() < deadline, d
                    time.sleep(0.05)


def test_a_command_runs_under_its_callers_limits_cgroups_and_groups(
    server: Server, base: Path, tenants: tuple[Submitter, Submitter]
) -> None:
    a, _b = tenants
    assert Path("/sys/fs/cgroup/memory/cgroup.procs").exists(), "needs cgroup v1 (HOST-NOTES)"
    fifo = base / "spec.fifo"
    os.mkfifo(fifo)
    os.chown(fifo, a.uid, a.gid)
    groups = [a.gid, *range(50000, 50300)]  # more than SO_PEERGROUPS's 256
    ulimits = "prlimit --as=3000000000 --nofile=77 --stack=4194304:8388608"
    with _cgroup(f"hpvc-test-resident-{os.getpid()}") as where:
        joined = " && ".join(f"echo $$ > {d}/cgroup.procs" for d in where)
        as_a = f"setpriv --reuid={a.uid} --regid={a.gid} --groups={','.join(map(str, groups))}"
        run = f"{ulimits} {as_a} {' '.join(HPVC)} node check {fifo}"
        client = subprocess.Popen(
            ["sh", "-c", f"{joined} && exec {run}"],
            env=server.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while len(_descendants(server.proc.pid)) < 2:  # the relay and the command
                assert client.poll() is None, client.communicate()
                assert time.monotonic() < deadline, server.lines()
                time.sleep(0.05)
            time.sleep(0.3)  # the command reaches the FIFO
            theirs = Path(f"/proc/{client.pid}")
            for pid in _descendants(server.proc.pid):
                ours = Path(f"/proc/{pid}")
                assert (ours / "limits").read_text() == (theirs / "limits").read_text()
                assert (ours / "cgroup").read_text() == (theirs / "cgroup").read_text()
                status = (ours / "status").read_text()
                got = next(ln for ln in status.splitlines() if ln.startswith("Groups:"))
                assert sorted(map(int, got.split()[1:])) == sorted(groups)
                assert f"Uid:\t{a.uid}\t{a.uid}\t{a.uid}" in status
        finally:
            with contextlib.suppress(OSError):
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.write(fd, b"not toml [")
                os.close(fd)
            client.communicate(timeout=60)
    assert client.returncode == 2
    assert server.wait_for(f"node check {fifo}")


def test_descriptors_sent_and_a_killed_relay_leave_the_server_answering(
    server: Server, base: Path, tenants: tuple[Submitter, Submitter]
) -> None:
    a, _b = tenants
    sent = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
socket.send_fds(s, [b"\\0"], [0, 1, 2, 0, 1, 2, 0, 1])
print("sent", flush=True)
sys.stdin.read()
"""
    user = ["setpriv", f"--reuid={a.uid}", f"--regid={a.gid}", "--init-groups"]
    client = subprocess.Popen(
        [*user, sys.executable, "-c", sent, server.env["HPVC_RESIDENT_SOCKET"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "sent"
        deadline = time.monotonic() + 10
        while not (relays := _descendants(server.proc.pid)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for pid in relays:  # the server's own forks, started by this test's server
            mine = f"Uid:\t{a.uid}\t{a.uid}\t{a.uid}"
            while mine not in Path(f"/proc/{pid}/status").read_text():
                assert time.monotonic() < deadline, "the fork never became the caller"
                time.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
        assert not [int(fd) for fd in os.listdir(f"/proc/{server.proc.pid}/fd") if int(fd) > 64]
    finally:
        client.kill()
        client.wait()
    assert server.proc.poll() is None
    r = hpvc(server, "ls", "--json")
    assert r.returncode == 0, r.stderr
    assert server.served("ls --json")


def test_a_newline_in_argv_does_not_forge_a_log_line(server: Server) -> None:
    forged = "x\nhpvc serve: pid 1 uid 0: down everything -> 0 in 0.001 s"
    r = hpvc(server, "status", forged)
    assert r.returncode == 2, r.stderr
    line = server.wait_for(f"status {json.dumps(forged)}")
    assert "uid 0:" in line
    assert [ln for ln in server.lines() if "down everything" in ln] == [line]
    assert not [ln for ln in server.lines() if ln.startswith("hpvc serve: pid 1 ")]

"""The resident hpvc (`hpvc serve`): commands run in its forks, as their caller.

A private server on a socket of the test's own, over a private state
directory; every command goes in through the real client (`python -m hpvc`,
the console script's path) and the server's log says which ran there.
"""

from __future__ import annotations

import json
import os
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

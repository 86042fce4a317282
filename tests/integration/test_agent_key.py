"""The guest agent's second fence, without a VM: native/agent's server runs on
the host in a network namespace this test makes (loopback only), with a key
file, and clients connect with the key, a wrong key, none, and from an
unprivileged port (issue 25, item 8; docs/slurm.md, "Who may use a guest's agent")."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.agent_driver import build
from tests.helpers import requires

IP = "10.231.77.1"


def _scenario(tmp: Path, drv: Path, server_key: str) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each client's result, all against one agent in a fresh network namespace."""
    script = f"""
set -u
ip link set lo up && ip addr add {IP}/24 dev lo || exit 90
{drv} serve {IP}/24 {server_key} > {tmp}/serve.out &
srv=$!
for i in $(seq 100); do grep -q ready {tmp}/serve.out 2>/dev/null && break; sleep 0.05; done
sleep 0.1
run() {{ name=$1; shift; "$@" > {tmp}/$name.out 2> {tmp}/$name.err; echo $? > {tmp}/$name.rc; }}
run good {drv} run {IP} {tmp}/key echo hello
run wrong {drv} run {IP} {tmp}/other echo hello
run none {drv} nologin {IP} echo hello
run high {drv} high {IP} {tmp}/key echo hello
AGENT_CWD=/nonexistent AGENT_FALLBACK={tmp} run fallback {drv} run {IP} {tmp}/key pwd
AGENT_CWD={tmp} AGENT_FALLBACK=/ run first {drv} run {IP} {tmp}/key pwd
AGENT_CWD=/nonexistent AGENT_FALLBACK=/nonexistent2 run neither {drv} run {IP} {tmp}/key pwd
kill $(cut -d' ' -f2 {tmp}/serve.out) $srv; wait
"""
    subprocess.run(["unshare", "--net", "--fork", "--kill-child", "sh", "-c", script],
                   check=True, timeout=60)  # fmt: skip
    out = {}
    for name in ("good", "wrong", "none", "high", "fallback", "first", "neither"):
        rc = int((tmp / f"{name}.rc").read_text())
        out[name] = subprocess.CompletedProcess(
            [name], rc, (tmp / f"{name}.out").read_text(), (tmp / f"{name}.err").read_text()
        )
    return out


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    requires("root")
    return build(tmp_path_factory.mktemp("agent-build"))


def _keys(tmp: Path) -> None:
    for name in ("key", "other"):
        fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32))
        os.close(fd)


def test_only_a_client_holding_the_key_runs_commands(driver: Path, tmp_path: Path) -> None:
    _keys(tmp_path)
    r = _scenario(tmp_path, driver, str(tmp_path / "key"))
    assert (r["good"].returncode, r["good"].stdout) == (0, "hello\n"), r["good"]
    # Root's reserved port, but a wrong key: refused, nothing ran.
    assert r["wrong"].returncode == 255 and r["wrong"].stdout == ""
    assert "refused: the client does not hold the job's agent key" in r["wrong"].stderr
    # Root's reserved port, no answer to the challenge (the command at once).
    assert r["none"].returncode == 255 and r["none"].stdout == ""
    assert "refused: the client does not hold the job's agent key" in r["none"].stderr
    # The right key from an unprivileged port: the first fence still holds.
    assert r["high"].returncode == 255 and r["high"].stdout == ""
    assert "refused: only root on the job's hosts and nodes may connect" in r["high"].stderr
    # The directory asked for, else the second one (an image's WorkingDir), else /root.
    assert (r["fallback"].returncode, r["fallback"].stdout) == (0, f"{tmp_path}\n"), r["fallback"]
    assert (r["first"].returncode, r["first"].stdout) == (0, f"{tmp_path}\n"), r["first"]
    assert (r["neither"].returncode, r["neither"].stdout) == (0, "/root\n"), r["neither"]


def test_an_agent_without_a_key_refuses_everyone(driver: Path, tmp_path: Path) -> None:
    _keys(tmp_path)
    r = _scenario(tmp_path, driver, "-")
    for name in ("good", "wrong", "none"):
        assert r[name].returncode == 255 and r[name].stdout == "", r[name]
        assert "refused: this node has no agent key" in r[name].stderr, r[name]

"""hpvc-nodeinit (native/nodeinit), the init of container nodes sharing a PID
namespace and the client that starts a command under it, run as it runs in a
node: ``serve`` in a network namespace of its own (its socket is the
namespace's), ``run`` beside it, as crun exec would start it."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.crun import nodeinit
from tests.helpers import requires


@pytest.fixture
def netns() -> Iterator[list[str]]:
    """An init serving in a new network namespace; the argv prefix that
    enters that namespace (nsenter) to run the client there."""
    requires("root")  # unshare, nsenter, setpriv: util-linux, always there
    init = subprocess.Popen(
        ["unshare", "--net", "--", str(nodeinit.binary()), "serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 5
    while not Path(f"/proc/{init.pid}/ns/net").exists() or os.readlink(
        f"/proc/{init.pid}/ns/net"
    ) == os.readlink("/proc/self/ns/net"):
        assert time.monotonic() < deadline, "unshare did not start the init"
        time.sleep(0.01)
    time.sleep(0.2)  # listening
    enter = ["nsenter", f"--net=/proc/{init.pid}/ns/net", "--", str(nodeinit.binary()), "run", "--"]
    try:
        yield enter
    finally:
        init.send_signal(signal.SIGTERM)
        assert init.wait(timeout=5) == 0  # SIGTERM: exits 0, as the sh init did


def _run(enter: list[str], argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*enter, *argv], capture_output=True, text=True, timeout=20, **kw)  # type: ignore[call-overload, no-any-return]


def test_the_command_gets_stdio_environment_directory_and_its_exit_status(
    netns: list[str], tmp_path: Path
) -> None:
    mask = os.umask(0)
    os.umask(mask)
    done = _run(
        netns,
        ["sh", "-c", 'read x; echo "out $x $HPVC_T $(pwd) $(umask)"; echo err >&2; exit 3'],
        input="in\n",
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HPVC_T": "v"},
    )
    assert done.returncode == 3
    assert done.stdout == f"out in v {tmp_path} {mask:04o}\n"
    assert done.stderr == "err\n"


def test_missing_unexecutable_and_killed_commands_exit_as_a_shell_says(
    netns: list[str], tmp_path: Path
) -> None:
    assert _run(netns, ["no-such-command-here"]).returncode == 127
    plain = tmp_path / "plain"
    plain.write_text("x")
    plain.chmod(0o644)
    assert _run(netns, [str(plain)]).returncode == 126
    assert _run(netns, ["sh", "-c", "kill -9 $$"]).returncode == 128 + 9


def test_background_work_stays_below_the_init(netns: list[str]) -> None:
    done = _run(netns, ["sh", "-c", "setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $!"])
    job = int(done.stdout)
    try:
        ppid = int(Path(f"/proc/{job}/stat").read_text().rsplit(")", 1)[1].split()[1])
        init = int(netns[1].split("/")[2])  # unshare (no --fork) execs the init itself
        assert ppid == init  # not the PID namespace's init: the node's, a subreaper
        assert Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")[1] == b"serve"
    finally:
        os.kill(job, signal.SIGKILL)


def test_signals_are_passed_on_and_a_lost_client_takes_its_command(netns: list[str]) -> None:
    client = subprocess.Popen([*netns, "sleep", "31"])
    time.sleep(0.5)
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=10) == 128 + signal.SIGTERM
    client = subprocess.Popen([*netns, "sh", "-c", "sleep 32; :"])
    time.sleep(0.5)
    client.kill()
    client.wait()
    deadline = time.monotonic() + 5
    while any(b"sleep\x0032" in p.read_bytes() for p in Path("/proc").glob("[0-9]*/cmdline")):
        assert time.monotonic() < deadline, "the command outlived its client"
        time.sleep(0.1)


def test_the_caller_s_user_and_no_more_than_its_capabilities(netns: list[str]) -> None:
    # Into the node's namespace first, then as nobody: as a user in a node would.
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    done = subprocess.run(
        [*netns[:3], *nobody, *netns[3:], "id", "-u"], capture_output=True, text=True, timeout=20
    )
    assert (done.returncode, done.stdout.strip()) == (0, "65534"), done.stderr
    for group in ([], ["--regid=65534", "--keep-groups"]):  # root, in its group or another
        fewer = [*netns[:3], "setpriv", *group, "--bounding-set=-sys_admin", "--", *netns[3:]]
        done = subprocess.run([*fewer, "id"], capture_output=True, text=True, timeout=20)
        assert done.returncode == 126 and "lacks capabilities" in done.stderr, done.stderr


def test_a_terminal_is_handed_to_the_command(netns: list[str]) -> None:
    """As under crun exec --tty: the client owns a terminal; the command takes
    it as its controlling terminal, so the terminal's Ctrl-C reaches it."""
    script = 'read -r _ _ _ _ _ _ t _ </proc/$$/stat; echo "ctty=$t"; exec sleep 33'
    pid, master = pty.fork()
    if pid == 0:  # the child: a session leader on the pty's slave, as crun makes it
        os.execvp(netns[0], [*netns, "sh", "-c", script])
    out = b""
    deadline = time.monotonic() + 10
    while not re.search(rb"ctty=-?\d+\s", out):
        assert time.monotonic() < deadline, out
        out += os.read(master, 1024)
    assert b"ctty=0" not in out, out  # a controlling terminal
    time.sleep(0.3)
    os.write(master, b"\x03")  # Ctrl-C, through the line discipline
    _, status = os.waitpid(pid, 0)
    os.close(master)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGINT

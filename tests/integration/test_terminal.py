"""Real terminals into standalone clusters' nodes (issue 30 item 4): ``hpvc exec
-it`` and ``hpvc console`` into a container node (crun exec --tty) and into VM
guests under TCG, both ways hpvc reaches a guest (ssh -t where the image has
sshd; the guest's agent with a pty, hpvc-rsh -t, where it has none), and the
agent's terminal itself on the host without a VM.

Each test drives the command from a real pty (tests/terminal.py) and checks
what makes the terminal real: ``tty`` names a /dev/pts device in the node,
``stty size`` follows a resize of the outer terminal, Ctrl-C and Ctrl-Z reach
the node's foreground job with the shell still alive and its job control
knowing the stopped job, and ``exit 7`` comes back as hpvc's exit status.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.vm import guest
from hpvc.cluster import lifecycle
from hpvc.store import Store
from tests.agent_driver import AGENT, build
from tests.helpers import requires
from tests.integration.test_cluster import clean_up, cli_env, image_ready, spec_file
from tests.integration.test_vm_cluster import vm_leftovers
from tests.terminal import PROMPT, Terminal, scenario

pytestmark = pytest.mark.integration

STEP_S = 20  # one step of the scenario in a container node
VM_STEP_S = 90  # and in a guest under TCG


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    requires("root", "crun", "ip", "qemu")
    s = Store(tmp_path / "state")
    yield s
    clean_up(s, lambda name: vm_leftovers(name, s))


def hpvc_term(store: Store, *args: str) -> Terminal:
    """``python -m hpvc ARGS`` on a fresh terminal."""
    env = {**cli_env(store), "TERM": "xterm"}
    return Terminal([sys.executable, "-m", "hpvc", *args], env=env)


def exec_it_and_console(store: Store, name: str, node: str, step_s: float) -> None:
    """The scenario through ``hpvc exec -it``, then ``hpvc console``: a login
    shell (bash's login_shell set) in root's home, exit status back."""
    term = hpvc_term(store, "exec", "-it", name, node, "--", "bash")
    try:
        assert scenario(term, step_s) == 7
    finally:
        term.close()
    term = hpvc_term(store, "console", name, node)
    try:
        term.line("PS1='P''2> '; PROMPT_COMMAND=")
        term.expect(PROMPT, step_s)
        term.line("shopt -q login_shell && echo login-$((40+2)) $PWD; tty")
        term.expect(r"login-42 /root\r\n/dev/pts/\d+\r\n", step_s)
        term.line("exit 3")
        assert term.wait(step_s) == 3
    finally:
        term.close()


def test_exec_t_needs_a_terminal(store: Store, tmp_path: Path) -> None:
    """Bad input: -t with stdin no terminal is one line and exit code 2 (before
    the cluster is even looked up)."""
    r = subprocess.run(
        [sys.executable, "-m", "hpvc", "exec", "-t", "nosuch", "compute0", "--", "true"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=cli_env(store),
        timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "stdin is not a terminal" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_container_exec_it_and_console(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"tt{os.getpid() % 10000}"
    lifecycle.up(spec_file(tmp_path, name, computes=1), store)
    exec_it_and_console(store, name, "compute0", STEP_S)
    lifecycle.down(name, store)


def vm_spec(tmp_path: Path, name: str) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "vm"\nimage = "hpc"\n'
        f'[network]\nsubnet = "10.219.{os.getpid() % 250}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "compute"\ncount = 1\nvcpus = 1\nmemory = "384MiB"\n'
    )
    return str(p)


def test_vm_exec_it_and_console_over_ssh(store: Store, tmp_path: Path) -> None:
    """The hpc image has sshd: hpvc exec -t is ssh -t into the guest."""
    image_ready()
    name = f"ts{os.getpid() % 10000}"
    lifecycle.up(vm_spec(tmp_path, name), store)
    exec_it_and_console(store, name, "compute0", VM_STEP_S)
    lifecycle.down(name, store)


def test_vm_exec_it_and_console_through_the_agent(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image without sshd is reached through the guest's agent (hpvc-rsh
    -t, a pty in the guest; native/agent/pty.c). The hpc image is told to have
    no sshd at up, so that the cluster's record says "through the agent"; the
    guest, its agent and hpvc-rsh are the real ones."""
    image_ready()
    monkeypatch.setattr(guest, "has_sshd", lambda image: False)
    name = f"ta{os.getpid() % 10000}"
    lifecycle.up(vm_spec(tmp_path, name), store)
    monkeypatch.undo()
    exec_it_and_console(store, name, "compute0", VM_STEP_S)
    lifecycle.down(name, store)


def test_agent_terminal_without_vm(tmp_path: Path) -> None:
    """native/agent's server on the host, in a network namespace of this test
    (loopback only), and hpvc-rsh -t into it from a real terminal."""
    requires("root")
    drv = build(tmp_path)
    subprocess.run(
        ["make", "-s", "-C", str(AGENT), f"OUT={tmp_path}", f"BIN={tmp_path}",
         f"{tmp_path}/hpvc-rsh"],
        check=True,
    )  # fmt: skip
    key = tmp_path / "key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    ip = "10.231.79.1"
    script = f"""
set -u
ip link set lo up && ip addr add {ip}/24 dev lo || exit 90
{drv} serve {ip}/24 {key} > {tmp_path}/serve.out &
srv=$!
for i in $(seq 100); do grep -q ready {tmp_path}/serve.out 2>/dev/null && break; sleep 0.05; done
{sys.executable} -c 'import sys; sys.path.insert(0, sys.argv[1]); from tests.terminal import *
t = Terminal(sys.argv[2:], env={{"TERM": "xterm", "PATH": "/usr/bin:/bin"}})
try:
    print("rc", scenario(t, 20))
finally:
    t.close()' {AGENT.parent.parent} {tmp_path}/hpvc-rsh -a -t -k {key} {ip} bash
rc=$?
kill $(cut -d' ' -f2 {tmp_path}/serve.out)  # the listener (ours); the driver then exits
wait $srv
exit $rc
"""
    r = subprocess.run(["unshare", "--net", "--fork", "--kill-child", "sh", "-c", script],
                       capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "rc 7", r.stdout + r.stderr

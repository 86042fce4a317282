"""Slurm's own launch all the way inside container nodes, for real (issue 30
items 1 and 3): ``srun --mpi=pmix`` tasks in their node's network namespace,
with the step's PMIx server (on the host's loopback) reached through the
plugin's forwarder in each node (native/spank/pmixfwd.c); Open MPI across two
hosts under PMIx and MPICH under PMI-2; and ``srun --pty`` (also inside a
``salloc``) giving a real terminal of the node's own (native/spank/ptyrelay.c),
driven through a pty of the test's own (``Pty``) as a person at a terminal
would.

Every job is an ordinary user's (tests/tenants.py) on a private Slurm test
cluster whose site allows the ``hpc`` and ``mpich`` images.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.bench.slurm.cluster import Submitter
from hpvc.plan.network import vxlan_link_name
from tests.helpers import build_pingpong, requires
from tests.integration.conftest import slurm_env
from tests.integration.slurm_env import Env, last_job, spec_text
from tests.integration.test_run_mpi import mpich_ready


@pytest.fixture(scope="module")
def slurm(tenants: tuple[Submitter, Submitter]) -> Iterator[Env]:
    yield from slurm_env(tenants, site="images=hpc,mpich")


def _by_task(out: str) -> dict[int, list[str]]:
    """``srun -l`` output, its lines per task."""
    tasks: dict[int, list[str]] = {}
    for line in out.splitlines():
        label, sep, rest = line.partition(": ")
        if sep and label.strip().isdigit():
            tasks.setdefault(int(label), []).append(rest)
    return tasks


def _forwarders_orphaned() -> list[str]:
    """Any PMIx forwarder (ours: comm hpvc-pmixfwd) whose parent is not a
    slurmstepd: one that outlived its step. Read from /proc, nothing signalled."""
    bad = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() != "hpvc-pmixfwd":
                continue
            state, ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            parent = Path(f"/proc/{ppid}/comm").read_text().strip()
        except (OSError, IndexError):
            continue
        if parent != "slurmstepd" and state != "Z":  # a zombie is ended, only not reaped
            bad.append(f"{d.name} (parent {ppid} {parent})")
    return bad


def test_pmix_tasks_are_in_their_nodes_network(slurm: Env, spec: Path) -> None:
    """Each --mpi=pmix task sees its node's interfaces (lo and eth0 with the
    node's cluster address), not its host's (fabric address, the job's
    bridge); the PMIx server it is told of, 127.0.0.1:<port>, answers inside
    the node; no hpvc steering of MPI's TCP is left in its environment."""
    script = (
        'echo "node $HPVC_NODE"; ip -4 -o addr show | while read -r _ dev _ addr _; do '
        'echo "addr $dev $addr"; done; echo "hosts $(getent hosts "$(hostname)")"; '
        'echo "uri $PMIX_SERVER_URI41"; echo "steer ${OMPI_MCA_btl_tcp_if_include:-none}"; '
        "port=${PMIX_SERVER_URI41##*:}; "
        "if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then echo reach yes; "
        "else echo reach no; fi"
    )
    r = slurm.run("srun", "-l", "-N2", "-n2", "--mpi=pmix", f"--hpvc={spec}", "bash", "-c", script)
    assert r.returncode == 0, r.stderr
    tasks = _by_task(r.stdout)
    assert sorted(tasks) == [0, 1], r.stdout
    pool = ipaddress.IPv4Network("10.88.0.0/16")  # the site's subnets= (conftest)
    nodes = set()
    for t, lines in tasks.items():
        info = dict(line.split(" ", 1) for line in lines if " " in line)
        nodes.add(info["node"])
        addrs = [line.split()[1:] for line in lines if line.startswith("addr ")]
        assert [dev for dev, _ in addrs] == ["lo", "eth0"], (t, lines)
        eth0 = ipaddress.IPv4Interface(addrs[1][1])
        assert eth0.ip in pool, (t, lines)  # a job network's address, not the fabric's
        assert info["hosts"].split()[0] == str(eth0.ip), (t, lines)  # the node's own name
        assert re.fullmatch(r"pmix-server\.\d+;tcp4://127\.0\.0\.1:\d+", info["uri"]), lines
        assert info["reach"] == "yes", (t, lines)
        assert info["steer"] == "none", (t, lines)
    assert nodes == {"compute0", "compute1"}, r.stdout
    slurm.wait_clean(last_job(slurm))
    assert _forwarders_orphaned() == []


def test_open_mpi_under_pmix_across_two_hosts(slurm: Env, spec: Path) -> None:
    """The image's Open MPI, launched by Slurm with --mpi=pmix: a ping-pong
    between compute0 (first host) and compute1 (second host), in the nodes'
    network, its data over the job's VXLAN between the hosts."""
    out = slurm.work / "bin"
    out.mkdir(exist_ok=True)
    pingpong = build_pingpong(out)
    size, reps = 65536, 20
    r = slurm.run(
        "sbatch", "--parsable", "-N2", f"--hpvc={spec}", "-o", str(slurm.work / "pmix-pp.out"),
        "--wrap",
        f"srun -N2 -n2 --mpi=pmix {pingpong} {size} {reps} && touch {slurm.work / 'pp.ok'};"
        f" touch {slurm.work / 'pp.done'}; sleep 300",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        deadline = time.monotonic() + 120
        while not (slurm.work / "pp.done").exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        text = (slurm.work / "pmix-pp.out").read_text()
        assert (slurm.work / "pp.ok").exists(), text
        rows = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
        assert rows and rows[-1]["bytes"] == size, text
        assert {x["rank0"] for x in rows} == {"compute0"}, text
        first = {names[0]: h for h, names in slurm.shares(job).items() if names}[f"j{job}-0"]
        vx = vxlan_link_name(f"j{job}-0")
        stats = json.loads(slurm.on(first, f"ip -s -j link show {vx}"))[0]["stats64"]
        sent = sum(x["bytes"] * x["iterations"] for x in rows)
        assert stats["tx"]["bytes"] >= sent, (stats, sent)
        assert stats["rx"]["bytes"] >= sent, (stats, sent)
    finally:
        for name in ("pp.ok", "pp.done"):
            (slurm.work / name).unlink(missing_ok=True)
        cancel = slurm.run("scancel", str(job))
        assert cancel.returncode == 0, cancel.stderr
    slurm.wait_clean(job)
    assert _forwarders_orphaned() == []


def test_mpich_under_pmi2_across_two_hosts(slurm: Env) -> None:
    """Debian's MPICH (4.0, built --with-slurm, PMI-2, no PMIx) in the mpich
    image: srun --mpi=pmi2 runs a ping-pong across two hosts in the nodes."""
    requires("mpicc.mpich")
    mpich_ready()
    spec = slurm.work / "mpich.toml"
    spec.write_text(
        spec_text(f"10.88.{100 + (os.getpid() + 1) % 100}.0/24").replace(
            'image = "hpc"', 'image = "mpich"'
        )
    )
    out = slurm.work / "bin"
    out.mkdir(exist_ok=True)
    src = Path(__file__).resolve().parents[2] / "native" / "bench" / "pingpong.c"
    binary = out / "pingpong-mpich"
    b = subprocess.run(
        ["mpicc.mpich", "-O2", "-o", str(binary), str(src)], capture_output=True, text=True
    )
    assert b.returncode == 0, b.stderr
    os.chmod(binary, 0o755)
    r = slurm.run(
        "srun", "-N2", "-n2", "--mpi=pmi2", f"--hpvc={spec}", str(binary), "4096", "10", timeout=180
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert rows and rows[-1]["bytes"] == 4096, r.stdout
    assert {x["rank0"] for x in rows} == {"compute0"}, r.stdout
    slurm.wait_clean(last_job(slurm))


class Pty:
    """``argv`` as the session leader of a new pty (its controlling terminal),
    as a terminal emulator starts a shell; ``type``/``wait_for`` on the master."""

    def __init__(self, argv: list[str], slurm: Env) -> None:
        self.master, slave = pty.openpty()
        self.resize(24, 80)
        self.out = b""
        self.seen = 0
        user = slurm.user
        try:
            self.proc = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, cwd=slurm.work,
                env=slurm.cluster.user_env(user), user=user.uid, group=user.gid,
                extra_groups=[], start_new_session=True,
                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
            )  # fmt: skip
        finally:
            os.close(slave)

    def resize(self, rows: int, cols: int) -> None:
        """As a terminal emulator's window: the kernel sends srun SIGWINCH."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def _read(self, timeout: float) -> bool:
        if not select.select([self.master], [], [], timeout)[0]:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: srun and everything on the slave are gone
            return False
        self.out += chunk
        return bool(chunk)

    def wait_for(self, pattern: str, timeout: float = 60) -> bytes:
        rx = re.compile(pattern.encode())
        deadline = time.monotonic() + timeout
        while not (m := rx.search(self.out, self.seen)):
            alive = self._read(min(0.5, max(0.0, deadline - time.monotonic())))
            if time.monotonic() > deadline or not alive:
                if m := rx.search(self.out, self.seen):
                    break
                screen = self.out[-1500:].decode(errors="replace")
                raise AssertionError(f"no {pattern!r} within {timeout} s; screen:\n{screen}")
        self.seen = m.end()
        return m.group(0)

    def status(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        return self.proc.wait(timeout=1)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)  # srun or salloc: ours, by PID
            self.proc.wait(timeout=30)
        os.close(self.master)


PROMPT = r"pmix-t> "


@pytest.mark.parametrize("how", ["srun", "salloc"])
def test_srun_pty_is_a_real_terminal_in_the_node(slurm: Env, spec: Path, how: str) -> None:
    """`srun --pty bash` (and `salloc` then `srun --pty bash`) through a real
    pty: `tty` names a pty of the node's, `stty size` follows a resize,
    Ctrl-C interrupts the foreground job, Ctrl-Z stops it and `jobs` says so,
    and `exit 7` is srun's exit status."""
    srun = ["srun", "--pty", "-N1", "-n1"]
    shell = ["bash", "--norc", "--noprofile", "-i"]
    argv = (
        [*srun, f"--hpvc={spec}", *shell]
        if how == "srun"
        else ["salloc", "-N1", f"--hpvc={spec}", *srun, *shell]
    )
    term = Pty(argv, slurm)
    try:
        # Spelled so that the echo of the typed line cannot match the prompt.
        term.type("PS1='pmix''-t> '; PROMPT_COMMAND=\r")
        term.wait_for(PROMPT)
        term.type("tty; echo node=$(hostname)\r")
        assert re.match(rb"/dev/pts/\d+\r\n", term.wait_for(r"[^\n]*\r\nnode=\w+"))
        term.wait_for(PROMPT)
        term.type("stty size\r")
        term.wait_for(r"\n24 80\r\n")
        term.resize(33, 101)
        term.wait_for(PROMPT)
        deadline = time.monotonic() + 30
        while True:  # srun passes the resize on asynchronously
            term.type("stty size\r")
            size = term.wait_for(r"\n\d+ \d+\r\n")
            term.wait_for(PROMPT)
            if b"33 101" in size:
                break
            assert time.monotonic() < deadline, f"stty size stayed {size!r} after a resize"
            time.sleep(0.5)
        term.type("sleep 1000; echo after-''sleep\r")
        time.sleep(1.5)
        term.type("\x03")  # Ctrl-C: the whole line interrupted, the shell stays
        term.wait_for(PROMPT, 20)
        term.type("echo alive$((6*7))\r")
        term.wait_for("alive42")
        term.wait_for(PROMPT)
        assert b"after-sleep" not in term.out
        term.type("sleep 1001\r")
        time.sleep(1.5)
        term.type("\x1a")  # Ctrl-Z
        term.wait_for(r"Stopped", 20)
        term.wait_for(PROMPT)
        term.type("jobs\r")
        term.wait_for(r"\[1\]\+\s+Stopped\s+sleep 1001")
        term.wait_for(PROMPT)
        term.type("kill -9 %1\r")
        term.wait_for(PROMPT)
        term.type("exit 7\r")
        try:  # bash warns once if the killed job is still listed; then exits
            term.wait_for("There are stopped jobs", 3)
            term.type("exit 7\r")
        except AssertionError:
            pass
        status = term.status()
    finally:
        term.close()
        if term.proc.returncode != 7:  # a job a killed salloc or srun left
            slurm.run("scancel", f"--user={slurm.user.name}")
            slurm.wait_clean(last_job(slurm))
    assert status == 7, term.out[-1500:].decode(errors="replace")
    assert b"not a tty" not in term.out
    slurm.wait_clean(last_job(slurm))

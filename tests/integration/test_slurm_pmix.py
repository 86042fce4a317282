"""Slurm's own launch all the way inside container nodes, for real (issue 30
items 1 and 3): ``srun --mpi=pmix`` tasks in their node's network namespace,
with the step's PMIx server (on the host's loopback) reached through the
plugin's forwarder in each node (native/spank/pmixfwd.c); Open MPI across two
hosts under PMIx and MPICH under PMI-2; and ``srun --pty`` (also inside a
``salloc``) giving a real terminal of the node's own (native/spank/ptyrelay.c),
driven through a real pty (tests/terminal.py) as a person at a terminal
would.

Every job is an ordinary user's (tests/tenants.py) on a private Slurm test
cluster whose site allows the ``hpc`` and ``mpich`` images.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
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
from tests.terminal import Terminal, scenario


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


@pytest.mark.parametrize("how", ["srun", "salloc"])
def test_srun_pty_is_a_real_terminal_in_the_node(slurm: Env, spec: Path, how: str) -> None:
    """`srun --pty bash` (and `salloc` then `srun --pty bash`) through a real
    pty (tests/terminal.py): `tty` names a pty of the node's and the shell is
    compute0's, `stty size` follows a resize, Ctrl-C interrupts the
    foreground job, Ctrl-Z stops it and `jobs` says so, and `exit 7` is
    srun's exit status."""
    srun = ["srun", "--pty", "-N1", "-n1"]
    shell = ["bash", "--norc", "--noprofile", "-i"]
    argv = (
        [*srun, f"--hpvc={spec}", *shell]
        if how == "srun"
        else ["salloc", "-N1", f"--hpvc={spec}", *srun, *shell]
    )
    user = slurm.user
    term = Terminal(
        argv, env=slurm.cluster.user_env(user), cwd=slurm.work, uid=user.uid, gid=user.gid
    )
    status = None
    try:
        status = scenario(term, 60, host="compute0")
    finally:
        term.close()
        if status != 7:  # a job a killed salloc or srun left
            slurm.run("scancel", f"--user={user.name}")
            slurm.wait_clean(last_job(slurm))
    assert status == 7, term.out[-1500:].decode(errors="replace")
    assert b"not a tty" not in term.out
    slurm.wait_clean(last_job(slurm))

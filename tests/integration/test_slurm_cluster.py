"""The local Slurm test cluster (scripts/slurm/up.sh, down.sh) for real.

Starts it in a temporary state directory on a fabric of its own, with one
CPU of its own per host (HPVC_SLURM_CPUS_PER_HOST=1, so the cpusets are used
even on a 2-CPU machine), runs srun across its three hosts, checks that the
hosts are apart (hostname, network, mount namespace, CPUs), runs MPI between
two hosts, an sbatch job and a cancelled one, then stops it and checks it
left nothing behind: no munged, slurmctld, slurmd or slurmstepd of its own,
no network namespace, bridge, veth or cpuset, no directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.bench.slurm.cluster import Submitter
from tests.helpers import ROOT, build_pingpong, requires

UP = os.path.join(ROOT, "scripts", "slurm", "up.sh")
DOWN = os.path.join(ROOT, "scripts", "slurm", "down.sh")
ON = os.path.join(ROOT, "scripts", "slurm", "on.sh")
BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scancel")
NODES = ("n1", "n2", "n3")
CPUSET = Path("/sys/fs/cgroup/cpuset")


def requires_slurm() -> None:
    """Skip (or, under HPVC_REQUIRE_ALL=1, fail) without Slurm and munge."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if not missing:
        return
    reason = f"{', '.join(missing)} not installed (make setup)"
    if os.environ.get("HPVC_REQUIRE_ALL") == "1":
        pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {reason}")
    pytest.skip(reason)


def leftovers(state: str) -> list[str]:
    """Processes of the cluster in `state`: by command line, or (slurmstepd) by
    a file under it held open."""
    found: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fds = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue
        if state + "/" in cmd or any(fd.startswith(state + "/") for fd in fds):
            found.append(f"{proc.name}: {cmd.strip()}")
    return found


def fabric_leftovers(bridge: str) -> list[str]:
    """The fabric `bridge` names: the bridge, its veths and namespaces, its cpusets."""
    found: list[str] = []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    names = re.findall(r"^\d+: ([^:@]+)", links.stdout, re.M)
    found += [f"link {n}" for n in names if n == bridge or n.startswith(f"{bridge}-")]
    netns = Path("/run/netns")
    if netns.is_dir():
        found += [f"netns {p.name}" for p in netns.iterdir() if p.name.startswith(f"{bridge}-")]
    if (CPUSET / bridge).exists():
        found.append(f"cpuset {CPUSET / bridge}")
    return found


@dataclass
class Cluster:
    tmp: str
    env: dict[str, str]
    bridge: str
    subnet: str
    up_out: str
    user: Submitter  # who submits: an ordinary user, never root
    home: str  # the user's directory (on the "shared file system", tmp)

    def on(self, host: str, *argv: str) -> str:
        """Run ``argv`` on ``host`` (its namespaces, scripts/slurm/on.sh)."""
        return slurm(self.env, "bash", ON, host, *argv)

    def submit(self, *argv: str) -> str:
        """srun, sbatch, squeue ... as the user, from their directory."""
        r = subprocess.run(
            argv, env={"PATH": "/usr/bin:/bin", "SLURM_CONF": self.env["SLURM_CONF"]},
            cwd=self.home, user=self.user.uid, group=self.user.gid, extra_groups=[],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert r.returncode == 0, f"{' '.join(argv)} as {self.user.name} failed:\n{r.stderr}"
        return r.stdout


@pytest.fixture(scope="module")
def cluster(tenants: tuple[Submitter, Submitter]) -> Iterator[Cluster]:
    requires("root", "ip")
    requires_slurm()
    tmp = tempfile.mkdtemp(prefix="hpvc-slurm-test-")
    os.chmod(tmp, 0o755)  # munged wants its socket's directories searchable by all
    state = os.path.join(tmp, "state")
    port = bench_slurm.free_base_port(6917)
    bridge, subnet = bench_slurm.fabric_of(port)
    env = dict(
        os.environ, HPVC_SLURM_DIR=state, HPVC_SLURM_PORT=str(port), HPVC_SLURM_CPUS_PER_HOST="1"
    )
    try:
        r = subprocess.run(
            ["bash", UP], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert r.returncode == 0, f"up.sh failed:\n{r.stdout}\n{r.stderr}"
        lines = r.stdout.strip().splitlines()
        assert lines[-1] == f"export SLURM_CONF={state}/slurm.conf", r.stdout
        env["SLURM_CONF"] = f"{state}/slurm.conf"
        user = tenants[0]
        home = os.path.join(tmp, user.name)
        os.mkdir(home)
        os.chown(home, user.uid, user.gid)
        yield Cluster(tmp, env, bridge, subnet, r.stdout, user, home)
    finally:
        d = subprocess.run(
            ["bash", DOWN], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        left = leftovers(state) + fabric_leftovers(bridge)
        gone = not os.path.exists(state)
        again = subprocess.run(
            ["bash", DOWN], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        shutil.rmtree(tmp, ignore_errors=True)
        assert d.returncode == 0, f"down.sh failed:\n{d.stdout}\n{d.stderr}"
        assert not left, f"left behind: {left}"
        assert gone, f"{state} still exists after down.sh"
        assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout


def slurm(env: dict[str, str], *argv: str) -> str:
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr}"
    return r.stdout


def per_task(out: str) -> dict[int, list[str]]:
    """`srun -l` output: task id -> its lines."""
    rows: dict[int, list[str]] = {}
    for line in out.splitlines():
        task, _, text = line.partition(": ")
        rows.setdefault(int(task), []).append(text)
    return rows


def job_state(env: dict[str, str], job: str) -> str:
    out = slurm(env, "squeue", "-h", "-t", "all", "-j", job, "-o", "%T")
    return out.strip()


def wait_state(env: dict[str, str], job: str, want: set[str], timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = job_state(env, job)
        if state in want:
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job} is {state or 'gone'}, not {sorted(want)}, after {timeout} s")


def test_up_again_is_a_no_op(cluster: Cluster) -> None:
    r = subprocess.run(["bash", UP], env=cluster.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "already running" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == f"export SLURM_CONF={cluster.env['SLURM_CONF']}"


def test_srun_spans_three_hosts(cluster: Cluster) -> None:
    out = cluster.submit("srun", "-N3", "-l", "hostname")
    assert {t: rows[0] for t, rows in per_task(out).items()} == dict(enumerate(NODES)), out
    out = cluster.submit("srun", "-N3", "-l", "printenv", "SLURMD_NODENAME")
    assert sorted(line.split(": ")[1] for line in out.splitlines()) == list(NODES), out


def test_hosts_are_apart(cluster: Cluster) -> None:
    """Each host has its own hostname, fabric address (and no other), name
    resolution of the fabric, network devices and /run."""
    net3 = cluster.subnet.removesuffix(".0/24")
    out = cluster.submit(
        "srun", "-N3", "-l", "sh", "-c",
        "echo host $(hostname); ip -o -4 addr show | awk '{print \"addr\", $2, $4}';"
        " getent hosts n1 n2 n3 ctl | sed 's/^/name /'; ls /sys/class/net | sed 's/^/dev /'",
    )  # fmt: skip
    for task, rows in per_task(out).items():
        kind: dict[str, list[str]] = {}
        for row in rows:
            k, _, v = row.partition(" ")
            kind.setdefault(k, []).append(v)
        assert kind["host"] == [NODES[task]], out
        assert sorted(kind["addr"]) == [f"eth0 {net3}.{task + 1}/24", "lo 127.0.0.1/8"], out
        # its own /sys/class/net: the fabric, loopback and the VXLAN port holder
        # that host.sh makes at start (hpvc node prepare, docs/network.md)
        assert sorted(kind["dev"]) == ["eth0", "hpvc-vxport", "lo"], out
        assert sorted(" ".join(v.split()) for v in kind["name"]) == sorted(
            [f"{net3}.1 n1", f"{net3}.2 n2", f"{net3}.3 n3", f"{net3}.253 ctl"]
        ), out  # its own /etc/hosts

    # A bridge and a named network namespace made on n1 exist on n1 only.
    probe = f"hpvcprobe{os.getpid() % 10000}"
    cluster.on("n1", "ip", "link", "add", probe, "type", "bridge")
    cluster.on("n1", "ip", "netns", "add", probe)
    try:
        assert probe in cluster.on("n1", "ip", "-o", "link", "show")
        assert probe in cluster.on("n1", "ip", "netns", "list")
        views = {
            "n2": (cluster.on("n2", "ip", "-o", "link"), cluster.on("n2", "ls", "/run/netns")),
            "root": (slurm(cluster.env, "ip", "-o", "link"), " ".join(os.listdir("/run/netns"))),
        }
        for where, (links, netns) in views.items():
            assert f" {probe}:" not in links, f"bridge {probe} of n1 is visible on {where}"
            assert probe not in netns.split(), f"netns {probe} of n1 is visible on {where}"
    finally:
        cluster.on("n1", "ip", "netns", "del", probe)
        cluster.on("n1", "ip", "link", "del", probe)
    assert f" {probe}:" not in cluster.on("n1", "ip", "-o", "link", "show")


def test_each_host_runs_on_its_own_cpus(cluster: Cluster) -> None:
    """slurm-up's line names each host's CPUs; its jobs are confined to them."""
    m = re.search(r"CPUs of each host \(its slurmd's cpuset\): (.*?)( \(overlapping.*)?$",
                  cluster.up_out, re.M)  # fmt: skip
    assert m, cluster.up_out
    cpus = dict(part.split() for part in m.group(1).split("; "))
    assert set(cpus) == set(NODES), cluster.up_out
    out = cluster.submit("srun", "-N3", "-l", "grep", "Cpus_allowed_list", "/proc/self/status")
    for task, rows in per_task(out).items():
        assert rows[0].split()[-1] == cpus[NODES[task]], out
    for host in NODES:
        got = (CPUSET / cluster.bridge / host / "cpuset.cpus").read_text().strip()
        assert got == cpus[host], host
    # The CPU ids Slurm gives a job (what the plugin passes to `hpvc node up
    # --cpus`) are the machine's, among the host's own.
    job = max(int(x) for x in cluster.submit("squeue", "-h", "-t", "all", "-o", "%i").split())
    detail = cluster.submit("scontrol", "show", "job", "-d", str(job))
    given = dict(re.findall(r"Nodes=(n\d) CPU_IDs=(\S+)", detail))
    assert given == cpus, detail


def test_mpi_between_hosts_over_the_fabric(cluster: Cluster) -> None:
    """Open MPI ranks on two hosts (PMIx wire-up between the slurmstepds over
    the fabric addresses; the hosts have no other network)."""
    requires("mpi")
    out = Path(cluster.tmp) / "bin"
    out.mkdir(exist_ok=True)
    build_pingpong(out)
    text = cluster.submit(
        "srun", "-N2", "-n2", "--mpi=pmix", f"--chdir={cluster.tmp}",
        str(out / "pingpong"), "4096", "10",
    )  # fmt: skip
    rows = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    assert rows and rows[-1]["bytes"] == 4096, text
    assert {r["rank0"] for r in rows} == {"n1"}, text


def test_sbatch_job_writes_its_output(cluster: Cluster) -> None:
    tmp, env = cluster.home, cluster.env
    job = cluster.submit(
        "sbatch", "--parsable", "-D", tmp, "-o", f"{tmp}/out-%j.txt", "--wrap", "hostname"
    )
    job = job.strip().split(";")[0]
    assert wait_state(env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}) == "COMPLETED"
    assert Path(tmp, f"out-{job}.txt").read_text().strip() in NODES


def test_scancel_ends_a_running_job(cluster: Cluster) -> None:
    tmp, env = cluster.home, cluster.env
    sleep = f"sleep 60.{os.getpid()}"  # a command line no one else runs
    job = cluster.submit("sbatch", "--parsable", "-D", tmp, "-o", "/dev/null", "--wrap", sleep)
    job = job.strip().split(";")[0]
    wait_state(env, job, {"RUNNING"})
    cluster.submit("scancel", job)
    assert wait_state(env, job, {"CANCELLED", "COMPLETED", "FAILED"}) == "CANCELLED"
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-xf", sleep], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, f"{sleep} still running after scancel"
        time.sleep(0.1)

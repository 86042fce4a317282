"""The local Slurm test cluster (scripts/slurm/up.sh, down.sh) for real.

Starts it in a temporary state directory, runs srun across its three nodes,
an sbatch job and a cancelled one, then stops it and checks it left nothing
behind: no munged, slurmctld, slurmd or slurmstepd of its own, no directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.bench import slurm as bench_slurm
from tests.helpers import ROOT, requires

UP = os.path.join(ROOT, "scripts", "slurm", "up.sh")
DOWN = os.path.join(ROOT, "scripts", "slurm", "down.sh")
BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scancel")
NODES = ("n1", "n2", "n3")


def requires_slurm() -> None:
    """Skip (or, under HPVC_REQUIRE_ALL=1, fail) without Slurm and munge."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if not missing:
        return
    reason = f"{', '.join(missing)} not installed (make setup)"
    if os.environ.get("HPVC_REQUIRE_ALL") == "1":
        pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {reason}")
    pytest.skip(reason)


def free_base_port() -> int:
    return bench_slurm.free_base_port(6917)


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


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, dict[str, str]]]:
    requires("root")
    requires_slurm()
    tmp = tempfile.mkdtemp(prefix="hpvc-slurm-test-")
    os.chmod(tmp, 0o755)  # munged wants its socket's directories searchable by all
    state = os.path.join(tmp, "state")
    env = dict(os.environ, HPVC_SLURM_DIR=state, HPVC_SLURM_PORT=str(free_base_port()))
    try:
        r = subprocess.run(
            ["bash", UP], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert r.returncode == 0, f"up.sh failed:\n{r.stdout}\n{r.stderr}"
        lines = r.stdout.strip().splitlines()
        assert lines[-1] == f"export SLURM_CONF={state}/slurm.conf", r.stdout
        env["SLURM_CONF"] = f"{state}/slurm.conf"
        yield tmp, env
    finally:
        d = subprocess.run(
            ["bash", DOWN], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        left = leftovers(state)
        gone = not os.path.exists(state)
        shutil.rmtree(tmp, ignore_errors=True)
        assert d.returncode == 0, f"down.sh failed:\n{d.stdout}\n{d.stderr}"
        assert not left, f"processes left behind: {left}"
        assert gone, f"{state} still exists after down.sh"


def slurm(env: dict[str, str], *argv: str) -> str:
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr}"
    return r.stdout


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


def test_up_again_is_a_no_op(cluster: tuple[str, dict[str, str]]) -> None:
    _, env = cluster
    r = subprocess.run(["bash", UP], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "already running" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == f"export SLURM_CONF={env['SLURM_CONF']}"


def test_srun_spans_three_nodes(cluster: tuple[str, dict[str, str]]) -> None:
    _, env = cluster
    # All three nodes run on this host.
    out = slurm(env, "srun", "-N3", "hostname")
    assert out.split() == [socket.gethostname()] * 3, out
    out = slurm(env, "srun", "-N3", "-l", "printenv", "SLURMD_NODENAME")
    assert sorted(line.split(": ")[1] for line in out.splitlines()) == list(NODES), out


def test_sbatch_job_writes_its_output(cluster: tuple[str, dict[str, str]]) -> None:
    tmp, env = cluster
    job = slurm(
        env, "sbatch", "--parsable", "-D", tmp, "-o", f"{tmp}/out-%j.txt", "--wrap", "hostname"
    )
    job = job.strip().split(";")[0]
    assert wait_state(env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}) == "COMPLETED"
    assert Path(tmp, f"out-{job}.txt").read_text().strip() == socket.gethostname()


def test_scancel_ends_a_running_job(cluster: tuple[str, dict[str, str]]) -> None:
    tmp, env = cluster
    sleep = f"sleep 60.{os.getpid()}"  # a command line no one else runs
    job = slurm(env, "sbatch", "--parsable", "-D", tmp, "-o", "/dev/null", "--wrap", sleep)
    job = job.strip().split(";")[0]
    wait_state(env, job, {"RUNNING"})
    slurm(env, "scancel", job)
    assert wait_state(env, job, {"CANCELLED", "COMPLETED", "FAILED"}) == "CANCELLED"
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-xf", sleep], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, f"{sleep} still running after scancel"
        time.sleep(0.1)

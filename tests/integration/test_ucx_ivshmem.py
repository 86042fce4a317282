"""libuct_ivshmem.so on the host: real UCX 1.13 processes over one region file (issue 29).

The module (native/ucx) is built into a temporary folder against the installed UCX's
source (scripts/setup.sh fetches it) and loaded with LD_PRELOAD, as in the guests.
The region is a zero-filled file in /dev/shm standing in for the guests' ivshmem BAR
(UCX_IVSHMEM_PATH). Every job runs with UCX_TLS naming ``ivshmem`` and no TCP,
posix or sysv, so it FAILS when the transport is not used instead of falling back,
and UCX's own log (``ep_cfg[N]: tag(ivshmem/ivshmem)``) must name the lane. The
fallback tests add ``tcp`` and want UCX's log to name it instead.

ucx_perftest's out-of-band exchange and mpirun use loopback only. Every process is
started here and killed by PID; region files and build folders are removed on failure.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import requires

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native" / "ucx"
REGION_MIB = 64
LANE = re.compile(r"ep_cfg\[\d+\]: tag\((\w+)/")
# Final: iterations, latency 50%ile / average / overall (us), bandwidth average (MB/s), ...
FINAL = re.compile(r"Final:\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


@dataclass(frozen=True)
class Built:
    module: Path
    tool: Path  # test_alloc: "show" / "hold" a region
    folder: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    requires("ucx_perftest")
    out = tmp_path_factory.mktemp("ucx")
    done = subprocess.run(
        ["make", "-s", "-C", str(NATIVE), f"OUT={out}"], capture_output=True, text=True
    )
    assert done.returncode == 0, f"native/ucx did not build (run make setup): {done.stderr}"
    return Built(out / "libuct_ivshmem.so", out / "test_alloc", out)


def new_region(name: str, mib: int = REGION_MIB) -> Path:
    path = Path("/dev/shm") / f"hpvc-ucxtest-{os.getpid()}-{name}"
    with path.open("wb") as f:
        f.truncate(mib << 20)
    return path


@pytest.fixture
def region(built: Built) -> Iterator[Path]:
    path = new_region("a")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def env_for(built: Built, region: Path, tls: str = "ivshmem") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "OMPI_"))}
    env.update(
        LD_PRELOAD=str(built.module),
        UCX_IVSHMEM_PATH=str(region),
        UCX_TLS=tls,
        UCX_LOG_LEVEL="info",
        UCX_WARN_UNUSED_ENV_VARS="n",
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Is a TCP socket listening on ``port`` (state 0A in /proc/net/tcp)?"""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(r[1].endswith(f":{port:04X}") and r[3] == "0A" for r in rows)


@contextmanager
def started(cmd: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.PIPE,  # "test_alloc hold" holds until it closes
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()


@dataclass(frozen=True)
class Perf:
    rc: int
    out: str
    lanes: set[str]
    latency_median_us: float
    bandwidth_mbs: float


def perftest(
    server_env: dict[str, str], client_env: dict[str, str], test: str, size: int, iters: int
) -> Perf:
    """One ucx_perftest run between two processes; the client's numbers and both lanes."""
    port = free_port()
    with started(["ucx_perftest", "-p", str(port)], server_env) as server:
        for _ in range(200):
            if listening(port) or server.poll() is not None:
                break
            time.sleep(0.05)
        client = subprocess.run(
            [
                "ucx_perftest",
                "127.0.0.1",
                "-p",
                str(port),
                "-t",
                test,
                "-s",
                str(size),
                "-n",
                str(iters),
            ],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        try:  # a server whose client failed may wait for it forever: give it 5 s
            server_out, _ = server.communicate(timeout=60 if client.returncode == 0 else 5)
        except subprocess.TimeoutExpired:
            server_out = "(server did not end)"
    out = client.stdout + client.stderr + server_out
    final = FINAL.search(out)
    return Perf(
        client.returncode,
        out,
        set(LANE.findall(out)),
        float(final.group(2)) if final else -1.0,
        float(final.group(5)) if final else -1.0,
    )


def show(built: Built, region: Path) -> dict[str, int]:
    out = subprocess.run(
        [str(built.tool), "show", str(region)], capture_output=True, text=True, check=True
    ).stdout
    return {k: int(v) for k, v in (w.split("=") for w in out.split())}


# --- the module is a UCX transport --------------------------------------------------------


def test_ucx_info_lists_the_transport_only_with_the_module(built: Built, region: Path) -> None:
    env = env_for(built, region)
    listed = subprocess.run(["ucx_info", "-d"], env=env, capture_output=True, text=True)
    assert re.search(
        r"Transport: ivshmem\s+#\s+Device: ivshmem\s+#\s+Type: intra-node", listed.stdout
    )
    assert "device address: 16 bytes" in listed.stdout  # the region's id, not the boot id
    # UCX 1.13 loads only the modules it was built with: a folder in UCX_MODULE_DIR
    # holding our module under its own name is never searched (hence LD_PRELOAD).
    moddir = built.folder / "moddir"
    moddir.mkdir(exist_ok=True)
    for name in ("libuct_ivshmem.so", "libuct_ivshmem.so.0"):
        (moddir / name).write_bytes(built.module.read_bytes())
    plain = {k: v for k, v in env.items() if k != "LD_PRELOAD"} | {"UCX_MODULE_DIR": str(moddir)}
    unlisted = subprocess.run(["ucx_info", "-d"], env=plain, capture_output=True, text=True)
    assert unlisted.returncode == 0 and "Transport: ivshmem" not in unlisted.stdout


def test_no_region_no_transport(built: Built, tmp_path: Path) -> None:
    """Absent or unmappable region: the transport is not offered; nothing fails."""
    for path in (tmp_path / "missing", Path("/proc/version")):
        env = env_for(built, path)
        listed = subprocess.run(["ucx_info", "-d"], env=env, capture_output=True, text=True)
        assert listed.returncode == 0 and "Transport: tcp" in listed.stdout
        assert "Transport: ivshmem" not in listed.stdout


# --- data over the region ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("test", "size", "iters"),
    [("tag_lat", 8, 20000), ("tag_lat", 65536, 2000), ("tag_bw", 4 << 20, 100)],
)
def test_perftest_over_the_region(
    built: Built, region: Path, test: str, size: int, iters: int
) -> None:
    env = env_for(built, region)
    run = perftest(env, env, test, size, iters)
    assert run.rc == 0, run.out
    assert run.lanes == {"ivshmem"}, run.out
    assert run.latency_median_us > 0 and run.bandwidth_mbs > 0, run.out
    assert show(built, region)["used"] == 0  # both sides gave their segments back


def mpi_command(kind: str, program: Path, ranks: int, args: list[str]) -> list[str]:
    if kind == "openmpi":
        return [
            "mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
            "--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices",
            "any", "--mca", "btl", "self",
            "-x", "LD_PRELOAD", "-x", "UCX_IVSHMEM_PATH", "-x", "UCX_TLS", "-x", "UCX_LOG_LEVEL",
            str(program), *args,
        ]  # fmt: skip
    return ["mpiexec.mpich", "-n", str(ranks), str(program), *args]


@pytest.fixture(scope="module")
def programs(built: Built) -> dict[str, Path]:
    requires("mpi", "mpicc.mpich")
    made = {}
    for kind, cc in (("openmpi", "mpicc.openmpi"), ("mpich", "mpicc.mpich")):
        out = built.folder / f"mpicheck.{kind}"
        subprocess.run(
            [
                cc,
                "-std=gnu11",
                "-O2",
                "-Wall",
                "-Werror",
                "-o",
                str(out),
                str(NATIVE / "mpicheck.c"),
            ],
            check=True,
        )
        made[kind] = out
    return made


@pytest.mark.parametrize(
    ("kind", "ranks"), [("openmpi", 4), ("openmpi", 8), ("mpich", 2), ("mpich", 4)]
)
def test_mpi_job_over_the_region(
    built: Built, region: Path, programs: dict[str, Path], kind: str, ranks: int
) -> None:
    """Order, every byte, eager and rendezvous (4 MiB) sizes, 8 in flight per rank."""
    env = env_for(built, region, "ivshmem,self")
    done = subprocess.run(
        mpi_command(kind, programs[kind], ranks, ["5"]),
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"mpicheck ok ranks={ranks} rounds=5" in out
    lanes = LANE.findall(out)
    assert set(lanes) == {"self", "ivshmem"} and lanes.count("ivshmem") >= ranks, out
    assert show(built, region)["used"] == 0


# --- fallback and isolation -------------------------------------------------------------------


def test_full_region_falls_back_to_tcp(built: Built, region: Path) -> None:
    with started([str(built.tool), "hold", str(region)], os.environ.copy()) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline().startswith("held ")
        assert show(built, region)["largest"] < (2 << 20)
        run = perftest(*[env_for(built, region, "ivshmem,tcp")] * 2, "tag_lat", 8, 2000)
        assert run.rc == 0 and run.lanes == {"tcp"}, run.out
        only = perftest(*[env_for(built, region)] * 2, "tag_lat", 8, 100)
        assert only.rc != 0  # nothing to fall back to: UCX refuses, it does not hang


def test_two_regions_never_reach_each_other(built: Built, region: Path) -> None:
    other = new_region("b")
    try:
        a, b = env_for(built, region), env_for(built, other)
        assert perftest(a, b, "tag_lat", 8, 100).rc != 0  # unreachable: no lane at all
        tcp = perftest(
            env_for(built, region, "ivshmem,tcp"), env_for(built, other, "ivshmem,tcp"),
            "tag_lat", 8, 1000,
        )  # fmt: skip
        assert tcp.rc == 0 and tcp.lanes == {"tcp"}, tcp.out
    finally:
        other.unlink(missing_ok=True)


# --- a process killed in the middle of a transfer ----------------------------------------------


def test_killed_pair_leaves_others_running(built: Built, region: Path) -> None:
    """Kill both ends of a 4 MiB stream mid-transfer: a pair running beside it on the
    same region finishes; the dead pair's segments are refused, then reclaimed; new
    pairs run."""
    env = env_for(built, region)
    port = free_port()
    victims = ["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", "tag_bw", "-s",
               str(4 << 20), "-n", "1000000"]  # fmt: skip
    with started(["ucx_perftest", "-p", str(port)], env) as server:
        while not listening(port):
            assert server.poll() is None
            time.sleep(0.05)
        with started(victims, env) as client:
            while show(built, region)["used"] < 2 * 2:  # both ends' FIFO and buffers
                assert client.poll() is None
                time.sleep(0.05)
            beside = perftest(env, env, "tag_lat", 8, 2000)
            os.kill(client.pid, signal.SIGKILL)
            os.kill(server.pid, signal.SIGKILL)
    assert beside.rc == 0 and beside.lanes == {"ivshmem"}, beside.out
    after = show(built, region)
    assert after["used"] == 0 and after["dead"] >= 4  # quarantined, not offered
    again = perftest(env, env, "tag_bw", 4 << 20, 20)
    assert again.rc == 0 and again.lanes == {"ivshmem"}, again.out


@pytest.mark.parametrize("kind", ["openmpi", "mpich"])
def test_mpi_rank_killed_mid_transfer_ends_the_job(
    built: Built, region: Path, programs: dict[str, Path], kind: str
) -> None:
    env = env_for(built, region, "ivshmem,self")
    done = subprocess.run(
        mpi_command(kind, programs[kind], 3, ["die", "1"]),
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    assert "mpicheck ok" not in done.stdout
    assert show(built, region)["used"] == 0  # the dead rank's segments are no one's now


# --- ranks in different pid namespaces (as in two guests) ---------------------------------

# hydra's ssh launcher runs "LAUNCHER [options] HOST COMMAND-LINE": here each "host" is a
# new pid namespace on this machine (with its own /proc), and "nsb" starts 30 processes
# first, so its rank's pid differs from nsa's and does not exist in nsa's namespace:
# what two guests' kernels look like to each other.
PIDNS_LAUNCHER = """#!/bin/sh
host=$1; shift
while [ "${host#-}" != "$host" ]; do host=$1; shift; done
n=0; [ "$host" = nsb ] && n=30
exec unshare --pid --fork --mount-proc sh -c \\
  "i=0; while [ \\$i -lt $n ]; do /bin/true; i=\\$((i+1)); done; exec $*"
"""
RANK_PID = re.compile(r"\[\w+:(\d+)\s*:\d+\]\s+ucp_worker\.c:\d+\s+UCX\s+INFO\s+ep_cfg")


def test_mpich_ranks_in_two_pid_namespaces(
    built: Built, region: Path, programs: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 29: UCX's mm endpoint looked the FIFO owner's pid up in its own /proc, so
    MPICH (ch4:ucx) failed in MPI_Init ("failed to get start time for pid N") between
    ranks in different guests; the module now publishes pid 1 (mm_ivshmem.c)."""
    requires("root")  # unshare --pid (util-linux, always there)
    launcher = tmp_path / "launch-in-pidns"
    launcher.write_text(PIDNS_LAUNCHER)
    launcher.chmod(0o755)
    cmd = ["mpiexec.mpich", "-launcher", "ssh", "-launcher-exec", str(launcher),
           "-hosts", "nsa:1,nsb:1", "-n", "2", str(programs["mpich"]), "3"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=env_for(built, region, "ivshmem,self"), start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=120)
    finally:  # the launcher's processes share the session this test started
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    pids = set(RANK_PID.findall(out))
    assert len(pids) == 2, out  # two ranks, with different pids in their namespaces
    assert proc.returncode == 0, out
    assert "mpicheck ok ranks=2 rounds=3" in out
    assert LANE.findall(out).count("ivshmem") >= 2, out
    assert show(built, region)["used"] == 0

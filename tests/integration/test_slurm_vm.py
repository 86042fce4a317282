"""VM virtual clusters as Slurm jobs, for real: QEMU guests (TCG here) on the
namespace test cluster, jobs submitted by ordinary users.

The site allows VM nodes (``kinds=container,vm``). Each host of a job boots its
share of the guests; every task runs inside its guest through the guest's
agent (native/agent), with its output, exit status and signals carried back;
MPI runs between guests on two hosts with mpirun inside the guests; scancel
stops a command in a guest and leaves nothing (no QEMU, tap, disk, record,
lock) on any host; another user reaches neither the job nor its guests.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.host import qemu_user
from hpvc.image import resolve_image
from hpvc.image.guest import build_guest
from hpvc.render.context import tap_name
from hpvc.slurm import policy
from tests.helpers import build_pingpong, requires
from tests.integration.conftest import slurm_env
from tests.integration.slurm_env import HOSTS, Env, last_job
from tests.integration.test_cluster import image_ready
from tests.integration.test_vm_cluster import assert_confined, qemu_confinement

VM_SPEC = """name = "slvm"
kind = "vm"
image = "hpc"
[network]
subnet = "10.88.60.0/24"
[tuning]
pinning = "shared"
hugepages = "none"
partition = "commodity"
[[nodes]]
role = "compute"
count = 2
vcpus = 1
memory = "384MiB"
"""


@pytest.fixture(scope="module")
def slurm(tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter]) -> Iterator[Env]:
    """The test cluster, its site allowing VM nodes; the guest's kernel and
    disk built before any job (a job's `hpvc node up` would build them)."""
    requires("root", "qemu")
    image_ready()
    build_guest(resolve_image("hpc"))
    yield from slurm_env(tenants, "kinds=container,vm")


@pytest.fixture
def vm_spec(slurm: Env) -> Path:
    p = slurm.work / "vm.toml"
    p.write_text(VM_SPEC)
    return p


def vm_leftovers(slurm: Env, job: int) -> list[str]:
    """What a VM job could leave on its hosts beyond a container job's: QEMU
    processes, taps, the shares' folders (disks, sockets)."""
    found = []
    for host in HOSTS:
        store = slurm.cluster.store(host)
        view = slurm.on(host, "ps -eo pid,args; echo --; ip -o link")
        procs, links = view.split("--\n")
        found += [
            f"{host}: {line.strip()[:80]}"
            for line in procs.splitlines()
            if "qemu" in line and f"hpvc-j{job}-" in line
        ]
        for i in range(len(HOSTS)):
            share = policy.share_name(job, i)
            for node in ("compute0", "compute1"):
                if f" {tap_name(share, node)}:" in links:
                    found.append(f"{host}: tap of {share}/{node}")
            for d in (store.root / "clusters" / share, store.root / "run" / share):
                if d.exists():
                    found.append(f"{host}: {d}")
    return found


def wait_vm_clean(slurm: Env, job: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    left = vm_leftovers(slurm, job) + slurm.job_leftovers(job)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = vm_leftovers(slurm, job) + slurm.job_leftovers(job)
    assert left == [], f"job {job} left behind: {left}"


def submit(slurm: Env, spec: Path, script: str, out: Path) -> int:
    """sbatch -N2 of ``script``, with a variable of the user's that no guest may see."""
    (slurm.work / "job.sh").write_text("#!/bin/bash\n" + script)
    r = slurm.run(
        "sbatch", "--parsable", "-N2", f"--hpvc={spec}", "-o", str(out), str(slurm.work / "job.sh"),
        env={"MY_SECRET": "s3cret"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().split(";")[0])


def wait_done(slurm: Env, job: int, timeout: float = 400, out: Path | None = None) -> str:
    """Wait for ``job`` to leave the queue. One still there after ``timeout``
    is cancelled (and waited for, so its epilogs clean its hosts and the
    module's sweep does not blame the next test) and the test fails with the
    tail of its output ``out``: where it stood."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = slurm.run("squeue", "-h", "-j", str(job), "-o", "%T")
        if r.stdout.strip() == "":
            return "gone"
        time.sleep(1)
    slurm.run("scancel", str(job))
    gone = time.monotonic() + 120
    while time.monotonic() < gone and slurm.run("squeue", "-h", "-j", str(job)).stdout.strip():
        time.sleep(1)
    tail = out.read_text()[-3000:] if out is not None and out.exists() else "(no output)"
    raise AssertionError(f"job {job} still queued or running after {timeout} s; output:\n{tail}")


JOB = """set -u
echo "step hostname:"
srun -N2 -n2 hostname | sort
echo "step env:"
srun -N1 -n1 sh -c 'echo "$(hostname) procid=$SLURM_PROCID job=$SLURM_JOB_ID home=$HOME \
secret=${MY_SECRET:-none} spec=${HPVC_SPEC_B64:-none} pwd=$(pwd)"'
echo "step exit:"
srun -N2 -n2 sh -c 'echo "$(hostname) fails"; exit 3'
echo "exit status $?"
echo "step stdin:"
srun -N2 -n2 --input=all sh -c 'cat > /root/pingpong && chmod +x /root/pingpong && \
  echo "$(hostname) has $(wc -c < /root/pingpong) bytes"' < pingpong
echo "step mpi:"
srun -N1 -n1 mpirun -np 2 --host compute0,compute1 --mca btl tcp,self /root/pingpong 1024 20
echo "mpi status $?"
echo "step pmix:"
srun -N1 -n1 --mpi=pmix hostname
echo "pmix status $?"
"""


def test_vm_job_runs_its_steps_in_the_guests(slurm: Env, vm_spec: Path) -> None:
    """sbatch -N2 with a VM spec: the script runs on the host, every step in
    the guests (compute0 on the first host, compute1 on the second): their
    names; Slurm's variables but not the host's (HOME) nor its secrets; a
    failing command's exit status reaches srun; stdin reaches every task; an
    MPI ping-pong between the guests of the two hosts (mpirun inside the
    guests, started through their agents); srun --mpi=pmix runs its task in
    the guest (its PMIx carried by the relay: test_slurm_vm_pmix.py); nothing
    left on any host once the job ends."""
    build_pingpong(slurm.work)
    out = slurm.work / "vm-job.out"
    job = submit(slurm, vm_spec, JOB, out)
    wait_done(slurm, job, out=out)
    text = out.read_text()
    sections = dict(
        [*part.split(":\n", 1), ""][:2] for part in text.split("step ")[1:]
    )  # {name: output}
    # The first step booted the guests: its progress (stderr, into the same
    # file) says so, and the names are what the step printed.
    shown = sections["hostname"].splitlines()
    assert any(ln.startswith("hpvc: waiting for 1 guest(s) to boot") for ln in shown), text
    assert [ln for ln in shown if not ln.startswith("hpvc: ")] == ["compute0", "compute1"], text
    env = sections["env"].split()
    assert env[0] == "compute0" and "procid=0" in env and f"job={job}" in env, text
    assert "home=/root" in env and "secret=none" in env and "spec=none" in env, text
    assert f"pwd={slurm.work}" in env, text  # the site binds it into guests: virtiofs
    failed = sorted(line for line in sections["exit"].splitlines() if line.endswith(" fails"))
    assert failed == ["compute0 fails", "compute1 fails"], text
    assert "exit status 3" in sections["exit"], text
    size = (slurm.work / "pingpong").stat().st_size
    assert sorted(line for line in sections["stdin"].splitlines() if " has " in line) == [
        f"compute0 has {size} bytes",
        f"compute1 has {size} bytes",
    ], text
    rows = [json.loads(line) for line in sections["mpi"].splitlines() if line.startswith("{")]
    assert [r["bytes"] for r in rows] == [1, 4, 16, 64, 256, 1024], text
    assert all(r["rank0"] == "compute0" and r["latency_us"] > 0 for r in rows), text
    assert "mpi status 0" in sections["mpi"], text
    assert "compute0" in sections["pmix"] and "pmix status 0" in sections["pmix"], text
    wait_vm_clean(slurm, job)


AGENT_PROBE = (
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], 7117), timeout=10)\n"
    "print(s.recv(200).decode(errors='replace'))\n"
)

# Root holds N sockets from reserved ports to a guest's agent made, as the
# relays make theirs, with the user as file-system uid (their owner in
# /proc/net/tcp); it says "held N", then keeps them until its stdin closes.
RELAY_HOLDER = (
    "import ctypes, socket, sys\n"
    "ip, uid, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
    "ctypes.CDLL(None).setfsuid(uid)\n"
    "held, port = [], 1023\n"
    "while len(held) < n and port >= 512:\n"
    "    s = socket.socket()\n"
    "    try:\n"
    "        s.bind(('', port)); s.connect((ip, 7117)); held.append(s)\n"
    "    except OSError:\n"
    "        s.close()\n"
    "    port -= 1\n"
    "print('held', len(held), flush=True)\n"
    "sys.stdin.read()\n"
)


def test_scancel_stops_a_command_in_a_guest_and_only_the_owner_enters(
    slurm: Env, vm_spec: Path
) -> None:
    """A long command runs in both guests. The owner reaches a running node
    with another step (srun --overlap); another user can neither start a step
    in the job, nor talk to a guest's agent from the host, nor use hpvc node
    enter. scancel's SIGTERM reaches the command inside the guests (its trap
    answers), and the job leaves no QEMU, tap, disk, record or lock on any host."""
    out = slurm.work / "long.out"
    long = (  # \$: expanded in the guests, not by the batch script on the host
        "trap 'echo \\$(hostname) got TERM; exit 143' TERM;"
        " echo started \\$(hostname); sleep 600 & wait"
    )
    job = submit(slurm, vm_spec, f'srun -N2 -n2 sh -c "{long}"\n', out)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if out.exists() and out.read_text().count("started") == 2:
                break
            time.sleep(1)
        assert out.read_text().count("started") == 2, out.read_text()
        # Every QEMU of the job runs as its share's own uid, not root, under seccomp.
        shares = slurm.shares(job)
        assert sum(len(names) for names in shares.values()) == 2, shares
        for host, names in shares.items():
            for share in names:
                uid = qemu_user.find(slurm.cluster.store(host).root, share)
                assert uid is not None, (host, share)
                assert_confined(f"hpvc-{share}-", 1, uid)
        assert len(qemu_confinement(f"hpvc-j{job}-")) == 2
        first = next(h for h, names in shares.items() if f"j{job}-0" in names)
        store = slurm.cluster.store(first)
        ip = store.get(f"j{job}-0").the_plan().node("compute0").ip
        hpvc = slurm.env["HPVC_BIN"]
        # Root on the host sees the command running in the guest.
        inside = slurm.on(
            first,
            f'HPVC_STATE_DIR="{store.root}" "{hpvc}" node enter --job {job} --node compute0'
            " -- ps -eo args",
        )
        assert "sleep 600" in inside, inside
        # The owner: another step of the job, in the running guests.
        mine = slurm.run(
            "srun", f"--jobid={job}", "--overlap", f"--hpvc={vm_spec}", "-N1", "-n1", "hostname"
        )  # fmt: skip
        assert mine.returncode == 0 and mine.stdout.split() == ["compute0"], mine.stderr
        # The owner's relays on a host hold at most 128 reserved ports (issue 25,
        # item 10): with 128 more held as theirs, the next task is refused in one line.
        hold = slurm.cluster.on(
            first, ["python3", "-c", RELAY_HOLDER, ip, str(slurm.user.uid), "128"]
        )
        holder = subprocess.Popen(
            hold, env=slurm.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held 128\n"
            full = slurm.run(
                "srun", f"--jobid={job}", "--overlap", f"--hpvc={vm_spec}", "-N1", "-n1",
                f"--nodelist={first}", "hostname",
            )  # fmt: skip
            assert full.returncode != 0 and "compute0" not in full.stdout, full.stdout
            assert f"user {slurm.user.uid} already holds" in full.stderr, full.stderr
            assert "task relays to VM nodes on this host" in full.stderr, full.stderr
        finally:
            holder.communicate("", timeout=30)
        # Another user: refused by Slurm, by the agent, and by hpvc.
        theirs_spec = slurm.home(slurm.other) / "vm.toml"
        theirs_spec.write_text(VM_SPEC)
        theirs = slurm.run_as(
            slurm.other, "srun", f"--jobid={job}", "--overlap", f"--hpvc={theirs_spec}", "-n1",
            "hostname",
        )  # fmt: skip
        assert theirs.returncode != 0 and "compute0" not in theirs.stdout, theirs.stdout
        other = slurm.other.name
        probe = slurm.cluster.on(
            first, ["runuser", "-u", other, "--", "python3", "-c", AGENT_PROBE, ip]
        )
        said = subprocess.run(probe, env=slurm.env, capture_output=True, text=True, timeout=30)
        assert "refused" in said.stdout, (said.stdout, said.stderr)
        enter = slurm.cluster.on(
            first,
            ["runuser", "-u", other, "--", "env", f"HPVC_STATE_DIR={store.root}", hpvc,
             "node", "enter", "--job", str(job), "--node", "compute0", "--", "true"],
        )  # fmt: skip
        denied = subprocess.run(enter, env=slurm.env, capture_output=True, text=True, timeout=60)
        assert denied.returncode != 0, denied.stdout
    finally:
        assert slurm.run("scancel", str(job)).returncode == 0
    wait_done(slurm, job, timeout=120)
    # The relays passed scancel's SIGTERM to the commands in the guests.
    said = sorted(line for line in out.read_text().splitlines() if line.endswith("got TERM"))
    assert said == ["compute0 got TERM", "compute1 got TERM"], out.read_text()
    wait_vm_clean(slurm, job)


def test_a_one_host_vm_job_gives_back_hugepages_and_shared_memory(slurm: Env) -> None:
    """Both guests on one host, on 2M hugepages: they share an ivshmem region
    (a PCI device in each guest); when the job ends the host's hugepage pool
    is what it was, and no region, id or hugetlbfs mount of the job is left."""
    spec = slurm.work / "vm-pages.toml"
    spec.write_text(VM_SPEC.replace('hugepages = "none"', 'hugepages = "2M"'))
    before = Path("/proc/sys/vm/nr_hugepages").read_text().strip()
    r = slurm.run(
        "srun", "-N1", "-n2", f"--hpvc={spec}", "sh", "-c",
        'echo "$(hostname) $(cat /sys/bus/pci/devices/*/device | grep -c 0x1110)"',
        timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    # The guests took seconds to boot: srun's caller saw what it waited for,
    # as it came (`hpvc node up`'s progress, native/spank/run.c), not as errors.
    assert "hpvc: share 0 of job " in r.stderr, r.stderr
    assert "hpvc: waiting for 2 guest(s) to boot" in r.stderr, r.stderr
    assert "error" not in r.stderr, r.stderr
    # ivshmem-plain is PCI 1af4:1110: one in each guest
    assert sorted(r.stdout.splitlines()) == ["compute0 1", "compute1 1"], r.stdout
    job = last_job(slurm)
    wait_vm_clean(slurm, job)
    assert Path("/proc/sys/vm/nr_hugepages").read_text().strip() == before
    for host in HOSTS:
        store = slurm.cluster.store(host)
        ids = store.root / "ivshmem"
        held = [p.name for p in ids.iterdir()] if ids.is_dir() else []
        assert held == [], f"{host}: ivshmem ids {held}"
        view = slurm.on(host, "ls /dev/shm; echo --; cat /proc/mounts")
        shm, mounts = view.split("--\n")
        # neither a region nor its folder (/dev/shm/hpvc-ivshmem.XXXXXXXX) is left
        assert not [f for f in shm.split() if f.startswith("hpvc-ivshmem")], shm
        assert f"j{job}-" not in mounts, mounts

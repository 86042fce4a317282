"""A VM node of a running Slurm job moved live to another host of the job
(issue 27, docs/slurm.md "Moving a VM node to another host").

One two-host job of three 1-vCPU TCG guests (compute0 and compute1 on n1,
compute2 on n2), submitted by an ordinary user, with 700 MiB per host: an
Open MPI ping-pong with a checked answer between compute0 and compute1 and a
task relayed into each guest keep running while, as root on the hosts:

1. compute2 to n1 is refused (n1's nodes would need 960 MiB), nothing moves;
2. compute1 moves from n1 to n2 during the ping-pong: n2's record and
   ``hpvc node ls`` have it, n1's not; both hosts' VXLAN entries point its MAC
   at n2; the relayed task in it and the MPI job end correctly;
3. compute2 to n1 with a slow stream, its target QEMU killed by PID: exit 1,
   compute2 keeps running on n2, nothing of the target is left on n1;

and nothing of the job is left on either host once it ends.

A second job keeps its default ``locality = "shm"``: compute0 and compute1 share
n1's ivshmem region, and srun --mpi=pmix's Open MPI ping-pong between them
runs over it (UCX's lanes: ivshmem). compute1 moves to n2 mid-loop: hpvc takes
it off the region first (hpvc.host.region_departure), both ranks' UCX moves
the pair to TCP (the module's own log says so and counts what it carried), the
loop ends with every answer right, and the region n2 gave compute1 goes with
the job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.qemu.region import region_of
from hpvc.bench.migrate.slurm import build_loop
from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.image import resolve_image
from hpvc.image.guest import build_guest
from hpvc.plan.network import vxlan_link_name
from hpvc.render.context import tap_name
from hpvc.slurm import policy
from tests.helpers import requires
from tests.integration.slurm_env import Env
from tests.integration.test_cluster import image_ready
from tests.integration.test_slurm_cluster import requires_slurm
from tests.integration.test_slurm_vm import wait_done
from tests.unit.test_ucx_region import build_test_alloc

SPEC = """name = "mig"
kind = "vm"
image = "hpc"
[network]
subnet = "10.88.62.0/24"
[tuning]
pinning = "shared"
hugepages = "none"
partition = "commodity"
locality = "none"
[[nodes]]
role = "compute"
count = 3
vcpus = 1
memory = "320MiB"
"""

JOB = """set -u
srun -N2 -n3 --overcommit --input=all sh -c 'cat > /root/migloop; chmod +x /root/migloop' <migloop
srun -N2 -n3 --overcommit --overlap sh -c \
  'for i in $(seq 1 {ticks}); do [ -e /root/stop ] && break; sleep 1; done
   echo "$(hostname) ticked"' \
  > ticks.out 2>&1 &
srun -N1 -n1 --overlap mpirun -np 2 --host compute0,compute1 --mca btl tcp,self \
  /root/migloop {secs} /root/stop
echo "mpi status $?"
wait
echo "ticks status $?"
cat ticks.out
"""


SHM_SPEC = SPEC.replace('locality = "none"', 'locality = "shm"').replace(
    "10.88.62.0/24", "10.88.63.0/24"
)

SHM_JOB = """set -u
srun -N2 -n3 --overcommit --input=all sh -c 'cat > /root/migloop; chmod +x /root/migloop' <migloop
UCX_LOG_LEVEL=info srun -N1 -n2 -w n1 --overcommit --overlap --mpi=pmix /root/migloop {secs} \
  /root/stop
echo "mpi status $?"
"""
LANES = re.compile(r"ep_cfg\[\d+\]: tag\(([^)]*)\)")
LEFT = re.compile(r"ivshmem: endpoint to ([\d.]+) leaves the region for TCP")
SENT = re.compile(r"ivshmem: endpoint to [\d.]+ sent (\d+) messages")


@pytest.fixture(scope="module")
def slurm(tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter]) -> Iterator[Env]:
    """conftest's slurm_env, without the site's binds: a guest with a virtiofs
    bind cannot move (QEMU 7.2 cannot migrate vhost-user-fs), and this job
    sends its program in through stdin."""
    requires("root", "qemu", "crun", "ip", "mpi")
    requires_slurm()
    image_ready()
    build_guest(resolve_image("hpc"))
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-migrate-test-"))
    os.chmod(tmp, 0o755)
    shared = tmp / "work"
    shared.mkdir()
    left: list[tuple[str, str]] = []
    try:
        with bench_slurm.private_slurm(
            tmp, "10.88.0.0/16", extra_args="kinds=container,vm", hosts=2
        ) as c:
            try:
                yield Env(tmp, c, shared, tenants)
            finally:
                left = c.sweep(c.env["HPVC_BIN"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert left == [], f"shares left after the module: {left}"


def _hpvc(
    slurm: Env, host: str, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``hpvc ARGS`` as root on ``host``, reaching the other hosts through on.sh."""
    c = slurm.cluster
    via = " ".join(c.on("{host}", []))
    argv = c.on(host, [c.env["HPVC_BIN"], *args, "--via", via])
    return subprocess.run(argv, env=c.env, capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


def _nodes(slurm: Env, host: str, job: int) -> list[str]:
    out = slurm.cluster.run_on(host, [slurm.cluster.env["HPVC_BIN"], "node", "ls", "--json"])
    return sorted(n for s in json.loads(out) if s["job"] == job for n in s["nodes"])


def _qemus(slurm: Env, host: str, job: int) -> dict[int, str]:
    """The job's QEMU processes of ``host``'s share (every host sees the machine's
    processes: the test cluster's hosts share one PID namespace; a QEMU's -name
    names its share)."""
    share = policy.share_name(job, slurm.cluster.hosts.index(host))
    out = slurm.on(host, "ps -eo pid=,args=")
    return {
        int(line.split()[0]): line
        for line in out.splitlines()
        if "qemu-system" in line and f"-name hpvc-{share}-" in line
    }


def _slots(show: str) -> dict[str, int]:
    """test_alloc show's "used=U dead=D free=F largest=L" as a dict."""
    return {k: int(v) for k, v in (w.split("=") for w in show.split())}


def _fdb(slurm: Env, host: str, job: int, mac: str) -> str:
    link = vxlan_link_name(policy.share_name(job, 0 if host == "n1" else 1))
    return slurm.on(host, f"bridge fdb show dev {link} | grep -i '{mac}' || true")


def test_node_moves_between_hosts_under_a_running_mpi_job(slurm: Env) -> None:
    spec = slurm.work / "mig.toml"
    spec.write_text(SPEC)
    build_loop(slurm.work)  # native/bench/migloop.c: a ping-pong that checks its answers
    (slurm.work / "job.sh").write_text("#!/bin/bash\n" + JOB.format(ticks=240, secs=200))
    out = slurm.work / "job.out"
    r = slurm.run("sbatch", "--parsable", "-N2", "--mem=700M", f"--hpvc={spec}", "-o", str(out),
                  str(slurm.work / "job.sh"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        deadline = time.monotonic() + 240
        while "loop running" not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline, out.read_text() if out.exists() else "no output"
            time.sleep(1)
        assert _nodes(slurm, "n1", job) == ["compute0", "compute1"]
        assert _nodes(slurm, "n2", job) == ["compute2"]

        # 1. No fit: n1 would hold 960 MiB of guests, the job has 700 there.
        before = (_qemus(slurm, "n1", job), _qemus(slurm, "n2", job))
        refused = _hpvc(slurm, "n2", "node", "migrate", f"--job={job}", "--node=compute2",
                        "--to=n1")  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert "does not fit" in refused.stderr and "960 MiB" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) <= 2, refused.stderr
        assert (_qemus(slurm, "n1", job), _qemus(slurm, "n2", job)) == before
        assert _nodes(slurm, "n1", job) == ["compute0", "compute1"]

        # 2. compute1 to n2 while the ping-pong runs.
        mac = (
            slurm.cluster.store("n1").get(policy.share_name(job, 0)).the_plan().node("compute1").mac
        )
        moved = _hpvc(slurm, "n1", "node", "migrate", f"--job={job}", "--node=compute1",
                      "--to=n2", "--json")  # fmt: skip
        assert moved.returncode == 0, moved.stderr
        report = json.loads(moved.stdout)
        print("migration:", report)
        assert report["stats"]["total_ms"] > 0 and report["stats"]["bytes_sent"] > 0
        assert _nodes(slurm, "n1", job) == ["compute0"]
        assert _nodes(slurm, "n2", job) == ["compute1", "compute2"]
        assert len(_qemus(slurm, "n1", job)) == 1 and len(_qemus(slurm, "n2", job)) == 2
        on_n1 = _fdb(slurm, "n1", job, mac)
        assert "dst" in on_n1 and "self permanent" in on_n1, on_n1
        on_n2 = _fdb(slurm, "n2", job, mac)
        assert "dst" not in on_n2, on_n2

        # 3. A dying target: compute2 to n1 slowly, the target QEMU killed.
        proc = subprocess.Popen(
            _hpvc_argv(slurm, "n2", "node", "migrate", f"--job={job}", "--node=compute2",
                       "--to=n1", "--bandwidth=4"),
            env=slurm.cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        target = None
        while target is None and time.monotonic() < deadline:
            target = next(
                (p for p, a in _qemus(slurm, "n1", job).items() if "-incoming" in a), None
            )
            time.sleep(0.2)
        assert target is not None, "no target QEMU on n1"
        time.sleep(2)
        os.kill(target, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, err
        assert "keeps running where it was" in err, err
        assert _nodes(slurm, "n2", job) == ["compute1", "compute2"]
        assert _nodes(slurm, "n1", job) == ["compute0"]
        assert len(_qemus(slurm, "n1", job)) == 1, _qemus(slurm, "n1", job)
        # New steps find the nodes where they now are: n1 runs compute0, n2
        # compute2 and compute1. They also end the loops (/root/stop), which
        # would otherwise run their full time.
        for host, tasks in (("n1", "1"), ("n2", "2")):
            answer = slurm.run("srun", f"--jobid={job}", "--overlap", "--overcommit", "-N1",
                               f"-n{tasks}", "-w", host, f"--hpvc={spec}",
                               "sh", "-c", "hostname; touch /root/stop")  # fmt: skip
            assert answer.returncode == 0, answer.stderr
            shown = sorted(ln for ln in answer.stdout.splitlines() if ln.startswith("compute"))
            want = ["compute0"] if host == "n1" else ["compute1", "compute2"]
            assert shown == want, answer.stdout + answer.stderr

        assert wait_done(slurm, job) == "gone"
        text = out.read_text()
        print(text)
        assert "mpi status 0" in text, text
        assert ", 0 wrong" in text, text
        assert "ticks status 0" in text, text
        ticked = sorted(line.split()[0] for line in text.splitlines() if "ticked" in line)
        assert ticked == ["compute0", "compute1", "compute2"], text
    finally:
        slurm.run("scancel", str(job))
    _wait_clean(slurm, job)


def _hpvc_argv(slurm: Env, host: str, *args: str) -> list[str]:
    c = slurm.cluster
    via = " ".join(c.on("{host}", []))
    return c.on(host, [c.env["HPVC_BIN"], *args, "--via", via])


def _leftovers(slurm: Env, job: int) -> list[str]:
    """What the job could leave on its hosts: QEMU processes, taps, the shares'
    folders, and what any job could (records, locks, bridges, VXLAN, cgroups)."""
    found = []
    for host in slurm.cluster.hosts:
        found += [f"{host}: {a[:80]}" for a in _qemus(slurm, host, job).values()]
        links = slurm.on(host, "ip -o link")
        taps = {
            tap_name(policy.share_name(job, i), f"compute{n}")
            for i in range(len(slurm.cluster.hosts))
            for n in range(3)
        }
        found += [f"{host}: tap {t}" for t in sorted(taps) if f" {t}:" in links]
        store = slurm.cluster.store(host)
        for i in range(len(slurm.cluster.hosts)):
            share = policy.share_name(job, i)
            for d in (store.root / "clusters" / share, store.root / "run" / share):
                if d.exists():
                    found.append(f"{host}: {d}")
    return found + slurm.job_leftovers(job)


def _wait_clean(slurm: Env, job: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    left = _leftovers(slurm, job)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _leftovers(slurm, job)
    assert left == [], f"job {job} left behind: {left}"


def test_region_node_leaves_its_region_and_the_job_goes_on_over_tcp(slurm: Env) -> None:
    spec = slurm.work / "migshm.toml"
    spec.write_text(SHM_SPEC)
    build_loop(slurm.work)
    (slurm.work / "shm.sh").write_text("#!/bin/bash\n" + SHM_JOB.format(secs=200))
    out = slurm.work / "shm.out"
    r = slurm.run("sbatch", "--parsable", "-N2", "--mem=700M", f"--hpvc={spec}", "-o", str(out),
                  str(slurm.work / "shm.sh"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        deadline = time.monotonic() + 300
        while "loop running" not in (text := out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline and "mpi status" not in text, text or "no output"
            time.sleep(1)
        assert _nodes(slurm, "n1", job) == ["compute0", "compute1"]
        plan = slurm.cluster.store("n1").get(policy.share_name(job, 0)).the_plan()
        ips = sorted(plan.node(n).ip for n in ("compute0", "compute1"))
        [args] = [a for a in _qemus(slurm, "n1", job).values() if "compute0" in a]
        shared = region_of(args.split())
        slots = build_test_alloc(slurm.work)  # `show`: the region's slots by state
        before = _slots(slurm.on("n1", f"{slots} show {shared}"))
        moved = _hpvc(slurm, "n1", "node", "migrate", f"--job={job}", "--node=compute1",
                      "--to=n2", "--json")  # fmt: skip
        assert moved.returncode == 0, moved.stderr
        print("migration:", moved.stdout, moved.stderr)
        assert _nodes(slurm, "n2", job) == ["compute1", "compute2"]
        # compute1's QEMU on n2 maps a region of its own, not one n2's guests share
        [args] = [a for a in _qemus(slurm, "n2", job).values() if "compute1" in a]
        assert "id=ivshmem0" in args, args
        # compute1 runs on n2 now: n1's region takes back what its ranks held there
        # (no process on n1 could judge another kernel's processes dead)
        after = _slots(slurm.on("n1", f"{slots} show {shared}"))
        assert after["dead"] > before["dead"] and after["used"] < before["used"], (before, after)
        # compute0 (rank 0, the only node left on n1) ends the loop.
        stop = slurm.run("srun", f"--jobid={job}", "--overlap", "--overcommit", "-N1", "-n1",
                         "-w", "n1", f"--hpvc={spec}", "touch", "/root/stop")  # fmt: skip
        assert stop.returncode == 0, stop.stderr
        assert wait_done(slurm, job) == "gone"
        text = out.read_text()
        print(text)
        assert "mpi status 0" in text and ", 0 wrong" in text, text
        lanes = [x for x in LANES.findall(text) if not x.startswith("self/")]
        assert lanes and all(x.startswith("ivshmem/") for x in lanes), text  # began on it
        # each rank's endpoint to the other left the region
        assert sorted(LEFT.findall(text)) == ips, text
        sent = [int(n) for n in SENT.findall(text)]
        assert len(sent) == 2 and all(n > 0 for n in sent), text
    finally:
        slurm.run("scancel", str(job))
    _wait_clean(slurm, job)
    for host in slurm.cluster.hosts:  # compute1's own region on n2 went with the job
        ids = slurm.cluster.store(host).root / "ivshmem"
        held = sorted(p.name for p in ids.iterdir()) if ids.is_dir() else []
        assert held == [], f"{host}: ivshmem ids {held}"

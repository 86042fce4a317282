"""Spark and NFS shared storage as Slurm jobs across three hosts (issue 31,
docs/slurm.md "Spark and NFS under Slurm"), container nodes, submitted by
the test's tenants (ordinary users) to a private three-host test cluster:

* TeraSort (generate, sort, validate) as an ``sbatch`` job from the README's
  commands (examples/terasort-job.sh): the output sorted, every record there,
  the checksum the generated data's;
* while a job runs: head0's share on the first host serves NFS (the job's
  user the storage coordinator's tenant of it), the nodes on every host
  mount it, the master lists one worker per compute node on every host, and
  ``hpvc node ls`` / ``hpvc status`` say so; ``scancel`` then leaves nothing;
* a failing task leaves nothing;
* the host serving NFS dies mid-job (every process of it killed): the other
  hosts' epilogs unmount the dead server in bounded time and leave nothing;
  the host, back, takes its share down.

"Nothing" is Env.job_leftovers (records, containers, namespaces, bridge,
mounts, VXLAN, nftables, cgroups) plus what NFS adds: Ganesha, rpcbind and
hpvc-nfsfuse processes, loop devices, the coordinator's cgroup.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpvc.bench.slurm import cluster as bench_slurm
from tests.helpers import ROOT
from tests.integration.conftest import slurm_env
from tests.integration.slurm_env import Env, job_id

COMPUTES = 3
ROWS = 20000  # 2 MB: the job, not Spark's speed, is under test


@pytest.fixture(scope="module")
def slurm(tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter]) -> Iterator[Env]:
    for what in ("ganesha.nfsd", "fusermount3"):
        if shutil.which(what) is None:
            reason = f"{what} not installed (make setup)"
            if os.environ.get("HPVC_REQUIRE_ALL") == "1":
                pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {reason}")
            pytest.skip(reason)
    from hpvc.bench.common import ensure_image

    ensure_image("spark")  # built once (about 70 s), then reused from the store
    yield from slurm_env(tenants, site="images=hpc,spark")


def spec(slurm: Env, sleep_spec: bool = False) -> Path:
    """examples/spark-slurm.toml, in the tenant's directory."""
    p = slurm.work / "spark-slurm.toml"
    p.write_text((Path(ROOT) / "examples" / "spark-slurm.toml").read_text())
    os.chmod(p, 0o644)
    return p


def nfs_leftovers(job: int) -> list[str]:
    """What NFS could leave of the job on this machine: server, rpcbind and
    client processes (their command lines name the share's folder), loop
    devices on its image."""
    mark = f"/clusters/j{job}-"
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mark in cmd:
            found.append(f"process {p.name}: {cmd.strip()}")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False)
    found += [f"loop {line}" for line in loops.stdout.splitlines() if mark in line]
    return found


def wait_all_clean(slurm: Env, job: int, timeout: float = 90) -> None:
    slurm.wait_clean(job, timeout)
    deadline = time.monotonic() + 10
    while nfs_leftovers(job) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert nfs_leftovers(job) == []


def sbatch(slurm: Env, *argv: str) -> int:
    r = slurm.run("sbatch", "--parsable", *argv)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().split(";")[0])


def wait_done(slurm: Env, job: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = slurm.run("squeue", "-h", "-j", str(job), "-o", "%T")
        if r.stdout.strip() == "":
            return
        time.sleep(1)
    slurm.run("scancel", str(job))
    raise AssertionError(f"job {job} still running after {timeout:.0f} s")


def sleeping_job(slurm: Env, spec_path: Path) -> int:
    """A three-host job whose step sleeps on every host; returns once every
    share is up (the workers registered)."""
    job = sbatch(
        slurm, "-N3", "--mem=3G", f"--hpvc={spec_path}", "-o", "sleep-%j.out", "--wrap",
        "srun -N3 --ntasks-per-node=1 sleep 600",
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while len(slurm.running(job)) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    out = slurm.work / f"sleep-{job}.out"
    assert len(slurm.running(job)) == 3, (
        f"job {job}: {slurm.shares(job)}\n{out.read_text() if out.exists() else ''}"
    )
    return job


def test_terasort_as_a_slurm_job_across_three_hosts(slurm: Env) -> None:
    spec_path = spec(slurm)
    script = slurm.work / "terasort-job.sh"
    shutil.copy(Path(ROOT) / "examples" / "terasort-job.sh", script)
    os.chmod(script, 0o755)
    job = sbatch(
        slurm, "-N3", "--mem=3G", f"--hpvc={spec_path}", "-o", "ts-%j.out",
        str(script), str(ROWS),
    )  # fmt: skip
    try:
        wait_done(slurm, job, 480)
        out = (slurm.work / f"ts-{job}.out").read_text()
        gen = [ln for ln in out.splitlines() if ln.startswith("TERAGEN")]
        val = [ln for ln in out.splitlines() if ln.startswith("TERAVALIDATE")]
        assert gen and val, out[-3000:]
        fields = dict(w.split("=", 1) for w in val[0].split()[1:])
        gen_fields = dict(w.split("=", 1) for w in gen[0].split()[1:])
        assert fields["sorted"] == "true", val
        assert int(fields["records"]) == ROWS == int(gen_fields["records"]), (gen, val)
        assert fields["checksum"] == gen_fields["checksum"], (gen, val)
        # The first step ran on every host, in the compute nodes.
        assert sorted(ln for ln in out.splitlines() if ln.startswith("compute")) == [
            f"compute{i}" for i in range(COMPUTES)
        ], out[:2000]
    finally:
        slurm.run("scancel", str(job))
    wait_all_clean(slurm, job)


def node_ls(slurm: Env, host: str) -> list[dict[str, object]]:
    rows = json.loads(slurm.cluster.run_on(host, [slurm.env["HPVC_BIN"], "node", "ls", "--json"]))
    assert isinstance(rows, list)
    return rows


def test_a_running_job_serves_nfs_and_spark_on_every_host_then_scancel_leaves_nothing(
    slurm: Env,
) -> None:
    spec_path = spec(slurm)
    job = sleeping_job(slurm, spec_path)
    try:
        hosts = slurm.cluster.hosts
        listed = {h: node_ls(slurm, h) for h in hosts}
        first = listed[hosts[0]][0]
        assert first["nodes"] == ["head0", "compute0"]
        nfs = first["nfs"]
        assert isinstance(nfs, dict) and nfs["server"] == "head0" and nfs["serves_here"]
        for h, i in zip(hosts, range(3), strict=True):
            row = listed[h][0]
            assert row["mounts"] == {n: "ok" for n in row["nodes"]}, (h, row)  # type: ignore[union-attr]
            spark = row["spark"]
            assert isinstance(spark, dict)
            assert spark["workers"] == [f"compute{i}"], (h, row)
        # The master, asked from the first host, lists a worker per compute node.
        argv = [slurm.env["HPVC_BIN"], "status", f"j{job}-0", "--json"]
        st = json.loads(slurm.cluster.run_on(hosts[0], argv))
        alive = sorted(w["host"] for w in st["spark"]["workers"])
        assert len(alive) == COMPUTES, st["spark"]
        assert st["shared_dir"]["mounts"] == {"head0": "ok", "compute0": "ok"}
        # The share is the storage coordinator's, the job's user its tenant,
        # with the priority the site file gives that user.
        io = io_status(slurm)
        mine = [c for c in io["clusters"] if c["cluster"] == f"j{job}-0"]
        assert mine and mine[0]["owner"] == slurm.user.name, io
        assert (mine[0]["priority"], mine[0]["priority_from"]) == (
            7,
            f"site: user {slurm.user.name}",
        ), mine
        # Files the user writes on one host are the user's, seen on another.
        step = ["srun", f"--jobid={job}", f"--hpvc={spec_path}", "--overlap", "-N1", "-n1", "-w"]
        w = slurm.run(*step, hosts[0], "sh", "-c",
                      "echo from-n1 > /shared/mark && stat -c %u /shared/mark")  # fmt: skip
        assert w.returncode == 0 and w.stdout.strip() == str(slurm.user.uid), w.stderr
        r = slurm.run(*step, hosts[2], "cat", "/shared/mark")
        assert r.returncode == 0 and r.stdout.strip() == "from-n1", r.stderr
    finally:
        slurm.run("scancel", str(job))
    wait_all_clean(slurm, job)
    io = io_status(slurm)
    assert not [c for c in io["clusters"] if c["cluster"] == f"j{job}-0"], io


def io_status(slurm: Env) -> dict[str, Any]:
    """``hpvc io status`` on the first host, with a site file giving the
    first tenant priority 7 (docs/io.md)."""
    site = slurm.tmp / "io.toml"
    site.write_text(
        f'[devices.disk0]\npath = "{slurm.tmp}"\nwrite = "1000MB/s"\n'
        f"[priority]\ndefault = 1\nusers = {{ {slurm.user.name} = 7 }}\n"
    )
    argv = ["env", f"HPVC_IO_SITE={site}", slurm.env["HPVC_BIN"], "io", "status", "--json",
            "--interval", "0"]  # fmt: skip
    doc = json.loads(slurm.cluster.run_on(slurm.cluster.hosts[0], argv))
    assert isinstance(doc, dict)
    return doc


def test_a_failing_task_leaves_nothing(slurm: Env) -> None:
    r = slurm.run("srun", "-N3", "--mem=3G", "--ntasks-per-node=1", f"--hpvc={spec(slurm)}",
                  "sh", "-c", "test -d /shared && exit 3", timeout=300)  # fmt: skip
    assert r.returncode == 3, r.stderr
    wait_all_clean(slurm, job_id(_last(slurm)))


def _last(slurm: Env) -> str:
    r = slurm.run("squeue", "-h", "-t", "all", "-o", "%i")
    return max(r.stdout.split(), key=int)


def test_the_nfs_serving_host_dying_ends_the_job_cleanly_on_every_host(slurm: Env) -> None:
    """The first host (head0: NFS server and Spark master) crashes mid-job:
    every process of it is killed, as test_slurm_scale does (slurmd, the job's
    slurmstepd, its resident hpvc, the share's nodes), and its NFS server and
    clients with them. The user cancels; the other hosts' epilogs unmount
    the dead server (lazily, bounded) and leave nothing; the host, started
    again, takes what its share left down (loop device, export, mounts)."""
    from tests.integration.test_slurm_scale import kill_host, restart_host

    job = sleeping_job(slurm, spec(slurm))
    victim = slurm.cluster.hosts[0]
    others = slurm.cluster.hosts[1:]
    killed = restarted = False
    try:
        # The share's own NFS processes (Ganesha, rpcbind, the nodes' clients)
        # die with the machine too: they name the share's folder on the host.
        folder = str(slurm.cluster.store(victim).cluster_dir(f"j{job}-0")) + "/"
        nfs = [
            int(x.split(":")[0].split()[1])
            for x in nfs_leftovers(job)
            if x.startswith("process ") and folder in x
        ]
        assert nfs, f"no NFS process of {folder}: {nfs_leftovers(job)}"
        for pid in nfs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed = True
        kill_host(slurm, victim, job, 0)
        # A node on another host now asks a dead server: answered, not hung.
        r = slurm.cluster.run_on(others[0], [slurm.env["HPVC_BIN"], "node", "ls", "--json"], 60)
        row = json.loads(r)[0]
        assert row["mounts"]["compute1"] != "ok", row
        cancel = slurm.run("scancel", str(job))
        assert cancel.returncode == 0, cancel.stderr
        deadline = time.monotonic() + 150
        left = [x for h in others for x in slurm.host_leftovers(h, job)]
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = [x for h in others for x in slurm.host_leftovers(h, job)]
        assert left == [], f"after {victim} died, job {job} left: {left}"
        mine = [x for x in nfs_leftovers(job) if folder not in x]
        assert mine == [], mine
        restart_host(slurm, victim)
        restarted = True
        slurm.cluster.run_on(victim, [slurm.env["HPVC_BIN"], "node", "down", "--job", str(job)],
                             120)  # fmt: skip
        wait_all_clean(slurm, job)
    finally:
        if not restarted:  # a failed check above: the module's sweep needs the host back
            slurm.run("scancel", str(job))
            if killed:
                restart_host(slurm, victim)

"""VM nodes with an NFS shared directory as a Slurm job across hosts (issue 31 item 2).

A tenant's ``sbatch -N2`` with ``kind = "vm"`` and ``[shared] server = "nfs"``
on the private test cluster, TCG guests of 256 MiB: head0's share on the
first host serves the directory from its guest (Ganesha on the guest's own
disk), compute0's guest on the second host mounts it with its own NFS client
over the job's VXLAN network. A file each guest writes is read by the other;
both see one NFS mount of head0's export. Once the job ends nothing is left on
any host (no QEMU, tap, backing image, share folder). Spark in VM guests
across hosts: docs/slurm.md ("Spark and NFS under Slurm").
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.image import resolve_image
from hpvc.image.guest import build_guest
from tests.helpers import requires
from tests.integration.conftest import slurm_env
from tests.integration.slurm_env import Env
from tests.integration.test_slurm_vm import wait_done, wait_vm_clean
from tests.integration.test_vm_shared_nfs import NFS_IMAGE, nfs_image_ready

pytestmark = pytest.mark.integration

SPEC = f"""name = "vnfs"
kind = "vm"
image = "{NFS_IMAGE}"
[network]
subnet = "10.88.62.0/24"
[tuning]
pinning = "shared"
hugepages = "none"
partition = "commodity"
[shared]
server = "nfs"
size = "256MiB"
[[nodes]]
role = "head"
vcpus = 1
memory = "256MiB"
[[nodes]]
role = "compute"
vcpus = 1
memory = "256MiB"
"""

JOB = """set -u
srun -N2 -n2 sh -c 'hostname > /shared/$(hostname)'
echo "step read:"
srun -N2 -n2 sh -c 'echo "$(hostname): $(cat /shared/head0) $(cat /shared/compute0) \
$(grep -c " /shared nfs " /proc/mounts) $(grep " /shared nfs " /proc/mounts | cut -d" " -f1) \
$(awk "\\$2 == \\"head0\\" {print \\$1}" /etc/hosts):/shared"'
"""


@pytest.fixture(scope="module")
def slurm(tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter]) -> Iterator[Env]:
    """The test cluster, its site allowing VM nodes and the NFS image; the
    guest built before any job (a job's `hpvc node up` would build it)."""
    requires("root", "qemu")
    nfs_image_ready()
    build_guest(resolve_image(NFS_IMAGE))
    yield from slurm_env(tenants, f"kinds=container,vm images=hpc,{NFS_IMAGE}")


def test_vm_guests_on_two_hosts_share_one_nfs_directory(slurm: Env) -> None:
    spec = slurm.work / "vm-nfs.toml"
    spec.write_text(SPEC)
    (slurm.work / "job.sh").write_text("#!/bin/bash\n" + JOB)
    out = slurm.work / "vm-nfs.out"
    r = slurm.run(
        "sbatch", "--parsable", "-N2", f"--hpvc={spec}", "-o", str(out),
        str(slurm.work / "job.sh"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    t0 = time.monotonic()
    try:
        wait_done(slurm, job)
        took = time.monotonic() - t0
        text = out.read_text()
        read = [ln for ln in text.split("step read:\n", 1)[-1].splitlines() if ": " in ln]
        rows = sorted(ln.split() for ln in read)
        assert [r[:5] for r in rows] == [
            ["compute0:", "head0", "compute0", "1", rows[0][4]],
            ["head0:", "head0", "compute0", "1", rows[0][4]],
        ], text
        # Both mount head0's export, by the address the job's /etc/hosts gives it.
        assert all(r[4] == r[5] and r[4].endswith(":/shared") for r in rows), text
        print(f"job {job}: {took:.1f} s from sbatch to the end (TCG)")
    finally:
        wait_vm_clean(slurm, job)


def vm_nfs_leftovers(slurm: Env, job: int, hosts: tuple[str, ...]) -> list[str]:
    """What a VM NFS job could leave on ``hosts``: the shares' records,
    namespaces, bridge, mounts and VXLAN (Env.host_leftovers); QEMU, taps and
    the shares' folders (the head's backing image is in its folder); and on
    this machine any process (virtiofsd, an NFS helper) or loop device that
    names a share's folder."""
    from hpvc.render.context import tap_name
    from hpvc.slurm import policy
    from tests.integration.test_slurm_spark import nfs_leftovers

    found = [x for h in hosts for x in slurm.host_leftovers(h, job)]
    for host in hosts:  # as test_slurm_vm.vm_leftovers, for these hosts only
        store = slurm.cluster.store(host)
        procs, links = slurm.on(host, "ps -eo pid,args; echo --; ip -o link").split("--\n")
        found += [f"{host}: {ln.strip()[:80]}" for ln in procs.splitlines()
                  if "qemu" in ln and f"hpvc-j{job}-" in ln]  # fmt: skip
        for i in range(len(slurm.cluster.hosts)):
            share = policy.share_name(job, i)
            found += [f"{host}: tap of {share}/{n}" for n in ("head0", "compute0")
                      if f" {tap_name(share, n)}:" in links]  # fmt: skip
            dirs = (store.root / "clusters" / share, store.root / "run" / share)
            found += [f"{host}: {d}" for d in dirs if d.exists()]
    folders = [str(slurm.cluster.store(h).root / "clusters") + "/" for h in hosts]
    found += [x for x in nfs_leftovers(job) if any(f in x for f in folders)]
    return found


def test_the_nfs_serving_host_dying_ends_a_vm_job_cleanly_on_every_host(slurm: Env) -> None:
    """The first host (head0's guest: the NFS server) crashes mid-job: every
    process of it is killed (slurmd, slurmstepd, its resident hpvc, head0's
    QEMU), as test_slurm_scale does. compute0's guest on the second host
    then holds a hard NFS mount of a dead server: `hpvc status` there still
    answers (the guest's mount "not answering", bounded), scancel's epilog
    there stops the guest and leaves nothing (no QEMU, tap, share folder,
    virtiofsd, loop device); the first host, started again, takes what its
    share left (backing image, folders) down."""
    import json

    from tests.integration.test_slurm_scale import kill_host, restart_host

    spec = slurm.work / "vm-nfs-die.toml"
    spec.write_text(SPEC.replace('name = "vnfs"', 'name = "vnfsdie"'))
    r = slurm.run(
        "sbatch", "--parsable", "-N2", f"--hpvc={spec}", "-o", str(slurm.work / "die-%j.out"),
        "--wrap", "srun -N2 -n2 sleep 600",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    victim, survivor = slurm.cluster.hosts[0], slurm.cluster.hosts[1]
    killed = restarted = False
    try:
        deadline = time.monotonic() + 300
        while len(slurm.running(job)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(slurm.running(job)) == 2, f"job {job} shares: {slurm.shares(job)}"
        status = [slurm.env["HPVC_BIN"], "status", f"j{job}-1", "--json"]
        before = json.loads(slurm.cluster.run_on(survivor, status, 120))
        assert before["shared_dir"]["mounts"] == {"compute0": "ok"}, before["shared_dir"]
        killed = True
        kill_host(slurm, victim, job, 0)
        # compute0's guest asks a dead server: answered within the bound, not hung.
        t0 = time.monotonic()
        after = json.loads(slurm.cluster.run_on(survivor, status, 120))
        mount = after["shared_dir"]["mounts"]["compute0"]
        assert mount != "ok" and "not answering" in mount, after["shared_dir"]
        print(f"status with the server dead: {time.monotonic() - t0:.1f} s")
        cancel = slurm.run("scancel", str(job))
        assert cancel.returncode == 0, cancel.stderr
        deadline = time.monotonic() + 150
        left = vm_nfs_leftovers(slurm, job, (survivor,))
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = vm_nfs_leftovers(slurm, job, (survivor,))
        assert left == [], f"after {victim} died, job {job} left on {survivor}: {left}"
        restart_host(slurm, victim)
        restarted = True
        slurm.cluster.run_on(victim, [slurm.env["HPVC_BIN"], "node", "down", "--job", str(job)],
                             120)  # fmt: skip
        wait_vm_clean(slurm, job)
        assert vm_nfs_leftovers(slurm, job, slurm.cluster.hosts) == []
    finally:
        if not restarted:  # a failed check above: the module's sweep needs the host back
            slurm.run("scancel", str(job))
            if killed:
                restart_host(slurm, victim)

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

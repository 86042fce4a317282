"""The site's binds in VM guests under Slurm (issue 31 item 4), as an ordinary user.

The test cluster's site shares its "shared file system" (``binds=``, every
tenant's directory in it) and allows VM nodes. A tenant's ``srun`` with a VM
spec runs in a guest whose shell is root: it starts in the tenant's own
directory (the bind is mounted at the same path), reads the tenant's 0600
file, makes a file that belongs to the tenant on the host, and cannot read
the other tenant's 0600 file. Once the job ends no virtiofsd, socket or
share folder is left on the host. How the daemon is run (as the user, in a
user namespace of its own): hpvc.host.virtiofsd, and
tests/integration/test_vm_binds.py without Slurm.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.image import resolve_image
from hpvc.image.guest import build_guest
from tests.helpers import requires
from tests.integration.conftest import slurm_env
from tests.integration.slurm_env import Env, last_job
from tests.integration.test_cluster import image_ready
from tests.integration.test_slurm_vm import wait_vm_clean

pytestmark = pytest.mark.integration

SPEC = """name = "vbind"
kind = "vm"
image = "hpc"
[network]
subnet = "10.88.61.0/24"
[tuning]
pinning = "shared"
hugepages = "none"
partition = "commodity"
[[nodes]]
role = "compute"
count = 1
vcpus = 1
memory = "256MiB"
"""


@pytest.fixture(scope="module")
def slurm(tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter]) -> Iterator[Env]:
    """The test cluster, its site allows VM nodes and binds its shared
    directory; the guest built before the job (its `hpvc node up` would)."""
    requires("root", "qemu")
    image_ready()
    build_guest(resolve_image("hpc"))
    yield from slurm_env(tenants, "kinds=container,vm")


def daemons(slurm: Env) -> list[str]:
    """virtiofsd processes serving the test cluster's shared directory, on its host."""
    ps = slurm.on(slurm.cluster.hosts[0], "ps -eo user:20,args")
    return [line for line in ps.splitlines() if f"source={slurm.shared}" in line]


def test_a_guest_sees_the_bind_with_the_users_rights_only(slurm: Env) -> None:
    spec = slurm.work / "vm.toml"
    spec.write_text(SPEC)
    mine = slurm.work / "mine.txt"
    mine.write_text("mine\n")
    os.chown(mine, slurm.user.uid, slurm.user.gid)
    os.chmod(mine, 0o600)
    theirs = slurm.home(slurm.other) / "theirs.txt"
    theirs.write_text("theirs\n")
    os.chown(theirs, slurm.other.uid, slurm.other.gid)
    os.chmod(theirs, 0o600)
    script = (
        "id -u; pwd; cat mine.txt; echo made > made.txt; "
        f"cat {theirs} || echo not-read; mount | grep -c ' type virtiofs '"
    )
    r = slurm.run("srun", "-N1", "-n1", f"--hpvc={spec}", "sh", "-c", script, timeout=300)
    job = last_job(slurm)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        out = [ln for ln in r.stdout.splitlines() if not ln.startswith("hpvc: ")]
        assert out == ["0", str(slurm.work), "mine", "not-read", "1"], r.stdout + r.stderr
        assert "Permission denied" in r.stderr, r.stderr
        made = slurm.work / "made.txt"
        assert made.read_text() == "made\n"
        assert (made.stat().st_uid, made.stat().st_gid) == (slurm.user.uid, slurm.user.gid)
    finally:
        wait_vm_clean(slurm, job)
    assert daemons(slurm) == []
    run = Path(slurm.cluster.store(slurm.cluster.hosts[0]).root) / "run"
    assert not any(p.name.startswith(f"j{job}-") for p in run.glob("*")), list(run.glob("*"))

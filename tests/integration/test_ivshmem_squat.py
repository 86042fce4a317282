"""Issue 25 item 9: an ordinary user cannot keep VM clusters from their ivshmem region.

The attack, as a test tenant (tests/tenants.py) on the real /dev/shm: make every
name an older hpvc gave a region (``/dev/shm/hpvc-ivshmem-{0..4095}``), and
folders where a region folder could be looked for (``/dev/shm/hpvc``,
``/dev/shm/hpvc-ivshmem.*``). Then root asks for the region of a cluster with
co-resident guests, as the qemu backend does (``ivshmem_for``): it must get one,
in a folder the tenant can neither enter nor has made, and the tenant must not be
able to open the region. Before the fix the same call failed ("all 4096 region
ids are in use").

Everything the tenant made is removed by name (only files and folders the tenant
owns), the region through its journal, even when the test fails.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.vm import guest as vm
from hpvc.bench.slurm.cluster import Submitter
from hpvc.host import ivshmem
from hpvc.host.journal import Journal
from hpvc.store import Store
from tests.helpers import requires
from tests.unit.test_render import hand_vm_plan

pytestmark = pytest.mark.integration

SHM = Path("/dev/shm")
FOLDERS = ("hpvc", *(f"{ivshmem.DIR_PREFIX}{c * 8}" for c in "abcdefgh"))


def as_tenant(user: Submitter, script: str) -> subprocess.CompletedProcess[str]:
    argv = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups"]
    return subprocess.run([*argv, "sh", "-c", script], capture_output=True, text=True)


@pytest.fixture
def squat(tenants: tuple[Submitter, Submitter]) -> Iterator[Submitter]:
    """Every old region name and a few folder names in /dev/shm, made by a tenant."""
    requires("root")
    user = tenants[0]
    names = [f"{ivshmem.PREFIX}{i}" for i in range(ivshmem.MAX_IDS)]
    try:  # a name already there (someone else's) is taken as it is
        made = as_tenant(
            user,
            f"cd {SHM} && for i in $(seq 0 {ivshmem.MAX_IDS - 1}); do"
            f" [ -e {ivshmem.PREFIX}$i ] || : > {ivshmem.PREFIX}$i || exit 1; done"
            f" && for d in {' '.join(FOLDERS)}; do [ -e $d ] || mkdir -m 0777 $d || exit 1; done",
        )
        assert made.returncode == 0, made.stderr
        taken = [n for n in (*names, *FOLDERS) if (SHM / n).exists()]
        assert len(taken) == len(names) + len(FOLDERS)
        assert sum((SHM / n).stat().st_uid == user.uid for n in taken) > len(names) // 2
        yield user
    finally:
        for n in (*names, *FOLDERS):  # only what the tenant made
            p = SHM / n
            if p.exists() and not p.is_symlink() and p.stat().st_uid == user.uid:
                if p.is_dir():
                    subprocess.run(["rm", "-rf", "--one-file-system", str(p)], check=False)
                else:
                    p.unlink()


def test_a_tenant_squatting_region_names_does_not_stop_a_cluster(
    squat: Submitter, tmp_path: Path
) -> None:
    store, journal = Store(tmp_path / "state"), Journal(tmp_path / "journal.jsonl")
    plan = hand_vm_plan()  # head0, compute0 and compute1: VMs on one host
    try:
        got = vm.ivshmem_for(store, plan, journal, "shm", size_mib=2)
        assert got is not None, "no region for co-resident guests"
        region = Path(got[0])
        folder = region.parent
        assert folder.parent == SHM and folder.name.startswith(ivshmem.DIR_PREFIX)
        assert folder.name not in FOLDERS
        st = os.lstat(folder)
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o700)
        assert region.stat().st_size == 2 << 20 and region.stat().st_uid == 0
        # The tenant can neither look into the folder nor open the region.
        for script in (f"ls {folder}", f"cat {region}", f"echo x >> {region}"):
            done = as_tenant(squat, script)
            assert done.returncode != 0, f"the tenant could: {script}"
            assert "Permission denied" in done.stderr, done.stderr
        assert vm.ivshmem_for(store, plan, journal, "shm", size_mib=2) == got  # found again
    finally:
        assert journal.undo_all() == []
    assert ivshmem.live_ids(store.root) == {}
    assert not region.exists() and not folder.exists()

"""A container node holds no more than its memory, normal and hugepages together
(issue 25, item 4, reproduced).

The attack: inside a node of ``memory = "512MiB"`` (root in the container,
what any tenant is in their own node), allocate normal memory up to near the
node's memory, then map and touch ``MAP_HUGETLB`` memory as well. Before,
the node's memory limit and its hugetlb limit were both its whole memory and
its cluster's parent had no hugetlb limit: both allocations succeeded (480
MiB of each). Now the node's normal memory is ``memory - hugepage_memory``
and its hugepages ``hugepage_memory``: the allocation past either fails.

So that only the cgroup limits can stop the attack, the 2M pool of NUMA node 0
has free pages beyond the node's own while it runs; every test puts the pool
back to what it was (after the cluster is torn down), even when it fails.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.host import cgroups
from hpvc.host.cgroupfs import manager
from hpvc.host.hugepages import pool_dir
from hpvc.store import Store
from hpvc.sysroot import HOST
from tests.integration.test_cluster import image_ready
from tests.integration.test_cluster import store as store  # the fixture
from tests.integration.test_hugepages_held import SIZE, _persistent, _read, _up
from tests.integration.test_hugepages_held import pool as pool  # the fixture

NODE_MIB = 512
HUGE_MIB = 128  # hugepage_memory: 64 pages of 2M
NORMAL_MIB = NODE_MIB - HUGE_MIB
EXTRA = 128  # free 2M pages beyond the node's while the attack runs

# Touch NORMAL MiB of normal memory, say "normal", then (PAGES > 0) map and touch
# PAGES 2M pages (MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB = 0x40000), say "huge".
_ATTACK = (
    "import mmap, sys\n"
    "normal, pages = int(sys.argv[1]) << 20, int(sys.argv[2])\n"
    "b = bytearray(normal)\n"
    "for i in range(0, normal, 4096): b[i] = 1\n"
    "print('normal', flush=True)\n"
    "if pages:\n"
    "    m = mmap.mmap(-1, pages << 21, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000)\n"
    "    for i in range(0, pages << 21, 1 << 21): m[i] = 1\n"
    "    print('huge', flush=True)\n"
)


def _spec(tmp_path: Path, name: str) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "container"\n'
        f'[network]\nsubnet = "10.219.{os.getpid() % 250}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "2M"\npartition = "commodity"\n'
        'numa = "none"\nlocality = "none"\n'
        f'[[nodes]]\nrole = "head"\nvcpus = 1\nmemory = "{NODE_MIB}MiB"\n'
        f'hugepage_memory = "{HUGE_MIB}MiB"\n'
    )
    return str(p)


@pytest.fixture
def spare(pool: tuple[int, int]) -> Iterator[None]:
    """EXTRA more 2M pages in the pool for the test's length (the ``pool``
    fixture checks after the cluster is gone that it is back as found)."""
    nr = pool_dir(0, SIZE) / "nr_hugepages"
    nr.write_text(f"{pool[0] + EXTRA}\n")
    try:
        if _persistent() != pool[0] + EXTRA:
            pytest.fail(f"the kernel could not give {EXTRA} more 2M pages for the test")
        yield
    finally:
        nr.write_text(f"{pool[0]}\n")


def _attack(store: Store, name: str, normal_mib: int, pages: int) -> tuple[int, list[str]]:
    cmd = ["python3", "-c", _ATTACK, str(normal_mib), str(pages)]
    argv = ops.exec_argv(name, "head0", cmd, store)
    r = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False
    )
    return r.returncode, r.stdout.split()


def test_normal_plus_hugepage_memory_stays_within_the_node(
    spare: None, store: Store, tmp_path: Path
) -> None:
    image_ready()
    name = f"hm{os.getpid() % 10000}"
    _up(_spec(tmp_path, name), store, HUGE_MIB // 2)
    limits = cgroups.read_node_limits(name, "head0")
    assert limits["memory_limit"] == NORMAL_MIB << 20
    assert limits["hugetlb"]["2048kB"]["limit"] == HUGE_MIB << 20
    m = manager(HOST)
    parent = m.dir("hugetlb", cgroups.cluster_path(name))
    assert parent is not None
    caps = {f.name: int(f.read_text()) for f in parent.glob(f"hugetlb.*.{m.HUGETLB_MAX}")}
    assert caps[f"hugetlb.2MB.{m.HUGETLB_MAX}"] == HUGE_MIB << 20
    assert all(v == 0 for k, v in caps.items() if not k.startswith("hugetlb.2MB.")), caps

    # What the node was given it can use: most of its normal memory, all its pages.
    rc, said = _attack(store, name, NORMAL_MIB - 64, HUGE_MIB // 2)
    assert (rc, said) == (0, ["normal", "huge"]), f"the node could not use its own memory: {rc}"

    # Normal memory near the node's, then hugepages past it: refused although
    # the pool has the pages free (ENOMEM at mmap, or SIGBUS at the touch).
    pages = HUGE_MIB // 2 + EXTRA // 2  # 320 MiB + 256 MiB: past the node's 512
    assert _read("free_hugepages") >= pages, "the pool, not the limit, would refuse"
    rc, said = _attack(store, name, NORMAL_MIB - 64, pages)
    assert said == ["normal"] and rc != 0, f"normal + huge past {NODE_MIB} MiB: {rc} {said}"

    # Normal memory past memory - hugepage_memory: the node's memory limit stops it.
    rc, said = _attack(store, name, NODE_MIB - 48, 0)
    assert said == [] and rc != 0, f"{NODE_MIB - 48} MiB of normal memory: {rc} {said}"
    rc, said = _attack(store, name, NORMAL_MIB - 64, 0)  # and the node lives on
    assert (rc, said) == (0, ["normal"])
    lifecycle.down(name, store)

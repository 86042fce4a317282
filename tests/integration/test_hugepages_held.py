"""Hugepages a container cluster holds stay its own (issue 17, points 1 and 8).

A container cluster's pages sit free in the pool until its programs map them;
a second cluster must not count them as free, and a scale down returns what
it no longer holds. Every test puts the 2M pool of NUMA node 0 back to what it
was, even when it fails (after the clusters are torn down).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.host.hugepages import pool_dir
from hpvc.store import Store
from tests.helpers import requires
from tests.integration.test_cluster import image_ready
from tests.integration.test_cluster import store as store  # the fixture

SIZE = 2048  # KiB
PAGES = 128  # per node: 256 MiB of 2M pages (its hugepage_memory)
# Each node: its pages plus the normal memory a container node keeps beside them.
NODE = '[[nodes]]\nrole = "{role}"\ncount = {count}\nvcpus = 1\nmemory = "320MiB"\n' + (
    f'hugepage_memory = "{PAGES * SIZE // 1024}MiB"\n'
)


def _read(name: str) -> int:
    return int((pool_dir(0, SIZE) / name).read_text())


def _persistent() -> int:
    return _read("nr_hugepages") - _read("surplus_hugepages")


@pytest.fixture
def pool() -> Iterator[tuple[int, int]]:
    """(persistent pages, free pages) of the pool before the test; put back after.

    Requested before ``store`` so that it is torn down after the clusters are."""
    requires("root", "crun", "ip")
    if not pool_dir(0, SIZE).is_dir():
        pytest.skip("this host has no 2M hugepage pool on node 0")
    before = (_persistent(), _read("free_hugepages"))
    yield before
    now = _persistent()
    if now > before[0]:  # a failed test's pages: give them back, then fail
        (pool_dir(0, SIZE) / "nr_hugepages").write_text(f"{before[0]}\n")
    assert now == before[0], f"2M pool left at {now} pages, was {before[0]}"


def _spec(tmp_path: Path, name: str, subnet: int, computes: int = 0) -> str:
    p = tmp_path / f"{name}.toml"
    computes_group = NODE.format(role="compute", count=computes) if computes else ""
    p.write_text(
        f'name = "{name}"\nkind = "container"\n'
        f'[network]\nsubnet = "10.{215 + subnet}.{os.getpid() % 250}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "2M"\npartition = "commodity"\n'
        + NODE.format(role="head", count=1)
        + computes_group
    )
    return str(p)


def _up(spec: str, store: Store, need: int) -> None:
    """``up``, or a skip when the kernel cannot give the pages now."""
    try:
        lifecycle.up(spec, store)
    except Exception as e:
        if "kernel gave" in str(e):
            pytest.skip(f"no {need} free 2M pages on this host now: {e}")
        raise


# Map and touch N 2M pages (MAP_HUGETLB): exit 0, or the error.
_MAP = (
    "import mmap, sys, time; n = int(sys.argv[1]) << 21;"
    " m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000);"
    " [m.__setitem__(i, 1) for i in range(0, n, 1 << 21)];"
    " open('/tmp/mapped', 'w').close(); time.sleep(float(sys.argv[2]))"
)


def _map_in(store: Store, cluster: str, node: str, pages: int, hold: float = 0) -> int:
    argv = ["python3", "-c", _MAP, str(pages), str(hold)]
    return ops.exec_node(cluster, node, argv, store)


def test_a_later_cluster_leaves_the_first_ones_pages(
    pool: tuple[int, int], store: Store, tmp_path: Path
) -> None:
    image_ready()
    before, free0 = pool
    a, b = f"hpa{os.getpid() % 10000}", f"hpb{os.getpid() % 10000}"
    _up(_spec(tmp_path, a, 0), store, PAGES)
    assert _persistent() == before + max(0, PAGES - free0)
    free_a = _read("free_hugepages")  # a's pages among them: free, unmapped
    _up(_spec(tmp_path, b, 1), store, PAGES)
    (h,) = store.get(b).the_plan().hosts[0].hugepages
    assert h.free == free_a - PAGES, "b's plan counted a's unmapped pages as free"
    assert h.grow == max(0, PAGES - h.free)
    assert _persistent() == before + max(0, 2 * PAGES - free0)

    # b's program maps all of b's pages and keeps them; a's still maps all of a's.
    holder = subprocess.Popen(
        lifecycle_exec(store, b, "head0", PAGES, 120), stdin=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while ops.exec_node(b, "head0", ["test", "-e", "/tmp/mapped"], store) != 0:
            assert holder.poll() is None, f"b could not map its own {PAGES} pages"
            assert time.monotonic() < deadline, "b's program never mapped its pages"
            time.sleep(0.5)
        assert _map_in(store, a, "head0", PAGES) == 0, "a's pages were given to b"
    finally:
        holder.kill()
        holder.wait()
    lifecycle.down(b, store)
    lifecycle.down(a, store)
    assert _persistent() == before


def lifecycle_exec(store: Store, cluster: str, node: str, pages: int, hold: float) -> list[str]:
    """The argv of ``hpvc exec`` mapping ``pages`` in ``node`` and holding them."""
    return ops.exec_argv(cluster, node, ["python3", "-c", _MAP, str(pages), str(hold)], store)


@pytest.fixture(params=[0, PAGES], ids=["pool-as-found", "free-pages-before"])
def spare(request: pytest.FixtureRequest, pool: tuple[int, int]) -> Iterator[tuple[int, int]]:
    """The pool as found, or with PAGES more free pages that were there before the
    cluster (some other user's), so the cluster takes those before it grows the pool."""
    extra = int(request.param)
    if extra == 0:
        yield pool
        return
    nr = pool_dir(0, SIZE) / "nr_hugepages"
    nr.write_text(f"{pool[0] + extra}\n")
    try:
        if _persistent() != pool[0] + extra:
            pytest.skip(f"the kernel cannot give {extra} 2M pages now")
        yield _persistent(), _read("free_hugepages")
    finally:
        nr.write_text(f"{pool[0]}\n")


def test_scale_down_gives_back_what_the_cluster_no_longer_holds(
    spare: tuple[int, int], store: Store, tmp_path: Path
) -> None:
    """Twice up and down: each scale down returns the pages that scale up grew, and
    never pages that were free before the cluster came (a failing CI run found that)."""
    image_ready()
    before, free0 = spare
    name = f"hps{os.getpid() % 10000}"
    _up(_spec(tmp_path, name, 2, computes=1), store, 2 * PAGES)

    def expect(nodes: int) -> int:
        return before + max(0, nodes * PAGES - free0)

    assert _persistent() == expect(2)
    for _ in range(2):
        lifecycle.scale(name, {"compute": 3}, store)
        assert _persistent() == expect(4)
        assert _map_in(store, name, "compute2", PAGES) == 0
        lifecycle.scale(name, {"compute": 1}, store)
        assert _persistent() == expect(2), "scaling down left the pool grown"
    lifecycle.down(name, store)
    assert _persistent() == before

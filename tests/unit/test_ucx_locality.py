"""MPI between co-resident VM guests over the ivshmem region, hpvc's side (issue 29):
which image gets the UCX module (``hpvc.image.ucx``), which transport each pair of
a job's nodes uses and what environment the ranks get (``hpvc.cluster.ucx``), the
module's place in the base disk, and the guest init's part (``native/guest/init.c``)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hpvc.cluster import ucx
from hpvc.host import ivshmem
from hpvc.host.journal import Journal
from hpvc.image import ucx as image_ucx
from hpvc.image.guest import NATIVE_DIR
from tests.unit.test_render import make_node, make_plan

STATUS = """Package: libc6
Status: install ok installed
Version: 2.36-9+deb12u4

Package: libucx0
Status: install ok installed
Architecture: amd64
Version: {version}

Package: other
Status: install ok installed
Version: 9.9
"""


def rootfs_with_ucx(tmp_path: Path, version: str | None) -> Path:
    root = tmp_path / "rootfs"
    (root / "var/lib/dpkg").mkdir(parents=True)
    text = STATUS.format(version=version) if version else "Package: libc6\nVersion: 2.36\n"
    (root / "var/lib/dpkg/status").write_text(text)
    return root


def sources(tmp_path: Path) -> Path:
    src = tmp_path / "native-ucx"
    src.mkdir()
    (src / "Makefile").write_text("all:\n")
    return src


def test_the_images_ucx_version_comes_from_its_dpkg_status(tmp_path: Path) -> None:
    assert image_ucx.image_ucx_version(rootfs_with_ucx(tmp_path, "1.13.1-1")) == "1.13.1"
    assert image_ucx.image_ucx_version(rootfs_with_ucx(tmp_path / "b", None)) == ""
    assert image_ucx.image_ucx_version(tmp_path / "no-such-root") == ""


def test_only_the_ucx_the_module_is_built_for_gets_it(tmp_path: Path) -> None:
    src = sources(tmp_path)
    ok = image_ucx.verdict(rootfs_with_ucx(tmp_path / "a", "1.13.1-1"), src)
    assert ok == image_ucx.Verdict(True, "1.13.1", "")
    assert "libuct_ivshmem.so in /usr/local/lib/hpvc/ucx" in ok.describe("hpc")

    other = image_ucx.verdict(rootfs_with_ucx(tmp_path / "b", "1.15.0-2"), src)
    assert not other.ok and other.image_ucx == "1.15.0"
    assert other.describe("imported") == (
        "image imported: no libuct_ivshmem.so in its guests:"
        " the image's UCX is 1.15.0, the module is built for UCX 1.13.1"
    )
    none = image_ucx.verdict(rootfs_with_ucx(tmp_path / "c", None), src)
    assert not none.ok and "has no UCX" in none.why
    unbuilt = image_ucx.verdict(rootfs_with_ucx(tmp_path / "d", "1.13.1-1"), tmp_path / "x")
    assert not unbuilt.ok and "no module sources" in unbuilt.why


def test_a_failing_module_build_is_one_error_naming_make(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "Makefile").write_text("all:\n\t@echo no UCX source here >&2; exit 3\n")
    with pytest.raises(image_ucx.HpvcError, match="no UCX source here"):
        image_ucx.compile_module(tmp_path, src)


def vm_plan(n: int = 3, other_host: tuple[int, ...] = ()):  # type: ignore[no-untyped-def]
    nodes = [make_node(f"compute{i}", i) for i in range(n)]
    nodes = [dataclasses.replace(x, host="hostB") if i in other_host else x
             for i, x in enumerate(nodes)]  # fmt: skip
    return make_plan(*nodes)


OK = image_ucx.Verdict(True, "1.13.1", "")


def test_pairs_on_the_region_use_it_the_rest_tcp() -> None:
    plan = vm_plan(3, other_host=(2,))
    regions = ucx.sharing(plan, "7")
    assert regions == {"compute0": "7", "compute1": "7"}  # hostA is the plan's first host
    a, b, c = plan.nodes
    assert ucx.pairs([(a, 2), (b, 1), (c, 1)], regions) == [
        "ranks 0-1 (compute0) among themselves: sm",
        "ranks 0-1 (compute0) <-> rank 2 (compute1): ivshmem",
        "ranks 0-1 (compute0) <-> rank 3 (compute2): tcp",
        "rank 2 (compute1) <-> rank 3 (compute2): tcp",
    ]
    assert ucx.transport("compute0", "compute1", {"compute0": "1", "compute1": "2"}) == "tcp"
    assert ucx.sharing(plan, None) == {}


def test_co_resident_guests_get_ucx_over_the_region_without_asking() -> None:
    plan = vm_plan(2)
    layout = [(plan.nodes[0], 1), (plan.nodes[1], 1)]
    choice = ucx.choose(layout, ucx.sharing(plan, "3"), OK, "hpc")
    assert choice.chosen
    assert choice.env == {
        "OMPI_MCA_pml": "ucx",
        "OMPI_MCA_pml_ucx_tls": "any",
        "OMPI_MCA_pml_ucx_devices": "any",
        "LD_PRELOAD": "/usr/local/lib/hpvc/ucx/libuct_ivshmem.so",
        "UCX_TLS": "self,sm,ivshmem,tcp",
        "UCX_MAX_RNDV_LANES": "0",
    }
    assert "UCX_LOG_LEVEL=info" not in choice.env_list()
    assert "rank 0 (compute0) <-> rank 1 (compute1): ivshmem" in choice.lines
    loud = ucx.choose(layout, ucx.sharing(plan, "3"), OK, "hpc", verbose=True)
    assert loud.env["UCX_LOG_LEVEL"] == "info" and loud.env["UCX_LOG_FILE"] == "stderr"


def test_no_region_or_no_module_leaves_mpi_alone() -> None:
    plan = vm_plan(2)
    layout = [(plan.nodes[0], 1), (plan.nodes[1], 1)]
    none = ucx.choose(layout, {}, None, "hpc")
    assert none.env == {} and "no ivshmem region" in none.lines[0]
    # one job node on the region is no pair on it
    alone = ucx.choose([(plan.nodes[0], 2)], ucx.sharing(plan, "3"), None, "hpc")
    assert not alone.chosen
    old = image_ucx.Verdict(False, "1.12.0", "the image's UCX is 1.12.0")
    bad = ucx.choose(layout, ucx.sharing(plan, "3"), old, "imported")
    assert bad.env == {}
    assert bad.lines[0].startswith("image imported: no libuct_ivshmem.so")
    assert "cannot use it: TCP" in bad.lines[1]


def test_the_region_is_the_one_the_cluster_holds(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    state = tmp_path / "state"
    (tmp_path / "shm").mkdir()
    ivshmem.allocate(journal, state, "other", 1, None, shm_dir=tmp_path / "shm")
    ivshmem.allocate(journal, state, "mine", 1, None, shm_dir=tmp_path / "shm")
    try:
        assert ucx.region_of(state, "mine") == "1"
        assert ucx.region_of(state, "other") == "0"
        assert ucx.region_of(state, "nobody") is None
        plan = vm_plan(2)
        choice = ucx.for_job(state, plan, [(n, 1) for n in plan.nodes])  # cluster "demo"
        assert not choice.chosen  # "demo" holds no region
    finally:
        assert journal.undo_all() == []


def test_the_guest_init_gives_the_region_to_root_alone() -> None:
    """What init.c does with the device, read from its source (a guest boot checks
    it for real: tests/integration/test_vm_ucx_ivshmem.py)."""
    src = (NATIVE_DIR / "init.c").read_text()
    body = src[src.index("static void expose_one_ivshmem") :]
    body = body[: body.index("\n}\n")]
    assert re.search(r'"resource2", "resource2_wc"', body)
    assert "chown(path, 0, 0)" in body and "chmod(path, 0600)" in body
    assert 'write(fd, "1", 1)' in body  # the device enabled: no one writes sysfs later
    main = src[src.index("static int guest_main") :]
    assert main.index("expose_ivshmem();") < main.index("start_agent();")

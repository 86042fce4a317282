"""ivshmem regions: unique ids under concurrent allocators, undo, rendering, the guest tool.

No root: every region lives in a temporary "shm" directory and state root; the
guest tool (hpvc-shm) runs on the host against a fake sysfs tree whose
``resource2`` is a plain file.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from hpvc.backends.vm import guest as vm
from hpvc.errors import HpvcError, InputError
from hpvc.host import ivshmem
from hpvc.host.journal import Journal
from hpvc.image import guest, guest_disk
from hpvc.render import qemu_argv, render_domain_xml
from hpvc.render.libvirt import IVSHMEM_SLOT
from hpvc.render.qemu import ivshmem_args
from hpvc.store import Store
from tests.helpers import requires
from tests.unit.test_render import ctx, hand_vm_plan, make_node, make_plan

MiB = 1 << 20


def alloc(tmp: Path, cluster: str, mib: int = 1, journal: Journal | None = None) -> Path:
    j = journal or Journal(tmp / "journals" / f"{cluster}.jsonl")
    return ivshmem.allocate(j, tmp / "state", cluster, mib, None, shm_dir=tmp / "shm")


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    (tmp_path / "shm").mkdir()
    return tmp_path


def region_id(path: Path) -> int:
    return int(path.name.removeprefix(ivshmem.PREFIX))


def regions(tmp: Path) -> Path:
    """The state root's region folder in the test's shm directory."""
    return Path((tmp / "state" / ivshmem.DIR_RECORD).read_text().strip())


def shm_files(tmp: Path) -> list[Path]:
    """Every file under the test's shm directory, folders left out."""
    return sorted(p for p in (tmp / "shm").rglob("*") if not p.is_dir())


# ---- allocation ------------------------------------------------------------------


def test_allocate_makes_a_sized_file_and_records_its_id(tmp: Path) -> None:
    j = Journal(tmp / "j.jsonl")
    path = alloc(tmp, "demo", 4, j)
    where = regions(tmp)
    assert path == where / "hpvc-ivshmem-0"
    assert where.parent == tmp / "shm" and where.name.startswith(ivshmem.DIR_PREFIX)
    assert where.stat().st_mode & 0o777 == 0o700 and where.stat().st_uid == os.geteuid()
    assert path.stat().st_size == 4 * MiB and path.stat().st_mode & 0o777 == 0o600
    assert path.stat().st_blocks * 512 >= 4 * MiB  # preallocated, not sparse
    assert (tmp / "state" / "ivshmem" / "0").read_text() == f"demo\n{path}\n"
    assert (tmp / "state" / "ivshmem.lock").exists()
    assert ivshmem.live_ids(tmp / "state") == {0: ("demo", str(path))}
    assert ivshmem.find(tmp / "state", "demo") == path
    assert ivshmem.find(tmp / "state", "other") is None
    [change] = j.entries()
    assert change.kind == "ivshmem" and change.args["id"] == 0
    assert change.args["path"] == str(path) and change.args["cluster"] == "demo"


@pytest.mark.parametrize("mib", [0, 3, 96, 1 << 17, -4])
def test_sizes_that_are_no_pci_bar_are_refused(tmp: Path, mib: int) -> None:
    with pytest.raises(InputError, match="power of two"):
        alloc(tmp, "demo", mib)
    assert not list((tmp / "shm").iterdir())


def test_ids_are_unique_under_concurrent_threads(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Widen the window between picking an id and taking it: only the lock keeps
    # two allocators from picking the same one.
    pick = ivshmem._free_id

    def slow_pick(state_root: Path, dirs: tuple[Path, ...]) -> int:
        n = pick(state_root, dirs)
        time.sleep(0.002)
        return n

    monkeypatch.setattr(ivshmem, "_free_id", slow_pick)
    threads, per = 8, 4
    start = threading.Barrier(threads)
    got: list[Path] = []
    errors: list[BaseException] = []

    def work(i: int) -> None:
        start.wait()
        try:
            got.extend(alloc(tmp, f"c{i}-{k}") for k in range(per))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    assert sorted(region_id(p) for p in got) == list(range(threads * per))
    owners = ivshmem.live_ids(tmp / "state")
    assert sorted(c for c, _ in owners.values()) == sorted(
        f"c{i}-{k}" for i in range(threads) for k in range(per)
    )
    assert all(Path(path).stat().st_size == MiB for _, path in owners.values())


def _allocate_in_child(tmp: str, i: int) -> list[int]:
    return [region_id(alloc(Path(tmp), f"p{i}-{k}")) for k in range(5)]


def test_ids_are_unique_across_processes(tmp: Path) -> None:
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(4, mp_context=spawn) as pool:
        ids = [n for part in pool.map(_allocate_in_child, [str(tmp)] * 4, range(4)) for n in part]
    assert sorted(ids) == list(range(20))
    assert len(shm_files(tmp)) == 20
    assert len(list((tmp / "shm").iterdir())) == 1  # one region folder for them all


def test_undo_frees_the_id_and_the_file_and_a_freed_id_is_given_again(tmp: Path) -> None:
    ja, jb = Journal(tmp / "a.jsonl"), Journal(tmp / "b.jsonl")
    a, b = alloc(tmp, "a", 1, ja), alloc(tmp, "b", 1, jb)
    assert (region_id(a), region_id(b)) == (0, 1)
    assert ja.undo_all() == []
    assert not a.exists() and b.exists()
    assert ivshmem.live_ids(tmp / "state") == {1: ("b", str(b))}
    assert ja.undo_all() == []  # idempotent: nothing left
    c = alloc(tmp, "c")
    assert region_id(c) == 0  # freed, so given again; b's live id 1 never is
    assert region_id(alloc(tmp, "d")) == 2


def test_undo_leaves_an_id_that_another_cluster_holds_now(tmp: Path) -> None:
    ja = Journal(tmp / "a.jsonl")
    a = alloc(tmp, "a", 1, ja)
    stale = ja.entries()
    ja.undo_all()
    c = alloc(tmp, "c")  # takes id 0 again
    assert region_id(c) == region_id(a) == 0
    old = Journal(tmp / "stale.jsonl")  # a's journal replayed after the fact
    for change in stale:
        old.record(change.kind, **change.args)
    assert old.undo_all() == []
    assert c.exists() and ivshmem.live_ids(tmp / "state") == {0: ("c", str(c))}


def test_undo_before_the_id_was_taken_removes_nothing(tmp: Path) -> None:
    # A crash right after the journal record: no id file, and a file of the same
    # name that is not ours (another hpvc state directory) stays.
    j = Journal(tmp / "j.jsonl")
    foreign = tmp / "shm" / "hpvc-ivshmem-0"
    foreign.write_text("not ours")
    record = tmp / "state" / "ivshmem" / "0"
    j.record(
        "ivshmem",
        id=0,
        cluster="demo",
        path=str(foreign),
        record=str(record),
        lock=str(tmp / "state" / "ivshmem.lock"),
    )
    (tmp / "state").mkdir()
    assert j.undo_all() == []
    assert foreign.read_text() == "not ours"


def test_files_squatting_every_old_region_name_take_no_id(tmp: Path) -> None:
    # Issue 25 item 9: a user made /dev/shm/hpvc-ivshmem-{0..4095}, and no region was
    # left. Now regions are in a folder of the state root's own that no one can name first.
    for i in range(ivshmem.MAX_IDS):
        (tmp / "shm" / f"{ivshmem.PREFIX}{i}").write_text("a user's")
    j = Journal(tmp / "j.jsonl")
    path = alloc(tmp, "demo", 1, j)
    assert region_id(path) == 0 and path.parent == regions(tmp)
    assert path.parent.parent == tmp / "shm"
    assert path.stat().st_size == MiB
    j.undo_all()
    assert not path.exists() and not path.parent.exists()  # the folder went with it
    assert ivshmem.live_ids(tmp / "state") == {}
    assert len(shm_files(tmp)) == ivshmem.MAX_IDS  # the user's files are left alone
    assert (tmp / "shm" / f"{ivshmem.PREFIX}0").read_text() == "a user's"


@pytest.mark.parametrize("how", ["gone", "open", "link", "file"])
def test_a_recorded_folder_that_is_not_private_is_not_used(tmp: Path, how: str) -> None:
    first = alloc(tmp, "a")
    where = first.parent
    theirs = tmp / "elsewhere"
    theirs.mkdir()
    for f in where.iterdir():
        f.unlink()
    where.rmdir()
    if how == "open":  # someone made a folder of that name, open to others
        where.mkdir(0o755)
        where.chmod(0o755)
    elif how == "link":  # or a link to a folder of theirs
        where.symlink_to(theirs)
    elif how == "file":
        where.write_text("x")
    second = alloc(tmp, "b")
    assert second.parent != where and second.parent == regions(tmp)
    assert second.parent.stat().st_mode & 0o777 == 0o700
    assert not list(theirs.iterdir())


def test_undo_of_an_older_journal_frees_its_dev_shm_file(tmp: Path) -> None:
    # An older hpvc journaled regions right in /dev/shm: the same undo frees them
    # (and never removes the shm folder itself).
    state, old = tmp / "state", tmp / "shm" / "hpvc-ivshmem-7"
    (state / "ivshmem").mkdir(parents=True)
    old.write_text("region")
    (state / "ivshmem" / "7").write_text(f"demo\n{old}\n")
    j = Journal(tmp / "j.jsonl")
    lock = str(state / "ivshmem.lock")
    j.record(
        "ivshmem",
        id=7,
        cluster="demo",
        path=str(old),
        record=str(state / "ivshmem" / "7"),
        lock=lock,
    )
    assert j.undo_all() == []
    assert not old.exists() and (tmp / "shm").is_dir()
    assert ivshmem.live_ids(state) == {}


def test_a_race_with_another_state_root_moves_on_to_the_next_id(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create = ivshmem._create

    def racing(path: Path, size: int) -> bool:
        if path.name == "hpvc-ivshmem-0":  # someone else makes it first
            path.write_text("theirs")
        return create(path, size)

    monkeypatch.setattr(ivshmem, "_create", racing)
    j = Journal(tmp / "j.jsonl")
    path = alloc(tmp, "demo", 1, j)
    assert region_id(path) == 1
    assert ivshmem.live_ids(tmp / "state") == {1: ("demo", str(path))}
    assert j.undo_all() == []
    assert (path.parent / "hpvc-ivshmem-0").read_text() == "theirs"
    assert not path.exists()


def test_a_failed_preallocation_leaves_no_id_and_no_file(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ivshmem.os, "posix_fallocate", full)
    with pytest.raises(HpvcError, match="no free huge pages or memory"):
        alloc(tmp, "demo")
    assert not list((tmp / "shm").iterdir())  # nor the region folder made for it
    assert ivshmem.live_ids(tmp / "state") == {}


def test_hugetlbfs_is_used_when_the_size_is_a_multiple_of_its_page(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pages = tmp / "hugepages"
    pages.mkdir()
    monkeypatch.setattr(ivshmem, "page_size", lambda _d: 2 * MiB)
    j = Journal(tmp / "j.jsonl")
    huge = ivshmem.allocate(j, tmp / "state", "a", 4, pages, shm_dir=tmp / "shm")
    small = ivshmem.allocate(j, tmp / "state", "b", 1, pages, shm_dir=tmp / "shm")
    assert huge == pages / "hpvc-ivshmem-0"
    assert small == regions(tmp) / "hpvc-ivshmem-1"
    assert j.undo_all() == []
    assert not list(pages.iterdir()) and not list((tmp / "shm").iterdir())


# ---- wiring: which clusters get a region ------------------------------------------


def test_ivshmem_for_only_with_shm_locality_and_two_nodes_on_the_host(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ivshmem, "SHM_DIR", tmp / "shm")
    store, j = Store(tmp / "state"), Journal(tmp / "j.jsonl")
    two = hand_vm_plan()
    one = make_plan(make_node("compute0", 0))
    assert vm.ivshmem_for(store, two, j, "none") is None
    assert vm.ivshmem_for(store, one, j, "shm") is None
    assert vm.ivshmem_for(store, two, j, "shm", host="elsewhere") is None
    assert j.entries() == []
    got = vm.ivshmem_for(store, two, j, "shm", size_mib=2)
    assert got == (str(regions(tmp) / "hpvc-ivshmem-0"), 2)
    assert vm.ivshmem_for(store, two, j, "shm", size_mib=2) == got  # scale finds it again
    assert len(j.entries()) == 1
    assert j.undo_all() == []
    assert not list((tmp / "shm").iterdir())


# ---- rendering ---------------------------------------------------------------------

SHM = ("/dev/shm/hpvc-ivshmem.k2x9q0ab/hpvc-ivshmem-3", 64)


def test_qemu_argv_maps_the_region_shared() -> None:
    plan = hand_vm_plan()
    argv = qemu_argv(plan, plan.node("compute0"), ctx(ivshmem=SHM))
    i = argv.index("ivshmem-plain,memdev=ivshmem0,master=on")  # migratable: hpvc checkpoint
    assert argv[i - 3 : i + 1] == [
        "-object",
        f"memory-backend-file,id=ivshmem0,mem-path={SHM[0]},size=64M,share=on",
        "-device",
        "ivshmem-plain,memdev=ivshmem0,master=on",
    ]
    plain = qemu_argv(plan, plan.node("compute0"), ctx())
    assert argv[: i - 3] + argv[i + 1 :] == plain


def test_qemu_argv_escapes_commas_in_the_path() -> None:
    plan = hand_vm_plan()
    argv = qemu_argv(plan, plan.node("head0"), ctx(ivshmem=("/x,y/hpvc-ivshmem-0", 1)))
    assert "memory-backend-file,id=ivshmem0,mem-path=/x,,y/hpvc-ivshmem-0,size=1M,share=on" in argv


def test_domain_xml_maps_the_region_by_its_full_path(tmp_path: Path) -> None:
    # Not <shmem name=...>: libvirt maps that to /dev/shm/<name>, a name any user
    # can take first; the region's own path goes to QEMU as the direct backend gives it.
    plan = hand_vm_plan()
    xml = render_domain_xml(plan, plan.node("compute0"), ctx(ivshmem=SHM))
    dom = ET.fromstring(xml)
    assert not dom.findall("devices/shmem")
    ns = "{http://libvirt.org/schemas/domain/qemu/1.0}"
    args = [a.get("value") for a in dom.findall(f"{ns}commandline/{ns}arg")]
    direct = ivshmem_args(ctx(ivshmem=SHM))
    assert args[:3] == direct[:3]
    # A fixed slot libvirt's own layout (root ports from slot 1 up) does not reach:
    # unplaced, QEMU put the device in slot 1 and refused libvirt's first root port.
    assert args[3] == f"{direct[3]},bus=pcie.0,addr={IVSHMEM_SLOT}"
    assert int(IVSHMEM_SLOT, 16) >= 0x10
    assert "<address" not in xml  # no libvirt device is placed by hand in that slot
    assert f"mem-path={SHM[0]}," in args[1]
    commas = render_domain_xml(plan, plan.node("head0"), ctx(ivshmem=("/x,y/r", 1)))
    assert "mem-path=/x,,y/r,size=1M" in commas
    plain = render_domain_xml(plan, plan.node("compute0"), ctx())
    assert "shmem" not in plain and "commandline" not in plain
    requires("virt-xml-validate")
    for name in ("compute0", "head0", "compute1"):
        path = tmp_path / f"{name}.xml"
        path.write_text(render_domain_xml(plan, plan.node(name), ctx("tcg", ivshmem=SHM)))
        r = subprocess.run(
            ["virt-xml-validate", str(path), "domain"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stdout + r.stderr


# ---- the guest tool and the base disk ----------------------------------------------


@pytest.fixture(scope="module")
def shm_tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shmtool")
    done = subprocess.run(
        ["make", "-s", "-C", str(guest.NATIVE_DIR), f"OUT={out}", f"{out}/hpvc-shm"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return out / "hpvc-shm"


def fake_sysfs(root: Path, size: int = MiB) -> Path:
    """Two PCI devices, one of them ivshmem whose BAR 2 is a plain file."""
    devices = root / "bus" / "pci" / "devices"
    for addr, dev in (("0000:00:02.0", "0x1000"), ("0000:00:03.0", "0x1110")):
        (devices / addr).mkdir(parents=True)
        (devices / addr / "vendor").write_text("0x1af4\n")
        (devices / addr / "device").write_text(f"{dev}\n")
    bar = devices / "0000:00:03.0" / "resource2"
    bar.write_bytes(b"")
    os.truncate(bar, size)
    return bar


def run_tool(tool: Path, sysfs: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "HPVC_SHM_SYSFS": str(sysfs)}
    return subprocess.run([str(tool), *args], capture_output=True, env=env)


def test_shm_tool_writes_reads_and_tells_the_bar(shm_tool: Path, tmp_path: Path) -> None:
    bar = fake_sysfs(tmp_path / "sys")
    info = run_tool(shm_tool, tmp_path / "sys", "info")
    assert (info.returncode, info.stdout) == (0, b"pci=0000:00:03.0 size=1048576\n")
    assert run_tool(shm_tool, tmp_path / "sys", "write", "0x100", "hello-from-a").returncode == 0
    assert bar.read_bytes()[0x100 : 0x100 + 12] == b"hello-from-a"
    read = run_tool(shm_tool, tmp_path / "sys", "read", "256", "12")
    assert (read.returncode, read.stdout, read.stderr) == (0, b"hello-from-a\n", b"")
    last = run_tool(shm_tool, tmp_path / "sys", "read", str(MiB - 1), "1")
    assert (last.returncode, last.stdout) == (0, b"\0\n")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ((), 2, "usage: hpvc-shm info"),
        (("read", "0"), 2, "usage:"),
        (("read", "-1", "2"), 2, "bad offset -1"),
        (("read", "0", "12x"), 2, "bad length 12x"),
        (("read", str(MiB - 4), "5"), 2, "outside the 1048576-byte region"),
        (("write", str(MiB), "x"), 2, "outside the 1048576-byte region"),
        (("read", "99999999999999999999999", "1"), 2, "bad offset"),
    ],
)
def test_shm_tool_errors_are_one_line_with_an_exit_code(
    shm_tool: Path, tmp_path: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    fake_sysfs(tmp_path / "sys")
    done = run_tool(shm_tool, tmp_path / "sys", *args)
    err = done.stderr.decode()
    assert done.returncode == code and done.stdout == b""
    assert err.startswith("hpvc-shm: ") and err.count("\n") == 1 and message in err


def test_shm_tool_without_the_device_fails(shm_tool: Path, tmp_path: Path) -> None:
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    done = run_tool(shm_tool, tmp_path / "sys", "info")
    assert done.returncode == 1
    assert done.stderr.decode() == (
        f"hpvc-shm: no ivshmem-plain device (1af4:1110) under {tmp_path}/sys/bus/pci/devices\n"
    )


def test_the_tool_source_is_in_the_guest_cache_key() -> None:
    assert "shmtool.c" in guest.init_sources()


def test_the_base_disk_holds_the_tool(shm_tool: Path, tmp_path: Path) -> None:
    if not (shutil.which("debugfs") or Path("/sbin/debugfs").exists()):
        pytest.skip("debugfs not installed (e2fsprogs)")
    rootfs = tmp_path / "rootfs"
    (rootfs / "sbin").mkdir(parents=True)  # no /usr/local/sbin: made in the disk only
    init = tmp_path / "hpvc-init"
    init.write_bytes(b"\x7fELF init")
    disk = tmp_path / "disk.raw"
    guest_disk.make_base_disk(rootfs, init, disk, tmp_path, shm_tool)
    debugfs = shutil.which("debugfs") or "/sbin/debugfs"
    done = subprocess.run(
        [debugfs, "-R", f"stat /{guest_disk.SHM_TOOL_PATH}", str(disk)],
        capture_output=True,
        text=True,
    )
    assert f"Size: {shm_tool.stat().st_size}" in done.stdout, done.stdout + done.stderr
    assert "Mode:  0755" in done.stdout
    assert not (rootfs / "usr").exists()  # the rootfs itself is untouched

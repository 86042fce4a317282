"""Hugepage pools on a fake kernel: exact give-back across clusters, half-way failures, mounts."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpvc.errors import HpvcError
from hpvc.host import hugepages
from hpvc.host.hugepages import ensure_hugetlbfs, grow_pool, pool_dir, pool_state
from hpvc.host.journal import Journal

SIZE = 2048


@dataclass
class Pool:
    persistent: int = 0
    surplus: int = 0
    in_use: int = 0


class FakeKernel:
    """hugetlb's arithmetic: grants up to ``capacity`` new pages; shrinking frees only
    free pages and turns pages still in use into surplus, freed when released."""

    def __init__(self, capacity: int = 1 << 20, fail_write: bool = False) -> None:
        self.capacity = capacity
        self.fail_write = fail_write
        self.pools: dict[Path, Pool] = {}

    def pool(self, d: Path) -> Pool:
        return self.pools.setdefault(d, Pool())

    def read(self, path: Path) -> int:
        p = self.pool(path.parent)
        total = p.persistent + p.surplus
        return {
            "nr_hugepages": total,
            "free_hugepages": total - p.in_use,
            "surplus_hugepages": p.surplus,
        }[path.name]

    def write(self, path: Path, value: int) -> None:
        assert path.name == "nr_hugepages"
        p = self.pool(path.parent)
        if value > p.persistent:
            back = min(p.surplus, value - p.persistent)
            p.surplus, p.persistent = p.surplus - back, p.persistent + back
            new = min(value - p.persistent, self.capacity)
            p.persistent += new
            self.capacity -= new
        else:
            free = p.persistent + p.surplus - p.in_use
            drop = min(p.persistent - value, free)
            p.persistent -= drop
            self.capacity += drop
            p.surplus += p.persistent - value
            p.persistent = value
        if self.fail_write:
            raise OSError(12, "Cannot allocate memory")

    def release(self, d: Path, n: int) -> None:
        p = self.pool(d)
        p.in_use -= n
        freed = min(p.surplus, n)
        p.surplus -= freed
        self.capacity += freed


def _sysfs(root: Path, nodes: int = 2) -> Path:
    for n in range(nodes):
        for kb in (SIZE, 1048576):
            (root / f"sys/devices/system/node/node{n}/hugepages/hugepages-{kb}kB").mkdir(
                parents=True
            )
    for kb in (SIZE, 1048576):
        (root / f"sys/kernel/mm/hugepages/hugepages-{kb}kB").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "proc/mounts").write_text("proc /proc proc rw 0 0\n")
    return root


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    k = FakeKernel()
    monkeypatch.setattr(hugepages, "_IO", k)
    return k


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return _sysfs(tmp_path / "root")


def _total(root: Path, node: int = 0) -> int:
    return pool_state(node, SIZE, root)[0]


def _set_by_hand(fake: FakeKernel, root: Path, value: int, node: int = 0) -> None:
    """Someone other than hpvc writes the pool (another tool, an administrator)."""
    fake.write(pool_dir(node, SIZE, root) / "nr_hugepages", value)


def test_grow_and_give_back(tmp_path: Path, root: Path, fake: FakeKernel) -> None:
    j = Journal(tmp_path / "j")
    grow_pool(j, 1, SIZE, 8, root)
    assert pool_state(1, SIZE, root) == (8, 8)
    assert _total(root, 0) == 0
    assert [(e.kind, e.args.get("added")) for e in j.entries()] == [
        ("hugepages", None),
        ("hugepages-added", 8),
    ]
    intent = j.entries()[0].args
    assert (intent["node"], intent["size_kib"], intent["count"], intent["before"]) == (
        1,
        SIZE,
        8,
        0,
    )
    assert j.undo_all() == []
    assert pool_state(1, SIZE, root) == (0, 0)
    assert j.entries() == []


def test_kernel_short_gives_back_at_once_and_says_why(
    tmp_path: Path, root: Path, fake: FakeKernel
) -> None:
    j = Journal(tmp_path / "j")
    _set_by_hand(fake, root, 4)
    fake.capacity = 100
    with pytest.raises(HpvcError) as e:
        grow_pool(j, 0, SIZE, 640, root)
    assert e.value.line() == (
        "node 0: asked for 640 more 2048kB pages, kernel gave 100 "
        "(free memory is fragmented or short; try again, or drop hugepages)"
    )
    assert _total(root) == 4  # the 100 went back, the 4 that were there stay
    assert [e.args.get("added") for e in j.entries()] == [None, 0]
    assert j.undo_all() == []
    assert _total(root) == 4


def test_a_failed_write_that_allocated_nothing(
    tmp_path: Path, root: Path, fake: FakeKernel
) -> None:
    j = Journal(tmp_path / "j")
    fake.capacity, fake.fail_write = 0, True
    with pytest.raises(HpvcError, match="kernel gave 0 \\(Cannot allocate memory\\)"):
        grow_pool(j, 0, SIZE, 8, root)
    assert j.undo_all() == [] and _total(root) == 0


def test_undo_gives_back_only_its_own_pages_whatever_happened_between(
    tmp_path: Path, root: Path, fake: FakeKernel
) -> None:
    a, b = Journal(tmp_path / "a"), Journal(tmp_path / "b")
    _set_by_hand(fake, root, 2)  # someone's pages before hpvc
    grow_pool(a, 0, SIZE, 8, root)  # 10
    grow_pool(b, 0, SIZE, 4, root)  # 14
    _set_by_hand(fake, root, 17)  # someone adds 3 more
    assert a.undo_all() == []
    assert _total(root) == 9  # 2 + 4 (b) + 3
    grow_pool(a, 0, SIZE, 5, root)  # a again: 14
    assert b.undo_all() == []
    assert _total(root) == 10
    _set_by_hand(fake, root, 8)  # someone takes 2 of theirs back
    assert a.undo_all() == []
    assert _total(root) == 3


def test_pages_in_use_are_not_forced_out(
    tmp_path: Path, root: Path, fake: FakeKernel, caplog: pytest.LogCaptureFixture
) -> None:
    j = Journal(tmp_path / "j")
    grow_pool(j, 0, SIZE, 8, root)
    d = pool_dir(0, SIZE, root)
    fake.pool(d).in_use = 3  # a guest still maps 3 pages
    with caplog.at_level(logging.WARNING, logger="hpvc.host.hugepages"):
        assert j.undo_all() == []
    assert "3 of them are still in use" in caplog.text
    assert fake.pool(d) == Pool(persistent=0, surplus=3, in_use=3)
    fake.release(d, 3)
    assert pool_state(0, SIZE, root) == (0, 0)


def test_crash_between_write_and_answer_takes_nothing_back(
    tmp_path: Path, root: Path, fake: FakeKernel, caplog: pytest.LogCaptureFixture
) -> None:
    j = Journal(tmp_path / "j")
    j.record("hugepages", id="x1", root=str(root), node=0, size_kib=SIZE, count=8, before=0)
    _set_by_hand(fake, root, 8)  # the write happened; hpvc died before the read-back
    with caplog.at_level(logging.WARNING, logger="hpvc.host.hugepages"):
        assert j.undo_all() == []
    assert _total(root) == 8  # maybe another cluster's: never taken
    assert "cut off" in caplog.text and "had 0 pages then and has 8 now" in caplog.text
    assert j.entries() == []


def test_crash_before_the_write_is_silent(
    tmp_path: Path, root: Path, fake: FakeKernel, caplog: pytest.LogCaptureFixture
) -> None:
    j = Journal(tmp_path / "j")
    j.record("hugepages", id="x2", root=str(root), node=0, size_kib=SIZE, count=8, before=0)
    with caplog.at_level(logging.WARNING, logger="hpvc.host.hugepages"):
        assert j.undo_all() == []
    assert caplog.text == ""


def test_a_give_back_that_changes_nothing_stays_for_a_retry(
    tmp_path: Path, root: Path, fake: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = Journal(tmp_path / "j")
    grow_pool(j, 0, SIZE, 8, root)

    def refuse(path: Path, value: int) -> None:
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(fake, "write", refuse)
    errors = j.undo_all()
    assert len(errors) == 1 and "Permission denied" in errors[0]
    # The failed step and the older intent it depends on stay (hpvc.host.journal).
    assert [e.kind for e in j.entries()] == ["hugepages", "hugepages-added"]
    monkeypatch.undo()
    monkeypatch.setattr(hugepages, "_IO", fake)
    assert j.undo_all() == []
    assert _total(root) == 0


def test_pools_without_numa_and_missing_sizes(tmp_path: Path, fake: FakeKernel) -> None:
    flat = tmp_path / "flat"
    (flat / f"sys/kernel/mm/hugepages/hugepages-{SIZE}kB").mkdir(parents=True)
    assert pool_dir(0, SIZE, flat) == flat / f"sys/kernel/mm/hugepages/hugepages-{SIZE}kB"
    with pytest.raises(HpvcError, match="node 1: 2048kB hugepages"):
        pool_dir(1, SIZE, flat)
    with pytest.raises(HpvcError, match="sizes offered: 2048kB, 1048576kB"):
        pool_dir(0, 4096, _sysfs(tmp_path / "numa"))


def test_grow_by_zero_records_nothing(tmp_path: Path, root: Path, fake: FakeKernel) -> None:
    j = Journal(tmp_path / "j")
    grow_pool(j, 0, SIZE, 0, root)
    assert j.entries() == []
    with pytest.raises(ValueError):
        grow_pool(j, 0, SIZE, -1, root)


# --- hugetlbfs -----------------------------------------------------------------------


class Mounter:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.argv: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> None:
        self.argv.append(list(argv))
        mounts = self.root / "proc/mounts"
        target = "/" + str(Path(argv[-1]).relative_to(self.root))
        if argv[0] == "mount":
            size = {"2048K": "2M", "1048576K": "1G"}[argv[argv.index("-o") + 1][9:]]
            line = f"hugetlbfs {target} hugetlbfs rw,relatime,pagesize={size} 0 0\n"
            mounts.write_text(mounts.read_text() + line)
        else:
            keep = [ln for ln in mounts.read_text().splitlines() if ln.split()[1] != target]
            mounts.write_text("\n".join(keep) + "\n")


@pytest.fixture
def mounter(root: Path, monkeypatch: pytest.MonkeyPatch) -> Mounter:
    m = Mounter(root)
    monkeypatch.setattr(hugepages, "_runner", m)
    return m


def test_hugetlbfs_mount_and_undo(tmp_path: Path, root: Path, mounter: Mounter) -> None:
    j = Journal(tmp_path / "j")
    (root / "var/lib").mkdir(parents=True)
    path = Path("/var/lib/hpvc/c1/hugepages-2M")
    ensure_hugetlbfs(j, path, SIZE, root)
    real = root / "var/lib/hpvc/c1/hugepages-2M"
    assert mounter.argv == [
        ["mount", "-t", "hugetlbfs", "-o", "pagesize=2048K", "hugetlbfs", str(real)]
    ]
    (entry,) = j.entries()
    assert (entry.kind, entry.args["path"], entry.args["fstype"]) == (
        "mount",
        str(path),
        "hugetlbfs",
    )
    assert entry.args["created"] == [str(path), "/var/lib/hpvc/c1", "/var/lib/hpvc"]
    ensure_hugetlbfs(j, path, SIZE, root)  # already there: nothing more
    assert len(mounter.argv) == 1 and len(j.entries()) == 1
    assert j.undo_all() == []
    assert mounter.argv[-1] == ["umount", "-l", str(real)]
    assert not (root / "var/lib/hpvc").exists()
    assert (root / "var/lib").is_dir()  # not ours


def test_hugetlbfs_undo_keeps_directories_with_content(
    tmp_path: Path, root: Path, mounter: Mounter
) -> None:
    j = Journal(tmp_path / "j")
    path = Path("/srv/hp")
    ensure_hugetlbfs(j, path, 1048576, root)
    assert "pagesize=1048576K" in mounter.argv[0]
    mounter(["umount", str(root / "srv/hp")])  # someone unmounted it already
    (root / "srv/hp/left").write_text("x")
    assert j.undo_all() == []
    assert mounter.argv[-1][0] == "umount" and "-l" not in mounter.argv[-1]  # only theirs
    assert (root / "srv/hp/left").exists()


def test_hugetlbfs_refuses_a_different_mount(tmp_path: Path, root: Path, mounter: Mounter) -> None:
    j = Journal(tmp_path / "j")
    mounts = root / "proc/mounts"
    mounts.write_text(mounts.read_text() + "tmpfs /mnt/x tmpfs rw 0 0\n")
    with pytest.raises(HpvcError, match="a tmpfs is mounted there"):
        ensure_hugetlbfs(j, Path("/mnt/x"), SIZE, root)
    mounts.write_text(mounts.read_text() + "hugetlbfs /mnt/y hugetlbfs rw,pagesize=1G 0 0\n")
    with pytest.raises(HpvcError, match="page size 1048576kB"):
        ensure_hugetlbfs(j, Path("/mnt/y"), SIZE, root)
    with pytest.raises(HpvcError, match="no 4096kB pages"):
        ensure_hugetlbfs(j, Path("/mnt/z"), 4096, root)
    assert j.entries() == [] and mounter.argv == []


def test_hugetlbfs_never_mounts_for_a_fake_root_by_accident(tmp_path: Path, root: Path) -> None:
    with pytest.raises(RuntimeError, match="fake root"):
        ensure_hugetlbfs(Journal(tmp_path / "j"), Path("/x"), SIZE, root)

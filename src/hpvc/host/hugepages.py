"""Hugepage pools per NUMA node: grown for a cluster, given back exactly; hugetlbfs mounts.

Bookkeeping of a grow (architecture rule 5). The kernel's interface is one absolute
number per pool (``nr_hugepages``), shared by every cluster and by anyone else on
the host, and it may grant fewer pages than asked. So hpvc never writes back an
old value: it records how many pages *it* added and, on undo, lowers the pool by
exactly that many from wherever the pool stands then. Two journal kinds:

``"hugepages"`` (the intent), written before the write:
    ``{id, root, node, size_kib, count, before}``.
``"hugepages-added"`` (the answer), written once the kernel's answer is read back:
    ``{id, root, node, size_kib, added}``; ``added`` is ``count``, or ``0`` when
    the kernel gave fewer pages and hpvc already gave those back at once.

Undo runs newest first, so an answer is undone before its intent:

* the answer's undo gives back ``added`` pages (target = persistent pages now -
  added, floor 0) and marks its ``id`` settled;
* the intent's undo does nothing when its answer was undone in the same pass. An
  intent without an answer means hpvc stopped between the write and the read-back:
  how many pages that write added is unknowable once others may have changed the
  pool, so nothing is taken back (never another cluster's pages); if the pool now
  stands above ``before`` a warning gives the numbers to check by hand.

Pages are counted as the kernel's *persistent* pages (``nr_hugepages`` -
``surplus_hugepages``), which is what a per-node write sets. When giving back,
the kernel frees only free pages; pages still in use (or reserved) become
surplus and are freed when their user lets go, which is reported. A give-back
that changed nothing (the write failed) raises, so the record stays and a retry
is exact; one that changed only part is reported and never retried, so pages
are never taken twice. Growing and shrinking are serialized by the caller (the
host lock): the absolute write races with another writer in the same instant.

The kernel is reached through ``PoolIO``; tests replace the module's ``_IO``
with a fake that grants, refuses and pins pages like the kernel does.

A scale down gives pages back at once (``give_back``): it records
``"hugepages-returned"`` ``{root, node, size_kib, paid: {grow id: pages}}``
first, then lowers the pool. Its undo (which runs before the older answers it
pays from) leaves a credit per grow that the answer's undo takes off what it
gives back, so ``down``
returns the cluster's grown pages minus those already returned, never more. A
crash between the record and the write leaves the pool larger (never another
cluster's pages taken).

``cgroup_pages`` reads how many pages programs of a cgroup have faulted in,
per NUMA node (the hugetlb controller's ``numa_stat``).

hugetlbfs mounts (kind ``"mount"``): ``ensure_hugetlbfs`` mounts one per page
size; its undo lazily unmounts it if it is still mounted there and removes the
directories it created, if empty.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from hpvc.errors import HpvcError
from hpvc.host.cgroupfs import find_manager
from hpvc.host.command import at as _at
from hpvc.host.command import host_run as _host_run
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.probe import hugepage_sizes, read_mounts
from hpvc.sysroot import HOST, RootLike, as_root

_log = logging.getLogger(__name__)
_settled: set[str] = set()
_credit: dict[str, int] = {}  # grow id -> pages of it a scale down already returned
Runner = Callable[[Sequence[str]], None]


class PoolIO(Protocol):
    """How pool counters are read and written (sysfs, or a fake kernel in tests)."""

    def read(self, path: Path) -> int: ...

    def write(self, path: Path, value: int) -> None: ...


class SysfsIO:
    """The real kernel: integer sysfs files; a missing file reads as 0."""

    def read(self, path: Path) -> int:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return 0
        return int(text) if text.isdigit() else 0

    def write(self, path: Path, value: int) -> None:
        path.write_text(f"{value}\n")


_IO: PoolIO = SysfsIO()


_runner: Runner = _host_run


def _run(root: RootLike, argv: Sequence[str]) -> None:
    """Run a host command; refuse to mount anything for a fake root unless a test set a runner."""
    if not as_root(root).is_host and _runner is _host_run:
        raise RuntimeError(f"refusing to run {list(argv)} for the fake root {root}")
    _runner(argv)


# --- pools ---------------------------------------------------------------------------


def pool_dir(node: int, size_kib: int, root: RootLike = HOST) -> Path:
    """sysfs directory of the pool of ``size_kib`` pages on NUMA ``node``.

    Hosts without NUMA in sysfs have one system-wide pool, used for node 0.
    """
    name = f"hugepages-{size_kib}kB"
    per_node = _at(root, f"/sys/devices/system/node/node{node}/hugepages") / name
    if per_node.is_dir():
        return per_node
    system = _at(root, "/sys/kernel/mm/hugepages") / name
    if node == 0 and system.is_dir() and not _at(root, "/sys/devices/system/node").is_dir():
        return system
    sizes = ", ".join(f"{kb}kB" for kb in hugepage_sizes(root)) or "none"
    raise HpvcError(
        f"node {node}: {size_kib}kB hugepages",
        f"no such pool ({per_node} missing; sizes offered: {sizes})",
        "pick a page size and NUMA node this host has",
    )


def _persistent(io: PoolIO, pool: Path) -> int:
    return io.read(pool / "nr_hugepages") - io.read(pool / "surplus_hugepages")


def pool_state(node: int, size_kib: int, root: RootLike = HOST) -> tuple[int, int]:
    """(total, free) pages of the pool, as the kernel reports them."""
    pool = pool_dir(node, size_kib, root)
    return _IO.read(pool / "nr_hugepages"), _IO.read(pool / "free_hugepages")


def grow_pool(
    journal: Journal, node: int, size_kib: int, count: int, root: RootLike = HOST
) -> None:
    """Add ``count`` pages to the pool; all of them, or none and an ``HpvcError``."""
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    if count == 0:
        return
    pool = pool_dir(node, size_kib, root)
    before = _persistent(_IO, pool)
    gid = uuid.uuid4().hex
    where = {"root": str(root), "node": node, "size_kib": size_kib}
    journal.record("hugepages", id=gid, count=count, before=before, **where)
    failure = ""
    try:
        _IO.write(pool / "nr_hugepages", before + count)
    except OSError as e:  # the kernel may still have allocated some
        failure = f" ({e.strerror or e})"
    added = _persistent(_IO, pool) - before
    if added >= count:
        journal.record("hugepages-added", id=gid, added=count, **where)
        return
    if added > 0:
        _give_back(root, node, size_kib, added)
    journal.record("hugepages-added", id=gid, added=0, **where)
    raise HpvcError(
        f"node {node}",
        f"asked for {count} more {size_kib}kB pages, kernel gave {max(added, 0)}{failure}",
        "free memory is fragmented or short; try again, or drop hugepages",
    )


def _give_back(root: RootLike, node: int, size_kib: int, added: int) -> None:
    """Lower the pool by ``added`` pages from where it stands; the kernel frees only free ones."""
    pool = pool_dir(node, size_kib, root)
    nr, surplus = pool / "nr_hugepages", pool / "surplus_hugepages"
    surplus_before = _IO.read(surplus)
    current = _IO.read(nr) - surplus_before
    target = max(0, current - added)
    what = f"node {node}: give back {added} {size_kib}kB pages"
    try:
        _IO.write(nr, target)
    except OSError as e:
        raise HpvcError(what, f"cannot write {nr}: {e.strerror or e}") from e
    now = _IO.read(nr) - _IO.read(surplus)
    if now == current and target != current:
        raise HpvcError(what, f"the kernel kept the pool at {current} pages")
    if now > target:
        _log.warning(
            "%s: only %d given back, %d remain; lower %s by hand",
            what,
            current - now,
            now - target,
            nr,
        )
    pending = _IO.read(surplus) - surplus_before
    if pending > 0:
        _log.warning(
            "%s: %d of them are still in use; the kernel frees them when their user exits",
            what,
            pending,
        )


def give_back(
    journal: Journal, node: int, size_kib: int, count: int, root: RootLike = HOST
) -> None:
    """Return ``count`` of the pages this journal grew (newest grows first), now.

    Never more than the journal grew and has not returned yet."""
    left: dict[str, int] = {}
    for e in journal.entries():
        a = e.args
        if (a.get("root"), a.get("node"), a.get("size_kib")) != (str(root), node, size_kib):
            continue
        if e.kind == "hugepages-added" and a["added"] > 0:
            left[a["id"]] = a["added"]
        elif e.kind == "hugepages-returned":
            for gid, n in a["paid"].items():
                left[gid] = left.get(gid, 0) - n
    paid: dict[str, int] = {}
    for gid in reversed(list(left)):
        take = min(count - sum(paid.values()), left[gid])
        if take > 0:
            paid[gid] = take
    if not paid:
        return
    journal.record("hugepages-returned", paid=paid, root=str(root), node=node, size_kib=size_kib)
    _give_back(root, node, size_kib, sum(paid.values()))


def grown(journal: Journal) -> dict[tuple[int, int], int]:
    """Pages the journal grew and has not returned, per (NUMA node, page KiB)."""
    out: dict[tuple[int, int], int] = {}
    for e in journal.entries():
        a = e.args
        if e.kind == "hugepages-added":
            out[a["node"], a["size_kib"]] = out.get((a["node"], a["size_kib"]), 0) + a["added"]
        elif e.kind == "hugepages-returned":
            paid = sum(a["paid"].values())
            out[a["node"], a["size_kib"]] = out.get((a["node"], a["size_kib"]), 0) - paid
    return out


@undoer("hugepages-returned")
def _undo_returned(args: Args) -> None:
    for gid, n in args["paid"].items():
        _credit[gid] = _credit.get(gid, 0) + n


@undoer("hugepages-added")
def _undo_added(args: Args) -> None:
    _settled.add(args["id"])
    added = args["added"] - _credit.pop(args["id"], 0)
    if added > 0:
        _give_back(Path(args["root"]), args["node"], args["size_kib"], added)


def cgroup_pages(
    cgroups: Sequence[str], size_kib: int, root: RootLike = HOST
) -> dict[int, int] | None:
    """Pages of ``size_kib`` faulted in by the tasks of ``cgroups`` (paths like
    ``/hpvc/c``, with their children), per NUMA node; None when unreadable."""
    m = find_manager(root)
    if m is None:
        return None
    out: dict[int, int] = {}
    for cg in cgroups:
        got = m.hugetlb_numa(cg, size_kib)
        if got is None:
            return None
        for node, used in got.items():
            out[node] = out.get(node, 0) + used // (size_kib << 10)
    return out


@undoer("hugepages")
def _undo_intent(args: Args) -> None:
    if args["id"] in _settled:
        _settled.discard(args["id"])
        return
    root, node, size = Path(args["root"]), args["node"], args["size_kib"]
    try:
        now = _persistent(_IO, pool_dir(node, size, root))
    except HpvcError:
        return
    if now > args["before"]:
        _log.warning(
            "node %d: a grow of the %dkB pool by %d was cut off before hpvc read the "
            "kernel's answer; the pool had %d pages then and has %d now; hpvc gives "
            "back none of them (they may be another cluster's): check and lower %s by hand",
            node,
            size,
            args["count"],
            args["before"],
            now,
            pool_dir(node, size, root) / "nr_hugepages",
        )


# --- hugetlbfs -----------------------------------------------------------------------


def _kib(text: str) -> int:
    """``2M`` -> 2048 (the pagesize= of /proc/mounts)."""
    shift = {"K": 0, "M": 10, "G": 20}.get(text[-1:].upper())
    if shift is None:
        return int(text) // 1024
    return int(text[:-1]) << shift


def _mounted_at(root: RootLike, path: Path) -> tuple[str, int | None] | None:
    """(fstype, hugetlbfs page size in KiB) of the topmost mount at ``path``, or None."""
    found = [m for m in read_mounts(root) if m.target == str(path)]
    if not found:
        return None
    top = found[-1]
    size = next((_kib(o[9:]) for o in top.options if o.startswith("pagesize=")), None)
    return top.fstype, size


def ensure_hugetlbfs(journal: Journal, path: Path, size_kib: int, root: RootLike = HOST) -> None:
    """Mount hugetlbfs with ``pagesize=size_kib`` at ``path`` (host path, made with mkdir -p)."""
    have = _mounted_at(root, path)
    if have == ("hugetlbfs", size_kib):
        return
    if have is not None:
        raise HpvcError(
            f"mount hugetlbfs at {path}",
            f"a {have[0]} (page size {have[1]}kB) is mounted there"
            if have[0] == "hugetlbfs"
            else f"a {have[0]} is mounted there",
            "unmount it or choose another directory",
        )
    if size_kib not in hugepage_sizes(root):
        raise HpvcError(f"mount hugetlbfs at {path}", f"the kernel has no {size_kib}kB pages")
    real = _at(root, str(path))
    created = [str(p) for p in (path, *path.parents) if not _at(root, str(p)).exists()]
    journal.record("mount", root=str(root), path=str(path), fstype="hugetlbfs", created=created)
    real.mkdir(parents=True, exist_ok=True)
    _run(root, ["mount", "-t", "hugetlbfs", "-o", f"pagesize={size_kib}K", "hugetlbfs", str(real)])


@undoer("mount")
def _undo_mount(args: Args) -> None:
    root, path = Path(args["root"]), Path(args["path"])
    have = _mounted_at(root, path)
    if have is not None and have[0] == args["fstype"]:
        _run(root, ["umount", "-l", str(_at(root, str(path)))])
    for made in args.get("created", []):  # deepest first
        d = _at(root, made)
        try:
            d.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            break  # not empty (or still a mount point): leave it and its parents

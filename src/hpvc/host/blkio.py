"""Block I/O of hpvc nodes: the bfq scheduler, per-node weights and throttles.

crun writes a node's throttles from its OCI config; ``hpvc.host.cgroups``
checks them and sets the bfq weight crun cannot, through the cgroup manager of
the host's layout (``hpvc.host.cgroupfs``), which knows the files. Weights need
the bfq scheduler on the disk, which ``ensure_bfq`` switches to and
``require_bfq`` checks. The small cgroup-file helpers here (``read_text``,
``write_text``, ``to_int``) and the parsers of throttle files are shared with
the managers.

Undo kind (architecture rule 5):

``"blk-scheduler"`` ``{root, device, previous}``
    host-wide: ``ensure_bfq`` switched a device to bfq; the undo puts the
    previous scheduler back if bfq is still the active one.

Every function takes ``root`` (``/`` or a fake tree); modprobe goes through
``_runner``, which refuses a fake root unless a test set it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.host.command import at as _at
from hpvc.host.command import host_run as _host_run
from hpvc.host.journal import Args, Journal, undoer
from hpvc.sysroot import HOST, RootLike, as_root

THROTTLES = (
    ("read_bps", "rbps"),
    ("write_bps", "wbps"),
    ("read_iops", "riops"),
    ("write_iops", "wiops"),
)
_UNLIMITED = 1 << 62  # v1 prints "no limit" as PAGE_COUNTER_MAX * page size
Runner = Callable[[Sequence[str]], None]


_runner: Runner = _host_run


def _run(root: RootLike, argv: Sequence[str]) -> None:
    if not as_root(root).is_host and _runner is _host_run:
        raise RuntimeError(f"refusing to run {list(argv)} for the fake root {root}")
    _runner(argv)


# --- cgroup and sysfs files ----------------------------------------------------------


def read_text(path: Path) -> str | None:
    """A file's stripped text; None when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def to_int(text: str | None) -> int | None:
    """An integer file; ``max``, ``-1`` and v1's huge "no limit" read as None."""
    if text is None or text in ("max", "-1") or not text.lstrip("-").isdigit():
        return None
    value = int(text)
    return None if value >= _UNLIMITED else value


def write_text(path: Path, value: str) -> None:
    """Write ``value`` to a cgroup or sysfs file; an ``HpvcError`` when the kernel refuses."""
    try:
        path.write_text(value)
    except OSError as e:
        raise HpvcError(f"write {value!r} to {path}", e.strerror or str(e)) from e


# --- the bfq scheduler ---------------------------------------------------------------


def _scheduler(path: Path) -> tuple[str, list[str]] | None:
    """(active, offered) from a queue/scheduler file, or None when unreadable."""
    text = read_text(path)
    if text is None:
        return None
    offered = text.replace("[", "").replace("]", "").split()
    active = re.search(r"\[([^\]]+)\]", text)
    if active:
        return active.group(1), offered
    return (offered[0] if len(offered) == 1 else "none"), offered


def ensure_bfq(journal: Journal, device_name: str, root: RootLike = HOST) -> list[str]:
    """Make bfq the scheduler of ``device_name`` (undo kind "blk-scheduler"); return notes.

    Host-wide: pass the host journal. Loads the bfq module with ``modprobe bfq`` only
    when the device does not offer bfq (the module stays loaded, and a note says so).
    """
    path = _at(root, f"/sys/block/{device_name}/queue/scheduler")
    state = _scheduler(path)
    if state is None:
        raise HpvcError(f"block device {device_name}", f"no {path}", "name a disk in /sys/block")
    active, offered = state
    if active == "bfq":
        return []
    notes = []
    if "bfq" not in offered:
        _run(root, ["modprobe", "bfq"])
        notes.append("loaded the bfq module (modprobe bfq); hpvc leaves it loaded")
        state = _scheduler(path)
        if state is None or "bfq" not in state[1]:
            raise HpvcError(f"bfq on {device_name}", "the kernel offers no bfq scheduler")
    journal.record("blk-scheduler", root=str(root), device=device_name, previous=active)
    write_text(path, "bfq")
    now = _scheduler(path)
    if now is None or now[0] != "bfq":
        raise HpvcError(f"bfq on {device_name}", f"the scheduler is still {now[0] if now else '?'}")
    notes.append(f"{device_name}: I/O scheduler {active} -> bfq")
    return notes


@undoer("blk-scheduler")
def _undo_scheduler(args: Args) -> None:
    path = _at(Path(args["root"]), f"/sys/block/{args['device']}/queue/scheduler")
    state = _scheduler(path)
    if state is not None and state[0] == "bfq" and args["previous"] in state[1]:
        write_text(path, args["previous"])


def device_name(device: tuple[int, int], root: RootLike = HOST) -> str:
    """Disk name of a block device number (a partition's disk, which holds the scheduler)."""
    link = _at(root, f"/sys/dev/block/{device[0]}:{device[1]}")
    if not link.exists():
        raise HpvcError(f"block device {device[0]}:{device[1]}", f"no {link}")
    real = link.resolve()
    return real.parent.name if (real / "partition").exists() else real.name


# --- weights and throttles ----------------------------------------------------------


def require_bfq(device: tuple[int, int], what: str, root: RootLike = HOST) -> None:
    """Refuse ``what`` (a block I/O weight) unless ``device``'s disk uses bfq."""
    name = device_name(device, root)
    state = _scheduler(_at(root, f"/sys/block/{name}/queue/scheduler"))
    if state is None or state[0] != "bfq":
        raise HpvcError(
            what,
            f"{name} uses the {state[0] if state else '?'} scheduler; weights need bfq",
            f"hpvc switches it at up (ensure_bfq); by hand: echo bfq > /sys/block/{name}"
            "/queue/scheduler",
        )


def weight_value(text: str | None) -> int | None:
    """``100`` or ``default 100`` (plus per-device lines) -> 100."""
    first = (text or "").splitlines()[0].split() if text else []
    return to_int(first[-1]) if first else None


def parse_device_map(text: str | None) -> dict[str, int]:
    """``8:0 1048576`` lines (v1 blkio.throttle.*) -> {"8:0": 1048576}."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_io_max(text: str | None) -> dict[str, dict[str, int | None]]:
    """v2 io.max lines -> {"8:0": {"rbps": 1048576, "wbps": None, ...}}."""
    out: dict[str, dict[str, int | None]] = {}
    for line in (text or "").splitlines():
        dev, *pairs = line.split()
        out[dev] = {k: to_int(v) for k, _, v in (p.partition("=") for p in pairs)}
    return out


def block_device(path: Path, root: RootLike = HOST) -> tuple[int, int] | None:
    """(major, minor) of the whole disk under ``path`` (throttles apply to disks,
    not partitions); None on overlay, tmpfs and the like: nothing to throttle."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sys_dev = _at(root, f"/sys/dev/block/{major}:{minor}")
    if not sys_dev.exists():
        return None
    if (sys_dev / "partition").exists():
        parent = (sys_dev.resolve().parent / "dev").read_text().strip()
        major, minor = (int(x) for x in parent.split(":"))
    return (major, minor)


def filesystem_type(path: Path, root: RootLike = HOST) -> str | None:
    """The type of the file system ``path`` lives on (the longest mount point
    above it in /proc/self/mounts); None when it cannot be told."""
    text = read_text(_at(root, "/proc/self/mounts"))
    if text is None:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, kind = mnt, parts[2]
    return kind


def no_block_device(path: Path, root: RootLike = HOST) -> str | None:
    """Why block-I/O limits cannot apply to files under ``path`` (a tmpfs, an
    overlay: no block device under it); None when a disk is there to limit."""
    if block_device(path, root) is not None:
        return None
    kind = filesystem_type(path, root) or "a file system"
    return f"{path} is on {kind}, no block device"

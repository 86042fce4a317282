"""A guest leaves its ivshmem region: its ranks' endpoints move to TCP (issues 27 and 29).

The region's header (``native/ucx/region.h``, version 2) holds, after the
allocator's slots, a departure list and a table of members: one entry per
process that has UCX's ``ivshmem`` transport open (``native/ucx/fallback.c``).
``depart`` appends a guest's cluster address to the list and bumps the epoch,
then waits until every member has either acted on the new epoch (switched its
endpoints to and from that address over to TCP, ``seen``) or is not inside a
send or progress call (``busy`` is 0: its next one reads the new epoch before
writing any FIFO). After that no process writes the leaving guest's FIFOs and
the leaving guest writes no one's, so the guest can be moved with a copy of the
region that no one shares (``hpvc.backends.qemu.across``).

A region no process has used yet (a zeroed header) takes the departure too:
the first process to use it keeps the list (``region.c`` sets up the rest of
the header around it), so it never reaches the leaving guest there.

The epoch is written before the busy counts are read; the members count
themselves busy before they read the epoch, with a full barrier between.
Python has no store-load fence, so the first read waits ``SETTLE_S``: far
longer than any store buffer takes to drain.

A departure is not undone (no journal entry): a move that fails after it
leaves that guest's pairs on TCP, which is correct and only slower; the
guest's address stays in the list for the region's life. Once the move has
ended (the guest runs on its new host), ``gone`` marks the entry
(``REGION_GONE``): the segments and member entries its processes held here
are then taken back by the processes that stay (after the allocator's
quarantine), which could never judge another kernel's processes dead. Members of a guest
that departed earlier are not waited for (they may have been frozen busy by
their move). Architecture: docs/architecture.md (``host/``).
"""

from __future__ import annotations

import ipaddress
import mmap
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from hpvc.errors import HpvcError

# Offsets in the header; tests/unit/test_region_departure.py checks them against
# the C layout (native/ucx/test_alloc layout).
MAGIC = 0x48535649435650
VERSION = 2
EPOCH_AT = 36952
DEPARTURES_AT = 36956
DEPARTED_AT = 36960
DEPARTED_MAX = 32
MEMBER_AT = 37248
MEMBER_SIZE = 64
MEMBERS = 128
MEMBER_IP, MEMBER_SEEN, MEMBER_BUSY, MEMBER_PID = 4, 8, 12, 48
USED = 1
GONE = 0x80000000  # REGION_GONE, in a departure's epoch
SETTLE_S = 0.05


@dataclass(frozen=True)
class Member:
    index: int
    ip: str
    pid: int
    seen: int
    busy: int


@dataclass(frozen=True)
class Departure:
    epoch: int
    members: int  # members that had to act (or be idle)
    waited_s: float


def _ip(raw: int) -> str:
    return str(ipaddress.IPv4Address(struct.pack("<I", raw)))


def _raw(ip: str) -> int:
    return int(struct.unpack("<I", ipaddress.IPv4Address(ip).packed)[0])


def _u32(m: mmap.mmap, at: int) -> int:
    return int(struct.unpack_from("<I", m, at)[0])


def _why_not(m: mmap.mmap) -> str | None:
    magic, version = struct.unpack_from("<QI", m, 0)
    if magic == 0 or (magic == MAGIC and version == VERSION):
        return None  # unused yet (a zeroed region), or one of ours
    return (
        f"its shared region was set up by another UCX module (region magic {magic:#x},"
        f" version {version}; this hpvc's is version {VERSION}), which cannot leave it"
    )


FIX = "rebuild the guest image (hpvc image build) and start the job again"


def refusal(path: Path) -> str | None:
    """Why a guest on the region at ``path`` cannot leave it, or None."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        why = _why_not(m)
    return f"{why}: {FIX}" if why else None


def members(m: mmap.mmap) -> list[Member]:
    out = []
    for i in range(MEMBERS):
        at = MEMBER_AT + i * MEMBER_SIZE
        if _u32(m, at) != USED:
            continue
        out.append(
            Member(
                i,
                _ip(_u32(m, at + MEMBER_IP)),
                _u32(m, at + MEMBER_PID),
                _u32(m, at + MEMBER_SEEN),
                _u32(m, at + MEMBER_BUSY),
            )
        )
    return out


def departed(m: mmap.mmap) -> dict[str, int]:
    """Address -> the epoch it departed at."""
    n = min(_u32(m, DEPARTURES_AT), DEPARTED_MAX)
    return {
        _ip(_u32(m, DEPARTED_AT + 8 * i)): _u32(m, DEPARTED_AT + 8 * i + 4) & ~GONE
        for i in range(n)
    }


def gone(path: Path, ip: str) -> bool:
    """Say that guest ``ip``, which departed, now runs on another host: the region's
    other processes take back what its processes held. False when ``ip`` never
    departed from this region (nothing changed)."""
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        if _why_not(m) is not None:
            return False
        n = min(_u32(m, DEPARTURES_AT), DEPARTED_MAX)
        found = False
        for i in range(n):
            if _u32(m, DEPARTED_AT + 8 * i) == _raw(ip):
                at = DEPARTED_AT + 8 * i + 4
                struct.pack_into("<I", m, at, _u32(m, at) | GONE)
                found = True
        return found


def depart(path: Path, ip: str, timeout_s: float = 30.0) -> Departure:
    """Take guest ``ip`` off the region at ``path`` (see the module's text)."""
    start = time.monotonic()
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        why = _why_not(m)
        if why is not None:
            raise HpvcError(f"guest {ip} leaving its shared region", why, FIX)
        gone = departed(m)
        if ip in gone:
            epoch = gone[ip]
        else:
            n = _u32(m, DEPARTURES_AT)
            if n >= DEPARTED_MAX:
                raise HpvcError(
                    f"region {path}",
                    f"{DEPARTED_MAX} guests have already left it",
                    "restart the cluster to get a fresh region",
                )
            epoch = _u32(m, EPOCH_AT) + 1
            struct.pack_into("<II", m, DEPARTED_AT + 8 * n, _raw(ip), epoch)
            struct.pack_into("<I", m, DEPARTURES_AT, n + 1)
            struct.pack_into("<I", m, EPOCH_AT, epoch)
        time.sleep(SETTLE_S)
        earlier = {a for a, e in departed(m).items() if e < epoch}
        while True:
            waiting = [
                x for x in members(m) if x.ip not in earlier and x.seen < epoch and x.busy != 0
            ]
            if not waiting:
                acting = [x for x in members(m) if x.ip not in earlier]
                return Departure(epoch, len(acting), time.monotonic() - start)
            if time.monotonic() - start > timeout_s:
                who = ", ".join(f"pid {x.pid} at {x.ip}" for x in waiting)
                raise HpvcError(
                    f"guest {ip} leaving its shared region",
                    f"{len(waiting)} process(es) did not let go of it in {timeout_s:.0f} s: "
                    f"{who} (a rank stuck inside a send)",
                    "nothing moved; its pairs with this guest now use TCP. Try again",
                )
            time.sleep(0.01)

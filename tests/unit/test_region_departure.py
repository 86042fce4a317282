"""hpvc.host.region_departure against the C layout and on a region file of its own."""

from __future__ import annotations

import mmap
import struct
import subprocess
from pathlib import Path

import pytest

from hpvc.errors import HpvcError
from hpvc.host import region_departure as rd
from tests.unit.test_ucx_region import build_test_alloc


def test_offsets_match_the_c_header(tmp_path: Path) -> None:
    tool = build_test_alloc(tmp_path)
    out = subprocess.run([str(tool), "layout"], capture_output=True, text=True, check=True)
    c = {k: int(v) for k, v in (w.split("=") for w in out.stdout.split())}
    assert c == {
        "version": rd.VERSION,
        "magic": rd.MAGIC,
        "epoch": rd.EPOCH_AT,
        "departures": rd.DEPARTURES_AT,
        "departed": rd.DEPARTED_AT,
        "departed_max": rd.DEPARTED_MAX,
        "member": rd.MEMBER_AT,
        "member_size": rd.MEMBER_SIZE,
        "members": rd.MEMBERS,
        "member_ip": rd.MEMBER_IP,
        "member_seen": rd.MEMBER_SEEN,
        "member_busy": rd.MEMBER_BUSY,
        "member_pid": rd.MEMBER_PID,
        "data": 65536,
        "gone": rd.GONE,
    }


def region(path: Path, members: list[tuple[str, int, int, int]]) -> Path:
    """A region file with a header and members (ip, pid, seen, busy)."""
    with path.open("wb") as f:
        f.truncate(1 << 20)
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        struct.pack_into("<QI", m, 0, rd.MAGIC, rd.VERSION)
        for i, (ip, pid, seen, busy) in enumerate(members):
            at = rd.MEMBER_AT + i * rd.MEMBER_SIZE
            struct.pack_into("<IIII", m, at, rd.USED, rd._raw(ip), seen, busy)
            struct.pack_into("<I", m, at + rd.MEMBER_PID, pid)
    return path


def read(path: Path) -> tuple[dict[str, int], int]:
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        return rd.departed(m), rd._u32(m, rd.EPOCH_AT)


def test_idle_members_let_the_guest_go_at_once(tmp_path: Path) -> None:
    p = region(tmp_path / "r", [("10.0.0.2", 11, 0, 0), ("10.0.0.3", 12, 0, 0)])
    gone = rd.depart(p, "10.0.0.3", timeout_s=1)
    assert (gone.epoch, gone.members) == (1, 2)
    assert read(p) == ({"10.0.0.3": 1}, 1)
    again = rd.depart(p, "10.0.0.3", timeout_s=1)  # already gone: same epoch, no new entry
    assert again.epoch == 1 and read(p) == ({"10.0.0.3": 1}, 1)
    assert rd.depart(p, "10.0.0.2", timeout_s=1).epoch == 2
    assert read(p) == ({"10.0.0.3": 1, "10.0.0.2": 2}, 2)


def test_a_busy_member_that_has_not_seen_the_epoch_holds_the_move(tmp_path: Path) -> None:
    p = region(tmp_path / "r", [("10.0.0.2", 11, 0, 0), ("10.0.0.4", 4242, 0, 1)])
    with pytest.raises(HpvcError) as e:
        rd.depart(p, "10.0.0.3", timeout_s=0.3)
    assert "pid 4242 at 10.0.0.4" in e.value.why and "1 process" in e.value.why


def test_members_of_a_guest_that_left_earlier_are_not_waited_for(tmp_path: Path) -> None:
    p = region(tmp_path / "r", [("10.0.0.2", 11, 0, 0), ("10.0.0.3", 12, 0, 0)])
    rd.depart(p, "10.0.0.3", timeout_s=1)
    with p.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:  # frozen busy by its move
        struct.pack_into("<I", m, rd.MEMBER_AT + rd.MEMBER_SIZE + rd.MEMBER_BUSY, 1)
    assert rd.depart(p, "10.0.0.2", timeout_s=0.5).members == 1


def test_a_region_no_one_used_yet_keeps_the_departure(tmp_path: Path) -> None:
    p = tmp_path / "r"
    with p.open("wb") as f:
        f.truncate(1 << 20)
    assert rd.refusal(p) is None
    gone = rd.depart(p, "10.0.0.2", timeout_s=1)
    assert (gone.epoch, gone.members) == (1, 0)
    assert read(p) == ({"10.0.0.2": 1}, 1)


def test_a_region_of_another_version_is_refused(tmp_path: Path) -> None:
    p = region(tmp_path / "r", [])
    with p.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        struct.pack_into("<QI", m, 0, rd.MAGIC, 1)
    why = rd.refusal(p)
    assert why is not None and "version 1" in why and "rebuild the guest image" in why
    with pytest.raises(HpvcError) as e:
        rd.depart(p, "10.0.0.2")
    assert "version 1" in e.value.why
    assert read(p) == ({}, 0)  # nothing written


def test_gone_marks_the_departure_and_keeps_its_epoch(tmp_path: Path) -> None:
    p = region(tmp_path / "r", [("10.0.0.2", 11, 0, 0), ("10.0.0.3", 12, 0, 0)])
    rd.depart(p, "10.0.0.3", timeout_s=1)
    rd.depart(p, "10.0.0.2", timeout_s=1)
    assert rd.gone(p, "10.0.0.3") is True
    assert rd.gone(p, "10.0.0.9") is False  # never departed: nothing written
    with p.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        raw = [rd._u32(m, rd.DEPARTED_AT + 8 * i + 4) for i in range(2)]
    assert raw == [1 | rd.GONE, 2]  # the C side reads the flag (test_alloc: gone_*)
    assert read(p) == ({"10.0.0.3": 1, "10.0.0.2": 2}, 2)
    assert rd.depart(p, "10.0.0.3", timeout_s=1).epoch == 1  # still departed, same epoch

"""Issue 25, item 6: a node's console log on the host is kept to a cap
(hpvc.host.console_ring), the site sets the cap, and the VM readiness wait
still finds its line across a rotation."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hpvc.backends.vm.console import _LogFollower
from hpvc.host import console_ring, procfs
from hpvc.host.console_reader import RingLog
from hpvc.host.journal import Journal
from hpvc.slurm import policy
from hpvc.spec.limits import DEFAULT, Limits, read_site
from hpvc.store import ClusterRecord


def _kept(log: Path) -> bytes:
    old = log.with_name(log.name + ".1")
    return (old.read_bytes() if old.exists() else b"") + log.read_bytes()


def test_ring_keeps_the_newest_bytes_within_twice_the_cap(tmp_path: Path) -> None:
    log, cap = tmp_path / "console.log", 1000
    ring = RingLog(log, cap)
    written = b""
    for i in range(500):
        chunk = f"line {i} ".encode() * (i % 7 + 1) + b"\n"
        ring.write(chunk)
        written += chunk
        assert log.stat().st_size <= cap
    ring.close()
    kept = _kept(log)
    assert log.with_name("console.log.1").stat().st_size <= cap
    assert cap < len(kept) <= 2 * cap
    assert written.endswith(kept)  # the newest, in order, nothing lost in between


def test_the_log_is_never_missing_during_a_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever stats console.log by path (a test, a follower) always finds one:
    checked before and after every file operation a rotation makes."""
    from hpvc.host import console_reader

    log, seen = tmp_path / "console.log", []
    ring = RingLog(log, 100)

    def checked(name: str):  # type: ignore[no-untyped-def]
        real = getattr(os, name)

        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append((name, log.exists()))
            out = real(*args, **kwargs)
            seen.append((name, log.exists()))
            return out

        return call

    for name in ("replace", "link", "unlink", "open", "close"):
        monkeypatch.setattr(console_reader.os, name, checked(name))
    ring.write(b"a" * 80)
    ring.write(b"b" * 80)  # past the cap: a rotation
    monkeypatch.undo()
    ring.close()
    assert ("replace", True) in seen and all(there for _, there in seen), seen
    assert log.read_bytes() == b"b" * 80
    assert log.with_name("console.log.1").read_bytes() == b"a" * 80
    assert sorted(p.name for p in tmp_path.iterdir()) == ["console.log", "console.log.1"]


def test_ring_write_larger_than_cap_keeps_its_end(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    ring = RingLog(log, 100)
    ring.write(b"x" * 50)
    ring.write(bytes(range(256)) * 4)
    ring.close()
    assert log.read_bytes() == (bytes(range(256)) * 4)[-100:]
    assert log.with_name("console.log.1").read_bytes() == b"x" * 50


def test_ring_appends_to_a_restarted_nodes_log(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"first boot\n")
    ring = RingLog(log, 20, append=True)
    ring.write(b"second\n")
    assert log.read_bytes() == b"first boot\nsecond\n"
    ring.write(b"third boot line\n")  # past 20: the old file rotates
    ring.close()
    assert log.read_bytes() == b"third boot line\n"
    assert log.with_name("console.log.1").read_bytes() == b"first boot\nsecond\n"
    fresh = RingLog(log, 20)  # a VM's boot starts an empty log
    fresh.close()
    assert log.read_bytes() == b""


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while procfs.running(pid) and time.monotonic() < deadline:
        console_ring._gone(pid, None)  # reaps it when it is this process's child
        time.sleep(0.02)
    assert not procfs.running(pid)


def _record(journal: Journal) -> dict[str, object]:
    lines = [json.loads(x) for x in journal.path.read_text().splitlines()]
    (entry,) = [x for x in lines if x["kind"] == "console-ring"]
    return dict(entry["args"])


def test_reader_process_bounds_a_flood_and_ends_at_eof(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal")
    log, cap = tmp_path / "console.log", 64 << 10
    out = console_ring.start(journal, log, cap)
    assert out is not None
    block = b"y\n" * 4096
    for _ in range(1280):  # 10 MiB, 160 times the cap
        os.write(out, block)
    os.write(out, b"the last line\n")
    os.close(out)  # the last writer gone: the reader ends by itself
    args = _record(journal)
    _wait_gone(int(str(args["pid"])))
    assert log.stat().st_size <= cap
    assert log.with_name("console.log.1").stat().st_size <= cap
    assert _kept(log).endswith(b"y\nthe last line\n")
    assert journal.undo_all() == []  # its undo finds it gone


def test_reader_of_a_fifo_and_its_undo(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal")
    log, fifo = tmp_path / "console.log", tmp_path / "console.fifo"
    assert console_ring.start(journal, log, 1 << 20, fifo=fifo) is None
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # as QEMU opens it: no wait
    os.write(writer, b"hpvc-ready n0\n")
    deadline = time.monotonic() + 10
    while not (log.exists() and log.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert log.read_bytes() == b"hpvc-ready n0\n"
    pid = int(str(_record(journal)["pid"]))
    assert procfs.running(pid)  # its writer still holds the FIFO
    assert journal.undo_all() == []  # the undo ends it and removes the FIFO
    assert not procfs.running(pid)
    assert not fifo.exists()
    os.close(writer)


def test_follower_reads_the_rest_of_a_rotated_log(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    ring = RingLog(log, 40)
    follow = _LogFollower(log)
    ring.write(b"booting\n")
    assert follow.lines() == ["booting"]
    ring.write(b"hpvc-ready n0\n")  # then, before the next look, a rotation
    ring.write(b"x" * 35 + b"\n")
    assert follow.lines() == ["hpvc-ready n0", "x" * 35]


def test_site_caps_the_console(tmp_path: Path) -> None:
    assert DEFAULT.max_console_mib == 16
    site = tmp_path / "limits.toml"
    site.write_text('max_console = "64MiB"\n')
    assert read_site(site) == Limits(max_console_mib=64)
    site.write_text('max_console = "1KiB"\n')
    with pytest.raises(Exception, match="not a size of 1MiB or more"):
        read_site(site)
    assert policy.Site.parse(["max_console=2MiB"]).limits.max_console_mib == 2
    rec = ClusterRecord("c", {}, "", {}, "running", 0.0, 0.0)
    assert rec.console_bytes() == read_site().max_console_mib << 20  # the site's
    rec.console_mib = 2
    assert ClusterRecord.from_json(rec.to_json()).console_bytes() == 2 << 20

"""The live-migration primitive (hpvc.backends.vm.migration) between two real
QEMU processes on this host: one guest moves into a QEMU started with
``-incoming defer``; cancel, a timeout, Ctrl-C and a target killed by PID
leave the source running.

No guest OS (QEMU sits in its firmware): what moves is the guest's RAM and
device state. For the slow cases the guest's RAM is a private mapping of a
file of random bytes (no zero pages to skip) sent at 1 MiB/s, so the
migration is still under way when it is stopped. Every QEMU is started here
and killed by its PID; the test's directory is removed even on failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpvc.backends.qemu.qmp import wait_qmp
from hpvc.backends.vm import migration as m
from tests.helpers import requires

pytestmark = pytest.mark.integration


@dataclass
class Pair:
    dir: Path
    source: subprocess.Popen[bytes]
    target: subprocess.Popen[bytes]

    def runner(self, side: str) -> m.Runner:
        proc = self.source if side == "s" else self.target
        return m.socket_runner(str(self.dir / f"{side}.sock"), proc.pid)

    @property
    def uri(self) -> str:
        return m.unix_uri(str(self.dir / "migrate.sock"))

    def run_state(self, side: str) -> str:
        reply = self.runner(side)("query-status")[0]
        assert isinstance(reply, dict)
        return str(reply["status"])


def _qemu(d: Path, side: str, ram: Path | None, incoming: bool) -> subprocess.Popen[bytes]:
    argv = ["qemu-system-x86_64", "-nodefaults", "-display", "none", "-accel", "tcg", "-m", "64"]
    argv += ["-global", "migration.store-global-state=off"]  # as hpvc.render.qemu under TCG
    if ram is not None:
        argv += ["-object", f"memory-backend-file,id=ram,mem-path={ram},size=64M,share=off"]
        argv += ["-machine", "q35,memory-backend=ram"]
    else:
        argv += ["-machine", "q35"]
    argv += ["-qmp", f"unix:{d}/{side}.sock,server=on,wait=off"]
    argv = m.incoming_argv(argv) if incoming else argv
    log = open(d / f"{side}.log", "wb")  # noqa: SIM115 - closed with the process's end
    proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    log.close()
    wait_qmp(d / f"{side}.sock", proc.pid, 10.0, d / f"{side}.log")
    return proc


def _pair(random_ram: bool) -> Iterator[Pair]:
    requires("qemu")
    d = Path(tempfile.mkdtemp(prefix="hpvc-mig-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ram = None
        if random_ram:
            ram = d / "ram"
            ram.write_bytes(os.urandom(64 << 20))
        procs.append(_qemu(d, "s", ram, incoming=False))
        procs.append(_qemu(d, "t", ram, incoming=True))
        yield Pair(d, procs[0], procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def pair() -> Iterator[Pair]:
    yield from _pair(random_ram=False)


@pytest.fixture
def slow_pair() -> Iterator[Pair]:
    yield from _pair(random_ram=True)


SLOW = m.MigrationSettings(bandwidth_mib_s=1, multifd=0)


def _begin(p: Pair, settings: m.MigrationSettings) -> tuple[m.Runner, bool]:
    """The source, and whether ``start`` stopped its guest for the copy (TCG
    before QEMU 9.0; then ``wait`` must resume it when the copy fails)."""
    m.listen(p.runner("t"), settings, p.uri)
    src = p.runner("s")
    m.apply_settings(src, settings)
    return src, m.start(src, p.uri)


@pytest.mark.parametrize("multifd", [0, 2])
def test_guest_moves_into_the_incoming_qemu(pair: Pair, multifd: int) -> None:
    assert pair.run_state("t") == "inmigrate"
    src, paused = _begin(pair, m.MigrationSettings(multifd=multifd))
    if paused:  # TCG before QEMU 9.0: the guest never runs while its memory is copied
        assert pair.run_state("s") in ("paused", "finish-migrate", "postmigrate")
    lines: list[str] = []
    stats = m.wait(src, 30.0, lines.append, target_alive=lambda: pair.target.poll() is None,
                   paused=paused)  # fmt: skip
    assert stats.total_ms > 0 and stats.bytes_sent > 0 and stats.passes >= 1
    assert stats.stop_and_copy is paused and (not paused or stats.downtime_ms == stats.total_ms)
    assert pair.run_state("t") == "running"
    assert pair.run_state("s") == "postmigrate"  # the source's vCPUs stay stopped


def test_timeout_cancels_and_source_keeps_running(slow_pair: Pair) -> None:
    src, paused = _begin(slow_pair, SLOW)
    with pytest.raises(m.MigrationFailed) as e:
        m.wait(src, 1.0, paused=paused)
    assert e.value.reason == "timeout" and "not done after 1 s" in e.value.why
    assert slow_pair.run_state("s") == "running"


def test_dying_target_cancels_and_source_keeps_running(slow_pair: Pair) -> None:
    src, paused = _begin(slow_pair, SLOW)
    threading.Timer(0.5, os.kill, (slow_pair.target.pid, signal.SIGKILL)).start()
    with pytest.raises(m.MigrationFailed) as e:
        m.wait(src, 30.0, target_alive=lambda: slow_pair.target.poll() is None, paused=paused)
    assert e.value.reason in ("target-died", "failed")
    assert slow_pair.run_state("s") == "running"


def test_interrupt_cancels(slow_pair: Pair) -> None:
    src, paused = _begin(slow_pair, SLOW)
    calls = 0

    def progress(_: str) -> None:
        nonlocal calls
        calls += 1
        raise KeyboardInterrupt  # as Ctrl-C would, inside the wait

    with pytest.raises(m.MigrationFailed) as e:
        m.wait(src, 30.0, progress, paused=paused)
    assert calls == 1 and e.value.reason == "interrupted"
    assert slow_pair.run_state("s") == "running"
    reply = src("query-migrate")[0]
    assert isinstance(reply, dict) and reply["status"] == "cancelled"

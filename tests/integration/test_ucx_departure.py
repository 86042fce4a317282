"""A guest leaves the region mid-job: its pairs go on over TCP (issues 27 and 29).

Real UCX 1.13 ranks (Open MPI's pml ucx, MPICH's ch4:ucx) run mpicheck (order and
every byte checked, eager and 4 MiB rendezvous) over one region file, as in
test_ucx_ivshmem.py; each rank stands for a guest with its own address on loopback
(UCX_IVSHMEM_ADDR=127.0.0.2, .3, ...: the fallback's listening sockets bind there).
Mid-job, ``hpvc.host.region_departure.depart`` takes one address off the region, as
hpvc does before it moves that guest to another host. UCX_TLS names no tcp: after
the departure only the module's own fallback can carry the job, so a job that ends
right proves it did, and each side's count of messages sent over TCP must match the
other side's count received.
"""

# ruff: noqa: F811 (the fixtures come from test_ucx_ivshmem and are parameters here)
from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpvc.host import region_departure
from tests.integration.test_ucx_ivshmem import (  # noqa: F401 (fixtures)
    LANE,
    Built,
    built,
    env_for,
    mpi_command,
    perftest,
    programs,
    region,
    show,
)

pytestmark = pytest.mark.integration

WRAP = """#!/bin/sh
r=${OMPI_COMM_WORLD_RANK:-$PMI_RANK}
export UCX_IVSHMEM_ADDR=127.0.0.$((2 + r))
exec "$@"
"""
LEFT = re.compile(r"\[\w+:(\d+)\s*:\d+\].*ivshmem: endpoint to ([\d.]+) leaves the region for TCP")
SENT = re.compile(r"ivshmem: endpoint to ([\d.]+) sent (\d+) messages \((\d+) bytes\) over TCP")
WAY = re.compile(r"ivshmem: endpoint to [\d.]+ sent .* over TCP, on (.+) connection")
GOT = re.compile(r"ivshmem: received (\d+) messages \((\d+) bytes\) over TCP")


def members(path: Path) -> list[region_departure.Member]:
    import mmap

    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        return region_departure.members(m)


def run_with_departure(
    built: Built,
    region: Path,
    program: Path,
    kind: str,
    ranks: int,
    rounds: int,
    leaver: str,
    tmp_path: Path,
    meanwhile: Callable[[subprocess.Popen[str]], None] | None = None,
) -> tuple[str, region_departure.Departure]:
    wrap = tmp_path / "as-guest"
    wrap.write_text(WRAP)
    wrap.chmod(0o755)
    env = env_for(built, region, "ivshmem,self")
    cmd = mpi_command(kind, program, ranks, [str(rounds)])
    at = cmd.index(str(program))
    cmd[at:at] = [str(wrap)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(members(region)) < ranks:  # every rank has the transport open
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        time.sleep(1.0)  # well into the job's rounds
        assert proc.poll() is None, "the job ended before the departure: raise its rounds"
        gone = region_departure.depart(region, leaver, timeout_s=30)
        if meanwhile:
            meanwhile(proc)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, out
    return out, gone


@pytest.mark.parametrize(("kind", "rounds"), [("openmpi", 400), ("mpich", 400)])
def test_departure_moves_the_pair_to_tcp_mid_job(
    built: Built, region: Path, programs: dict[str, Path], kind: str, rounds: int,
    tmp_path: Path,
) -> None:  # fmt: skip
    out, gone = run_with_departure(
        built, region, programs[kind], kind, 2, rounds, "127.0.0.3", tmp_path
    )
    assert f"mpicheck ok ranks=2 rounds={rounds}" in out, out
    assert gone.epoch == 1 and gone.members == 2
    assert LANE.findall(out).count("ivshmem") >= 2, out  # it began on the region
    switched = {peer for _, peer in LEFT.findall(out)}
    assert switched == {"127.0.0.2", "127.0.0.3"}, out  # both ends let go
    sent = {peer: (int(n), int(b)) for peer, n, b in SENT.findall(out)}
    got = sorted((int(n), int(b)) for n, b in GOT.findall(out))
    assert sent.keys() == {"127.0.0.2", "127.0.0.3"} and all(n > 0 for n, _ in got), out
    assert sorted(sent.values()) == got, out  # nothing lost or doubled on the way
    # One connection for the pair, both ways: one end opened it, the other took it.
    assert sorted(WAY.findall(out)) == ["its own", "the peer's"], out
    assert show(built, region)["used"] == 0


def test_departure_leaves_the_other_pairs_on_the_region(
    built: Built, region: Path, programs: dict[str, Path], tmp_path: Path
) -> None:
    """Three ranks (guests .2, .3, .4) in a ring; .4 leaves: its two pairs switch, the
    .2-.3 pair stays on the region; then new endpoints to .4 are not offered the region."""
    out, gone = run_with_departure(
        built, region, programs["openmpi"], "openmpi", 3, 300, "127.0.0.4", tmp_path
    )
    assert "mpicheck ok ranks=3 rounds=300" in out, out
    assert gone.members == 3
    left = LEFT.findall(out)
    peers = sorted(peer for _, peer in left)
    assert peers == ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.4"], out
    assert len({pid for pid, peer in left if peer != "127.0.0.4"}) == 1, out  # .4's own
    # after: .4 and .2 meet again; only TCP can join them (the transport says unreachable)
    a = env_for(built, region, "ivshmem,tcp") | {"UCX_IVSHMEM_ADDR": "127.0.0.4"}
    b = env_for(built, region, "ivshmem,tcp") | {"UCX_IVSHMEM_ADDR": "127.0.0.2"}
    again = perftest(a, b, "tag_lat", 8, 500)
    assert again.rc == 0 and again.lanes == {"tcp"}, again.out
    c = env_for(built, region, "ivshmem,tcp") | {"UCX_IVSHMEM_ADDR": "127.0.0.3"}
    stays = perftest(c, b, "tag_lat", 8, 500)
    assert stays.rc == 0 and stays.lanes == {"ivshmem"}, stays.out


HELLO_MAGIC = 0x46565048  # native/ucx/fallback.c: struct hello {magic, pad, fifo, from, id[16]}


def listeners(*ips: str) -> list[tuple[str, int]]:
    """The TCP sockets listening at ``ips`` (the ranks' fallback ports)."""
    want = {socket.inet_aton(ip)[::-1].hex().upper(): ip for ip in ips}
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, port = local.split(":")
        if state == "0A" and addr in want:
            found.append((want[addr], int(port, 16)))
    return found


def test_a_stranger_on_the_fallback_port_is_shut_out(
    built: Built, region: Path, programs: dict[str, Path], tmp_path: Path
) -> None:
    """After the departure each rank accepts connections at its cluster address. Someone
    else in the guest (no region, so not its id) connects and sends a hello and a
    frame: the rank closes the connection unread while the job runs on, and no rank
    takes in a message it was not sent (each side's TCP count is the other's)."""
    shut: list[tuple[str, int]] = []

    def strangers(proc: subprocess.Popen[str]) -> None:
        ports = listeners("127.0.0.2", "127.0.0.3")
        assert len(ports) == 2, ports
        frame = struct.pack("<IB3x", 8, 1) + b"\xee" * 8
        hellos = [
            struct.pack("<IIQQ", HELLO_MAGIC, 0, 0, 0) + os.urandom(16),  # right form, not its id
            b"GET / HTTP/1.0\r\n\r\n" + bytes(12),  # not a hello at all
        ]
        for (ip, port), hello in zip(ports, hellos, strict=True):
            with socket.create_connection((ip, port), timeout=20) as s:
                s.sendall(hello + frame)
                if s.recv(64) == b"" and proc.poll() is None:  # closed by the rank, not its exit
                    shut.append((ip, port))

    out, _ = run_with_departure(
        built, region, programs["openmpi"], "openmpi", 2, 600, "127.0.0.3", tmp_path,
        meanwhile=strangers,
    )  # fmt: skip
    assert "mpicheck ok ranks=2 rounds=600" in out, out
    assert len(shut) == 2, (shut, out)
    sent = sorted((int(n), int(b)) for _, n, b in SENT.findall(out))
    got = sorted((int(n), int(b)) for n, b in GOT.findall(out))
    assert len(sent) == 2 and sent == got, out

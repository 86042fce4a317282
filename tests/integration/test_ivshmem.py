"""Two VMs share one ivshmem-plain region: a write in one guest is read in the other.

The region is allocated by ``hpvc.host.ivshmem`` (a real /dev/shm file, under a
temporary state root) and mapped with the QEMU options the renderer emits; the
guests run ``hpvc-shm`` from the base disk. Commands reach the guests over ssh
on a bridge this test makes (10.220.<pid>.0/24, one tap per guest) and only to
its own guests' addresses. QEMUs are killed by PID; bridge, taps, disks and the
region (through its journal) are removed even when the test fails.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.host import ivshmem
from hpvc.host.journal import Journal
from hpvc.image import DEFAULT_NAME, build_image
from hpvc.image.guest import GuestArtifacts, build_guest, kernel_cmdline, node_disk
from hpvc.render.context import RenderContext
from hpvc.render.qemu import ivshmem_args
from tests.helpers import requires
from tests.integration.test_guest_boot import Guest, ip, requires_tools, ssh, ssh_key

pytestmark = pytest.mark.integration

PID = os.getpid()
SUBNET = f"10.220.{PID % 250}"
MTU = 1500
SIZE_MIB = 16
CLUSTER = f"ivtest{PID}"


@pytest.fixture(scope="module")
def artifacts() -> GuestArtifacts:
    requires("root", "qemu", "debootstrap", "ip")
    requires_tools("qemu-img", "ssh", "ssh-keygen")
    return build_guest(build_image(DEFAULT_NAME))


@pytest.fixture
def region(tmp_path: Path) -> Iterator[Path]:
    """A region in /dev/shm from a temporary state root; undone through its journal."""
    journal = Journal(tmp_path / "journal.jsonl")
    path = ivshmem.allocate(journal, tmp_path / "state", CLUSTER, SIZE_MIB, None)
    try:
        yield path
    finally:
        assert journal.undo_all() == []
        assert not path.exists()
        assert ivshmem.live_ids(tmp_path / "state") == {}


@pytest.fixture
def taps() -> Iterator[list[str]]:
    """A bridge with the host at .1 and two taps; all removed afterwards."""
    bridge, taps = f"hvib{PID % 100000}", [f"hvit{PID % 100000}{i}" for i in range(2)]
    routes = subprocess.run(["ip", "-4", "route", "show", f"{SUBNET}.0/24"], capture_output=True)
    if routes.stdout.strip():
        pytest.fail(f"{SUBNET}.0/24 is already routed on this host")
    try:
        ip("link", "add", bridge, "type", "bridge")
        ip("addr", "add", f"{SUBNET}.1/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        for tap in taps:
            ip("tuntap", "add", "dev", tap, "mode", "tap")
            ip("link", "set", tap, "master", bridge, "up")
        yield taps
    finally:
        for link in [*taps, bridge]:
            subprocess.run(["ip", "link", "del", link], capture_output=True)


@pytest.fixture
def guests() -> Iterator[list[Guest]]:
    made: list[Guest] = []
    yield made
    for guest in made:
        guest.kill()
    for guest in made:
        guest.disk.unlink(missing_ok=True)


def test_a_write_in_one_guest_is_read_in_the_other(
    artifacts: GuestArtifacts,
    region: Path,
    taps: list[str],
    guests: list[Guest],
    tmp_path: Path,
) -> None:
    key = ssh_key(tmp_path)
    pubkey = key.with_suffix(".pub").read_text()
    shared = ivshmem_args(RenderContext(ivshmem=(str(region), SIZE_MIB)))
    addresses = []
    for i, tap in enumerate(taps):
        name, address = f"shm{i}", f"{SUBNET}.{i + 2}"
        disk = node_disk(artifacts.disk, tmp_path / f"{name}.qcow2", "qcow2")
        guest = Guest(artifacts, disk, "qcow2", kernel_cmdline(name, f"{address}/24", MTU, pubkey))
        guests.append(guest)
        net = f"tap,id=n0,ifname={tap},script=no,downscript=no,vhost=off"
        mac = f"52:54:00:dc:00:0{i}"
        guest.start("-netdev", net, "-device", f"virtio-net-pci,netdev=n0,mac={mac}", *shared)
        addresses.append(address)
    for i, guest in enumerate(guests):
        guest.wait_ready(f"shm{i}")
    a, b = addresses

    done = ssh(key, a, "hpvc-shm info && hpvc-shm write 0 hello-from-a")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pci=0000:") and done.stdout.endswith(
        f" size={SIZE_MIB << 20}\n"
    ), done.stdout
    done = ssh(key, b, "hpvc-shm read 0 12")
    assert (done.returncode, done.stdout) == (0, "hello-from-a\n"), done.stderr
    with open(region, "rb") as f:  # the very file hpvc allocated
        assert f.read(12) == b"hello-from-a"

    done = ssh(key, b, "hpvc-shm write 4096 hello-from-b")  # and the other way round
    assert done.returncode == 0, done.stderr
    done = ssh(key, a, "hpvc-shm read 4096 12; hpvc-shm read 16777210 7")
    assert done.returncode == 2 and done.stdout == "hello-from-b\n", done.stdout
    assert done.stderr == "hpvc-shm: 7 bytes at offset 16777210: outside the 16777216-byte region\n"

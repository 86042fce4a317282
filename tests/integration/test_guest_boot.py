"""VM guests booted by QEMU from ``build_guest`` artifacts, to ``hpvc-ready``.

TCG is enough (no KVM needed): a guest reaches ``hpvc-ready`` in about 4 s here.
No guest gets user networking: the boot test has no NIC at all, and the ssh test
makes its own bridge (10.216.<pid>.0/24) with one tap per guest, and connects
only to its own guests' addresses there. Every QEMU is killed by its PID, and
every bridge, tap and disk removed, even when a test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpvc.image import DEFAULT_NAME, build_image
from hpvc.image.guest import DiskMode, GuestArtifacts, build_guest, kernel_cmdline, node_disk
from tests.helpers import requires

pytestmark = pytest.mark.integration

PID = os.getpid()
BOOT_TIMEOUT = 120.0
SUBNET = f"10.216.{PID % 250}"
MTU = 9000


def requires_tools(*tools: str) -> None:
    """Like ``requires`` for tools that ``make setup`` installs (QEMU, ssh): under
    ``HPVC_REQUIRE_ALL=1`` a missing one fails the test instead of skipping it."""
    for tool in tools:
        if shutil.which(tool):
            continue
        reason = f"{tool} not installed (make setup)"
        if os.environ.get("HPVC_REQUIRE_ALL") == "1":
            pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def artifacts() -> GuestArtifacts:
    requires("root", "debootstrap")
    requires_tools("qemu-system-x86_64", "qemu-img")
    return build_guest(build_image(DEFAULT_NAME))


class Guest:
    """One QEMU process booting a node; its serial console goes to a file."""

    def __init__(self, art: GuestArtifacts, disk: Path, fmt: DiskMode, cmdline: str) -> None:
        self.console = disk.with_suffix(".console")
        self.disk = disk
        argv = [
            "qemu-system-x86_64",
            "-accel", "tcg,thread=multi", "-cpu", "max", "-m", "512", "-smp", "1",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", str(art.kernel), "-initrd", str(art.initrd), "-append", cmdline,
            "-drive", f"file={disk},if=virtio,format={fmt}",
            "-serial", f"file:{self.console}",
        ]  # fmt: skip
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *net: str) -> None:
        with open(self.disk.with_suffix(".qemu-err"), "wb") as err:
            self.proc = subprocess.Popen(
                [*self.argv, *(net or ("-nic", "none"))],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def text(self) -> str:
        try:
            return self.console.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, name: str, timeout: float = BOOT_TIMEOUT) -> float:
        """Seconds from now until ``hpvc-ready <name>``; fails on hpvc-failed, exit, timeout."""
        assert self.proc is not None
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            text = self.text()
            if f"hpvc-ready {name}" in text:
                return time.monotonic() - started
            if "hpvc-failed" in text or self.proc.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"guest {name} not ready (qemu rc {self.proc.poll()}):\n{self.text()[-3000:]}")

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()  # by PID: Popen.kill signals exactly this process
        self.proc.wait()


@pytest.fixture
def guests(tmp_path: Path) -> Iterator[Callable[[GuestArtifacts, str, DiskMode, str], Guest]]:
    """Make guests with their own node disk in tmp_path; kill them and remove the disks."""
    made: list[Guest] = []

    def make(art: GuestArtifacts, name: str, mode: DiskMode, cmdline: str) -> Guest:
        disk = node_disk(art.disk, tmp_path / f"{name}.{mode}", mode)
        guest = Guest(art, disk, mode, cmdline)
        made.append(guest)
        return guest

    yield make
    for guest in made:
        guest.kill()
    for guest in made:
        guest.disk.unlink(missing_ok=True)


@pytest.mark.parametrize("mode", ["qcow2", "raw"])
def test_guest_boots_to_ready(
    artifacts: GuestArtifacts, guests: Callable[..., Guest], mode: str
) -> None:
    base_mtime = artifacts.disk.stat().st_mtime_ns
    guest = guests(artifacts, "testnode", mode, kernel_cmdline("testnode", None, None, None))
    guest.start()
    guest.wait_ready("testnode")
    text = guest.text()
    assert text.count("hpvc-ready testnode") == 1
    assert "hpvc-init:" not in text, text[-2000:]
    assert "Run /init as init process" in text
    assert artifacts.disk.stat().st_mtime_ns == base_mtime  # the base stays untouched


def test_a_failed_step_is_reported_and_announced(
    artifacts: GuestArtifacts, guests: Callable[..., Guest]
) -> None:
    # An address for eth0, but no NIC: hpvc-init says why, then hpvc-failed, not ready.
    cmdline = kernel_cmdline("testnode", None, None, None) + " hpvc.ip=10.216.0.2/24"
    guest = guests(artifacts, "testnode", "qcow2", cmdline)
    guest.start()
    started = time.monotonic()
    while "hpvc-failed testnode" not in guest.text():
        assert time.monotonic() - started < BOOT_TIMEOUT, guest.text()[-2000:]
        time.sleep(0.1)
    text = guest.text()
    assert "hpvc-init: eth0: set address: No such device" in text
    assert "hpvc-ready" not in text


# ---- two guests on a bridge, reached with ssh ------------------------------------


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def bridge() -> Iterator[tuple[str, list[str]]]:
    """A bridge with the host at .1 and two taps, MTU 9000; all removed afterwards."""
    requires("ip")
    name, taps = f"hvgb{PID % 100000}", [f"hvgt{PID % 100000}{i}" for i in range(2)]
    routes = subprocess.run(["ip", "-4", "route", "show", f"{SUBNET}.0/24"], capture_output=True)
    if routes.stdout.strip():
        pytest.fail(f"{SUBNET}.0/24 is already routed on this host")
    try:
        ip("link", "add", name, "mtu", str(MTU), "type", "bridge")
        ip("addr", "add", f"{SUBNET}.1/24", "dev", name)
        ip("link", "set", name, "up")
        for tap in taps:
            ip("tuntap", "add", "dev", tap, "mode", "tap")
            ip("link", "set", tap, "master", name, "mtu", str(MTU), "up")
        yield name, taps
    finally:
        for link in [*taps, name]:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        left = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
        assert not any(link in left.stdout for link in [*taps, name])


def ssh_key(directory: Path) -> Path:
    key = directory / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hpvc test", "-f", str(key)],
        check=True,
    )
    return key


def ssh(key: Path, address: str, command: str) -> subprocess.CompletedProcess[str]:
    argv = [
        "ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR", f"root@{address}", command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_two_guests_on_a_bridge_answer_ssh_and_power_off(
    artifacts: GuestArtifacts,
    guests: Callable[..., Guest],
    bridge: tuple[str, list[str]],
    tmp_path: Path,
) -> None:
    requires_tools("ssh", "ssh-keygen")
    key = ssh_key(tmp_path)
    pubkey = key.with_suffix(".pub").read_text()
    _, taps = bridge
    nodes = []
    for i, (mode, tap) in enumerate(zip(("qcow2", "raw"), taps, strict=True)):
        name, address = f"node{i}", f"{SUBNET}.{i + 2}"
        guest = guests(artifacts, name, mode, kernel_cmdline(name, f"{address}/24", MTU, pubkey))
        net = f"tap,id=n0,ifname={tap},script=no,downscript=no,vhost=off"
        guest.start("-netdev", net, "-device", f"virtio-net-pci,netdev=n0,mac=52:54:00:d8:00:0{i}")
        nodes.append((guest, name, address))
    for guest, name, _ in nodes:
        guest.wait_ready(name)

    first, second = nodes[0][2], nodes[1][2]
    done = ssh(
        key, first, f"hostname; cat /sys/class/net/eth0/mtu; ping -c1 -W5 -M do -s 8972 {second}"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["node0", str(MTU)]
    assert " 0% packet loss" in done.stdout
    keys = [ssh(key, a, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout for _, _, a in nodes]
    assert keys[0] and keys[1] and keys[0] != keys[1]  # every node made its own host key

    raw_guest = nodes[1][0]
    ssh(key, second, "kill -TERM 1")
    assert raw_guest.wait_exit(30) == 0, "SIGTERM to hpvc-init did not power the guest off"
    fsck = subprocess.run(["e2fsck", "-n", str(raw_guest.disk)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr  # synced and unmounted cleanly

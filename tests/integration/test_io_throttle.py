"""Block-I/O throttles of a node, measured with fio inside the node.

The cluster's state directory sits on a loop device made for this test, so the
nodes' writable layers (and the throttles hpvc puts on the state directory's
disk) are on a device nobody else uses.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.crun import container as ct
from hpvc.cluster import lifecycle, ops
from hpvc.store import Store
from tests.helpers import requires
from tests.integration.test_cluster import image_ready, leftovers

READ_BPS = 10_000_000
WRITE_BPS = 5_000_000


@pytest.fixture
def loop_store(tmp_path: Path) -> Iterator[Store]:
    requires("root", "crun", "fio")
    backing = tmp_path / "disk.img"
    with open(backing, "wb") as f:
        f.truncate(1 << 30)
    dev = subprocess.run(
        ["losetup", "-f", "--show", str(backing)], capture_output=True, text=True, check=True
    ).stdout.strip()
    mnt = tmp_path / "state"
    mnt.mkdir()
    try:
        subprocess.run(["mkfs.ext4", "-q", dev], check=True)
        subprocess.run(["mount", dev, str(mnt)], check=True)
        store = Store(mnt)
        yield store
        for name in store.names():
            lifecycle.teardown(store, name)
        assert store.host_journal().undo_all() == []  # bfq off the loop device again
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", dev], check=False)


def fio(name: str, store: Store, rw: str, seconds: int) -> float:
    cid = ct.container_id(name, "compute0")
    argv = ct.exec_argv(
        cid,
        [
            "fio",
            f"--name={rw}",
            "--filename=/var/tmp/fio.dat",
            f"--rw={rw}",
            "--bs=256k",
            "--size=16M",
            "--direct=1",
            "--ioengine=psync",
            f"--runtime={seconds}",
            "--time_based",
            "--output-format=json",
        ],
    )
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    return float(job["read" if rw == "read" else "write"]["bw_bytes"])


def test_throttles_hold_within_ten_percent(loop_store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"io{os.getpid() % 10000}"
    spec = tmp_path / "io.toml"
    spec.write_text(
        f'name = "{name}"\n[network]\nsubnet = "10.215.{os.getpid() % 250}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "compute"\nmemory = "256MiB"\n'
        f"io = {{ read_bps = {READ_BPS}, write_bps = {WRITE_BPS}, weight = 300 }}\n"
    )
    lifecycle.up(str(spec), loop_store)
    limits = ops.status(name, loop_store)["nodes"][0]["limits"]
    dev = os.stat(loop_store.root).st_dev
    key = f"{os.major(dev)}:{os.minor(dev)}"
    assert limits["io"]["read_bps"] == {key: READ_BPS}
    assert limits["io"]["write_bps"] == {key: WRITE_BPS}
    assert limits["io_weight"] == 300
    wrote = fio(name, loop_store, "write", 6)
    read = fio(name, loop_store, "read", 4)
    assert abs(wrote - WRITE_BPS) / WRITE_BPS < 0.10, f"write {wrote / 1e6:.2f} MB/s"
    assert abs(read - READ_BPS) / READ_BPS < 0.10, f"read {read / 1e6:.2f} MB/s"
    lifecycle.down(name, loop_store)
    assert leftovers(name) == []

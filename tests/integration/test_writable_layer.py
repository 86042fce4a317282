"""A container node's writable layer has a size limit of its own (spec `disk`).

The cluster's state directory is a small ext4 filesystem on a loop device made
for this test: a node writing far past its `disk` gets "No space left" inside
itself, while the state filesystem keeps its free space, the other node still
writes, and `hpvc down` removes everything, leaving no mount and no loop device.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle
from hpvc.host import layer
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import cli_env, image_ready, leftovers

STATE_MIB = 768  # the state filesystem
DISK_MIB = 96  # compute0's writable layer
WRITE_MIB = STATE_MIB  # what compute0 tries to write: more than the state filesystem holds
NET = f"10.226.{os.getpid() % 250}"


def _sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Store]:
    requires("root", "crun", "ip")
    backing = tmp_path / "state.img"
    with open(backing, "wb") as f:
        f.truncate(STATE_MIB << 20)
    dev = _sh("losetup", "-f", "--show", str(backing))
    mnt = tmp_path / "state"
    mnt.mkdir()
    store = Store(mnt)
    try:
        subprocess.run(["mkfs.ext4", "-q", "-m", "0", dev], check=True)
        subprocess.run(["mount", dev, str(mnt)], check=True)
        yield store
    finally:
        names = store.names() + [p.name for p in (mnt / "clusters").glob("*")]
        for name in set(names):
            lifecycle.teardown(store, name)
        store.host_journal().undo_all()
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", dev], check=False)


def loops_under(root: Path) -> list[str]:
    """Loop devices whose backing file is in ``root``."""
    found = []
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            backing = f.read_text().strip()
        except OSError:  # detached meanwhile
            continue
        if backing.startswith(f"{root}/"):
            found.append(f"{f.parts[3]} ({backing})")
    return found


def free_mib(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize >> 20


def hpvc(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "hpvc", *args]
    return subprocess.run(
        argv, env=cli_env(store), cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_node_fills_its_layer_not_the_state_disk(small_store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"wl{os.getpid() % 10000}"
    spec = tmp_path / f"{name}.toml"
    spec.write_text(
        f'name = "{name}"\nkind = "container"\n[network]\nsubnet = "{NET}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        'locality = "none"\n'
        f'[[nodes]]\nrole = "compute"\ncount = 2\nmemory = "256MiB"\ndisk = "{DISK_MIB}MiB"\n'
    )
    r = hpvc(small_store, "up", str(spec))
    assert r.returncode == 0, r.stderr
    before = free_mib(small_store.root)
    assert before > WRITE_MIB // 2, "the state filesystem is too full to show anything"

    big = f"dd if=/dev/zero of=/var/tmp/big bs=1M count={WRITE_MIB} conv=fsync"
    r = hpvc(small_store, "exec", name, "compute0", "--", "sh", "-c", big)
    assert r.returncode != 0 and "No space left" in r.stderr, r.stderr
    # The node's data stays within its layer: the state filesystem lost at most
    # the layer's size (plus slack for the journals), nowhere near WRITE_MIB.
    assert before - free_mib(small_store.root) <= DISK_MIB + 16
    image = small_store.node_dir(name, "compute0") / layer.IMAGE
    assert image.stat().st_blocks * 512 <= (DISK_MIB + 1) << 20

    # The other node, and the commands that need the state disk, still work.
    r = hpvc(small_store, "exec", name, "compute1", "--", "sh", "-c", "echo ok > /var/tmp/f")
    assert r.returncode == 0, r.stderr
    r = hpvc(small_store, "exec", name, "compute0", "--", "rm", "/var/tmp/big")
    assert r.returncode == 0, r.stderr
    r = hpvc(small_store, "down", name)
    assert r.returncode == 0, r.stderr
    assert leftovers(name) == [] and small_store.names() == []
    assert loops_under(small_store.root) == []

"""A container cluster's shared directory served over NFS by one of its nodes.

head0 runs NFS-Ganesha in its own network namespace; every node mounts the
export with hpvc-nfsfuse from its own namespace and sees it at /shared. A file
written on one node is read on another; ``status`` shows the export, its size
and each node's mount; a node whose server died says so; ``down`` leaves no
server, client, mount or loop device; ``keep = true`` keeps the data for the
next ``up``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.host import nfs_mount
from hpvc.store import Store
from tests.helpers import requires
from tests.integration.test_cluster import image_ready, leftovers, store
from tests.integration.test_writable_layer import loops_under

__all__ = ["store"]  # the fixture, shared with test_cluster

NET = f"10.227.{os.getpid() % 250}"


def spec(tmp_path: Path, name: str, shared: str) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "container"\n'
        f'[network]\nsubnet = "{NET}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        f"[shared]\n{shared}\n"
        '[[nodes]]\nrole = "head"\nmemory = "256MiB"\n'
        '[[nodes]]\nrole = "compute"\ncount = 2\nmemory = "256MiB"\n'
    )
    return str(p)


def in_node(name: str, node: str, script: str, store: Store) -> str:
    import subprocess

    r = subprocess.run(
        ops.exec_argv(name, node, ["/bin/sh", "-c", script], store),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert r.returncode == 0, f"{node}: {script}: {r.stderr}"
    return r.stdout


def our_processes(root: Path) -> list[str]:
    """Ganesha and hpvc-nfsfuse processes whose command line names ``root``."""
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(root) in cmd and ("ganesha" in cmd or "nfsfuse" in cmd):
            found.append(f"{p.name}: {cmd}")
    return found


def left_by(name: str, store: Store) -> list[str]:
    """What a cluster with an NFS shared directory could leave: its containers,
    namespaces and cgroups, NFS server and client processes, mounts, loop devices."""
    return [*leftovers(name), *our_processes(store.root), *mounts_under(store.root),
            *loops_under(store.root)]  # fmt: skip


def mounts_under(root: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if f" {root}/" in line]  # fmt: skip


@pytest.fixture
def nfs_ready() -> None:
    requires("root", "crun", "ip", "ganesha")
    image_ready()
    nfs_mount.client_binary()


def test_nfs_shared_directory_across_nodes(nfs_ready: None, store: Store, tmp_path: Path) -> None:
    name = f"nf{os.getpid() % 10000}"
    lifecycle.up(spec(tmp_path, name, 'server = "nfs"\nsize = "128MiB"'), store)
    try:
        # The same file through three nodes' own NFS clients.
        in_node(
            name, "compute0", "echo from-compute0 > /shared/hello && mkdir -m 1777 /shared/d", store
        )
        assert in_node(name, "compute1", "cat /shared/hello", store) == "from-compute0\n"
        assert "hello" in in_node(name, "head0", "ls /shared", store)
        # It is NFS through FUSE in the node, not a bind of a host folder.
        mounts = in_node(name, "compute1", "cat /proc/mounts", store)
        assert any(line.split()[1] == "/shared" and line.split()[2].startswith("fuse")
                   for line in mounts.splitlines()), mounts  # fmt: skip
        # A file written as an ordinary user keeps its owner on the server's disk.
        in_node(name, "compute0", "setpriv --reuid 1000 --regid 1000 --clear-groups"
                " sh -c 'echo u > /shared/d/user-file'", store)  # fmt: skip
        st = ops.status(name, store)
        sh = st["shared_dir"]
        assert sh["server"] == "nfs" and sh["node"] == "head0"
        assert sh["export"] == f"{NET}.2:/shared"
        assert 100 << 20 < sh["size_bytes"] <= 128 << 20
        assert set(sh["mounts"].values()) == {"ok"} and len(sh["mounts"]) == 3
        backing = Path(sh["backing"])
        assert (backing / "hello").read_text() == "from-compute0\n"
        assert (backing / "d" / "user-file").stat().st_uid == 1000
        # The server dies: every node's mount says so (and nothing hangs).
        pid = int((store.root / "clusters" / name / "nodes" / "head0" / "nfs-server" /
                   "ganesha.pid").read_text())  # fmt: skip
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        t0 = time.monotonic()
        mounts_after = ops.status(name, store)["shared_dir"]["mounts"]
        assert time.monotonic() - t0 < 20
        assert all(v != "ok" for v in mounts_after.values()), mounts_after
    finally:
        lifecycle.down(name, store)
    assert left_by(name, store) == []


def test_keep_true_outlives_down(nfs_ready: None, store: Store, tmp_path: Path) -> None:
    name = f"nk{os.getpid() % 10000}"
    path = spec(tmp_path, name, 'server = "nfs"\nkeep = true')
    lifecycle.up(path, store)
    try:
        in_node(name, "compute0", "echo kept > /shared/k", store)
    finally:
        lifecycle.down(name, store)
    assert our_processes(store.root) == [] and mounts_under(store.root) == []
    lifecycle.up(path, store)
    try:
        assert in_node(name, "compute1", "cat /shared/k", store) == "kept\n"
    finally:
        lifecycle.down(name, store)
    assert (store.root / "shared" / name / "k").read_text() == "kept\n"

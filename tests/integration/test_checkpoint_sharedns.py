"""Checkpoint and restore of container nodes sharing their cluster's PID and
IPC namespaces and /dev/shm (``locality = "shm"``, the default; issue 28,
docs/checkpoint.md "Nodes sharing namespaces").

Two nodes, two jobs between them: the TCP message counter of
test_checkpoint_container (a lost, doubled or reordered message stops it),
and a ping-pong through shared memory across the nodes: a pinger in compute0
and a ponger in head0 map the same file of the shared /dev/shm, the pinger
counts only once the ponger answered its last number. Both jobs are started
with ``hpvc exec`` and left in the background; they run under their node's
init (hpvc-nodeinit), so each node is one process tree. The cluster is
checkpointed with ``stop``, restored, and both jobs go on: the same
connection, the same shared pages between the two nodes, the same PIDs in the
shared namespace. Refused in one line, nothing frozen: an ``hpvc exec`` still
attached, and SysV IPC objects in the shared IPC namespace.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpvc.backends.crun.container import HOLDER_ENV
from hpvc.cluster import checkpoint as ck
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.restore import restore
from hpvc.errors import HpvcError
from hpvc.store import Store
from tests.integration.test_checkpoint_container import (
    CLIENT,
    SERVER,
    _background,
    _count,
    _goes_on,
    _sh,
)
from tests.integration.test_checkpoint_container import store as store  # the fixture
from tests.integration.test_cluster import cli_env, leftovers, spec_file

PINGER = """
import mmap, os, struct, time
fd = os.open("/dev/shm/hpvc-pp", os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 16)
m = mmap.mmap(fd, 16)
while True:
    a, b = struct.unpack_from("qq", m)
    if b == a:
        m[0:8] = struct.pack("q", a + 1)
        open("/root/pp.new", "w").write(str(a + 1)); os.rename("/root/pp.new", "/root/pp")
    time.sleep(0.002)
"""
PONGER = """
import mmap, os, struct, time
while not os.path.exists("/dev/shm/hpvc-pp"):
    time.sleep(0.01)
m = mmap.mmap(os.open("/dev/shm/hpvc-pp", os.O_RDWR), 16)
while True:
    a, b = struct.unpack_from("qq", m)
    if a != b:
        m[8:16] = struct.pack("q", a)
    time.sleep(0.002)
"""


def _pongs(store: Store, name: str) -> int:
    return _count(store, name, "compute0", "/root/pp")


def _pongs_go_on(store: Store, name: str, past: int = 0) -> int:
    return _goes_on(store, name, past, "compute0", "/root/pp")


def _jobs(store: Store, name: str) -> dict[str, str]:
    """PID -> parent PID and command of the python jobs, in the shared namespace."""
    out = _sh(store, name, "head0", "ps -o pid=,ppid=,args= -C python3")
    return {ln.split()[0]: " ".join(ln.split()[1:]) for ln in out.splitlines() if ln.strip()}


def _inits(store: Store, name: str) -> dict[str, str]:
    """Node -> the PID of its init, in the shared namespace."""
    out = {}
    for node in ("head0", "compute0"):
        # This shell's parent is its session, whose parent is the node's init.
        out[node] = _sh(store, name, node, "ps -o ppid= -p $(ps -o ppid= -p $$)").strip()
    return out


def test_nodes_sharing_namespaces_come_back_whole_with_their_jobs(
    store: Store, tmp_path: Path
) -> None:
    name = "ckns"
    lifecycle.up(spec_file(tmp_path, name, computes=1), store)  # locality "shm"
    _background(store, name, "compute0", SERVER)
    _background(store, name, "compute0", PINGER)
    time.sleep(0.5)
    _background(store, name, "head0", CLIENT)
    _background(store, name, "head0", PONGER)
    _goes_on(store, name)
    _pongs_go_on(store, name)
    jobs, inits = _jobs(store, name), _inits(store, name)
    assert len(jobs) == 4, jobs
    # Each job's parent is its node's init, not the shared namespace's (PID 1).
    assert sorted(j.split()[0] for j in jobs.values()) == sorted(
        [inits["head0"]] * 2 + [inits["compute0"]] * 2
    ), (jobs, inits)

    # An hpvc exec still attached is outside every node's tree: refused, nothing frozen.
    attached = subprocess.Popen(ops.exec_argv(name, "head0", ["sleep", "300"], store))
    try:
        time.sleep(1)
        done = _checkpoint_cli(store, name, tmp_path / "refused")
        assert done.returncode == 2, (done.stdout, done.stderr)
        errors = [ln for ln in done.stderr.splitlines() if ln.startswith("hpvc: ")]
        assert len(errors) == 1 and "sleep 300" in errors[0] and "attached" in errors[0], errors
    finally:
        attached.terminate()  # crun exec passes it on to the client, the client to sleep
        assert attached.wait(timeout=10) == 128 + 15
    # SysV IPC in the shared IPC namespace: refused, named.
    _sh(store, name, "head0", "ipcmk -M 4096 >/dev/null")
    done = _checkpoint_cli(store, name, tmp_path / "refused")
    assert done.returncode == 2 and "SysV IPC" in done.stderr, done.stderr
    _sh(store, name, "head0", "ipcrm --all=shm")
    assert store.get(name).status == "running"
    at = _pongs_go_on(store, name)  # not left frozen

    out = tmp_path / "ckpt"
    ck.checkpoint(name, out, stop=True, store=store)
    assert name not in store.names() and leftovers(name) == []
    assert (out / "nodes" / "head0" / "shm.tar").stat().st_size > 0  # the shared /dev/shm
    restore(out, store=store)
    assert _pongs(store, name) >= at
    assert _goes_on(store, name) > 0  # the same connection, no message lost
    assert _pongs_go_on(store, name, at) > at  # the two nodes share the pages again
    assert _jobs(store, name) == jobs and _inits(store, name) == inits  # the same PIDs
    assert _sh(store, name, "head0", "hostname").strip() == "head0"
    assert _sh(store, name, "compute0", "hostname").strip() == "compute0"
    lifecycle.down(name, store)
    assert leftovers(name) == []


def test_a_failed_restore_leaves_nothing_and_another_name_takes_the_cut(
    store: Store, tmp_path: Path
) -> None:
    """CRIU failing on the second node leaves nothing half-restored (neither
    the first node nor the new holder); under another name the nodes come
    back into the new cluster's shared namespace and /dev/shm."""
    old, new = "cknf", "cknn"
    lifecycle.up(spec_file(tmp_path, old, computes=1), store)
    _background(store, old, "compute0", PINGER)
    _background(store, old, "head0", PONGER)
    at = _pongs_go_on(store, old)
    out = tmp_path / "ckpt"
    ck.checkpoint(old, out, stop=True, store=store)
    with pytest.MonkeyPatch.context() as mp:  # CRIU fails on the second node
        mp.setenv("HPVC_FAIL_AT", "restore:compute0")
        with pytest.raises(HpvcError) as e:
            restore(out, store=store)
    assert e.value.exit_code == 1 and leftovers(old) == [] and old not in store.names()
    assert not _holders(old)  # the new holder went with the rest
    restore(out, name=new, store=store)
    assert _pongs_go_on(store, new, at) > at  # the shared page, in the new cluster's /dev/shm
    shm = store.root / "clusters" / new / "shm" / "hpvc-pp"
    assert shm.is_file()
    assert _holders(new) and not _holders(old)
    lifecycle.down(new, store)
    assert leftovers(new) == [] and not _holders(new)


def _holders(name: str) -> list[int]:
    """Live namespace holders of cluster ``name`` (by the variable they carry)."""
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"{HOLDER_ENV}={name}\0".encode() in env.read_bytes() + b"\0":
                found.append(int(env.parent.name))
        except OSError:
            continue
    return found


def _checkpoint_cli(store: Store, name: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpvc", "checkpoint", name, "--out", str(out)],
        capture_output=True,
        text=True,
        env=cli_env(store),
        timeout=120,
        check=False,
    )

"""Checkpoint and restore of container nodes through CRIU (issue 28,
docs/checkpoint.md "Containers").

Two container nodes (locality "none": each its own PID and IPC namespace),
a TCP message counter between them: the client in head0 sends its count,
the server in compute0 echoes it, the client checks every echo is the count
it sent (a message lost, doubled or reordered stops it with an error) and
writes the count to a file in its writable layer. The client is moved out
of its node's freezer cgroup first, as a job a Slurm step leaves running
sits in Slurm's (the cut moves it back). Mid-run the cluster is
checkpointed with ``stop`` (every node frozen, dumped, the cluster taken
down), restored, and the counter goes on from where it was over the same
connection; the node's SysV shared memory and /dev/shm come back too. Then:
CRIU failing mid-restore (``HPVC_FAIL_AT``) leaves nothing half-restored.
Nodes sharing namespaces (locality "shm"): test_checkpoint_sharedns.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.crun import container as ct
from hpvc.cluster import checkpoint as ck
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.restore import restore
from hpvc.errors import HpvcError
from hpvc.host import cgroupfs, cgroups, criu, nodeprocs, procfs
from hpvc.store import Store
from tests.helpers import requires
from tests.integration.test_cluster import clean_up, image_ready, leftovers, spec_file

SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7400)); s.listen(1); c, _ = s.accept()
while (d := c.recv(16)):
    c.sendall(d)
"""
CLIENT = """
import os, socket, time
c = socket.create_connection(("compute0", 7400)); n = 0
while True:
    n += 1
    c.sendall(b"%015d\\n" % n)
    got = b""
    while len(got) < 16:
        d = c.recv(16 - len(got))
        if not d:
            raise SystemExit("BAD: connection closed at %d" % n)
        got += d
    if int(got) != n:
        raise SystemExit("BAD: sent %d, echo %d" % (n, int(got)))
    open("/root/count.new", "w").write(str(n)); os.rename("/root/count.new", "/root/count")
    time.sleep(0.01)
"""
NONE = 'locality = "none"\n'


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    requires("root", "crun", "ip")
    if not criu.check().ok:  # not a skip: make setup installs CRIU 4.2 (scripts/setup-criu.sh)
        pytest.fail(f"CRIU cannot run here: {criu.check().error}")
    image_ready()
    s = Store(tmp_path / "state")
    yield s
    clean_up(s)


def _sh(store: Store, name: str, node: str, script: str) -> str:
    argv = ops.exec_argv(name, node, ["sh", "-c", script], store)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, (script[:60], done.stdout, done.stderr)
    return done.stdout


def _background(store: Store, name: str, node: str, code: str) -> None:
    q = code.replace("'", "'\\''")
    _sh(store, name, node, f"setsid python3 -c '{q}' </dev/null >>/root/job.log 2>&1 &")


def _count(store: Store, name: str, node: str = "head0", path: str = "/root/count") -> int:
    """The number a job keeps in ``path`` of ``node`` (0 before the first); fails
    on an error in the node's job log."""
    out = _sh(store, name, node, f"cat {path} 2>/dev/null; echo; cat /root/job.log")
    assert "BAD" not in out and "Error" not in out, out
    first = out.split("\n", 1)[0].strip()
    return int(first) if first.isdigit() else 0


def _goes_on(
    store: Store, name: str, past: int = 0, node: str = "head0", path: str = "/root/count"
) -> int:
    """Wait (30 s at most) until that number rises above ``past`` and what it was."""
    deadline = time.monotonic() + 30
    start = max(_count(store, name, node, path), past)
    while (now := _count(store, name, node, path)) <= start:
        assert time.monotonic() < deadline, f"the count in {node}:{path} stayed at {now}"
        time.sleep(0.2)
    return now


def _up_with_job(store: Store, tmp_path: Path, name: str, extra: str = NONE) -> None:
    lifecycle.up(spec_file(tmp_path, name, extra=extra, computes=1), store)
    _background(store, name, "compute0", SERVER)
    time.sleep(0.5)
    _background(store, name, "head0", CLIENT)
    _goes_on(store, name)


def test_two_connected_containers_checkpointed_torn_down_restored_keep_counting(
    store: Store, tmp_path: Path
) -> None:
    name = "ckcr"
    _up_with_job(store, tmp_path, name)
    # The client leaves head0's freezer cgroup, as a job a Slurm step left
    # running does (it stays in Slurm's): the cut moves it back, or the freeze
    # would not stop it and CRIU could not seize it (docs/checkpoint.md).
    init = ct.container_pid(ct.container_id(name, "head0"))
    client = [p for p in nodeprocs.tree(init) if (procfs.cmdline(p) or [""])[0] == "python3"]
    assert len(client) == 1, client
    top = cgroupfs.manager().dir("freezer", "")
    assert top is not None
    (top / "cgroup.procs").write_text(str(client[0]))
    assert nodeprocs.strays(init) == client
    # SysV shared memory in the node's IPC namespace, POSIX-style in its /dev/shm tmpfs.
    _sh(store, name, "head0", "ipcmk -M 65536 >/dev/null && echo kept >/dev/shm/hpvc-ckpt")
    out = tmp_path / "ckpt"
    _, m = ck.checkpoint(name, out, stop=True, store=store)
    assert name not in store.names() and leftovers(name) == []  # --stop: taken down
    assert {n.name for n in m.nodes} == {"head0", "compute0"}
    saved = int((out / "nodes" / "head0" / "crun-state.json").exists())
    assert saved and (out / "nodes" / "compute0" / "upper.tar").stat().st_size > 0
    restore(out, store=store)
    at_restore = _count(store, name)
    assert at_restore > 0  # the count from before the cut, from the restored layer and memory
    assert _goes_on(store, name, at_restore) > at_restore  # same connection, no message lost
    _sh(store, name, "compute0", "true")  # crun exec reaches a restored node
    assert _sh(store, name, "head0", "cat /dev/shm/hpvc-ckpt").strip() == "kept"
    assert "65536" in _sh(store, name, "head0", "ipcs -m")
    lifecycle.down(name, store)
    assert leftovers(name) == []


def test_criu_failing_mid_restore_leaves_nothing(store: Store, tmp_path: Path) -> None:
    name = "ckcf"
    _up_with_job(store, tmp_path, name)
    out = tmp_path / "ckpt"
    ck.checkpoint(name, out, stop=True, store=store)
    os.environ["HPVC_FAIL_AT"] = "restore:compute0"
    try:
        with pytest.raises(HpvcError) as e:
            restore(out, store=store)
    finally:
        del os.environ["HPVC_FAIL_AT"]
    assert e.value.exit_code == 1
    assert leftovers(name) == []
    assert cgroups.node_tasks(name, "head0") == [] and cgroups.node_tasks(name, "compute0") == []
    restore(out, store=store)  # the checkpoint is intact: it restores afterwards
    _goes_on(store, name)
    lifecycle.down(name, store)

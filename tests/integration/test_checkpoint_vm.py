"""Checkpoint and restore of a VM cluster with an MPI job inside (issue 28).

Two tiny guests (1 vCPU, 256 MiB, TCG here) run a long MPI ping-pong
(tests/data/mpi/pingpong.c: every answer checked, a known sum at the end),
started by ``hpvc run --detach``: mpirun inside one guest, its daemon on the
other through the guests' agents (hpvc.cluster.jobs). Mid-run the cluster is
checkpointed with --stop (taken down after the cut), restored, and the job
completes with the right result: no message was lost across the cut. Then
the refusals: a restore whose name or subnet is taken (exit 2, nothing
changed), a QEMU failing mid-restore (exit 1, nothing left), and
``checkpoint rm``.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.cluster import checkpoint as ck
from hpvc.cluster import checkpoint_format as cf
from hpvc.cluster import jobs, lifecycle, ops
from hpvc.cluster.restore import restore
from hpvc.errors import HpvcError, InputError
from hpvc.store import Store
from tests.helpers import requires
from tests.integration.test_cluster import clean_up, image_ready
from tests.integration.test_vm_cluster import vm_leftovers

ROUNDS, DELAY_US = 600, 20000  # about 12 s of ping-pong under TCG
OUT = "/root/.hpvc/jobs/1/out"  # the first detached job's output, in compute0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    requires("root", "qemu", "ip", "mpi")  # mpicc: libopenmpi-dev, beside mpirun
    s = Store(tmp_path / "state")
    yield s
    clean_up(s, lambda name: vm_leftovers(name, s))


def _spec(tmp_path: Path, name: str) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "vm"\n'
        f'[network]\nsubnet = "10.219.{os.getpid() % 250}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "compute"\ncount = 2\nvcpus = 1\nmemory = "256MiB"\n'
    )
    return str(p)


def _in(store: Store, name: str, node: str, script: str) -> str:
    """``sh -c script`` in a guest; its output (fails the test on an error)."""
    argv = ops.exec_argv(name, node, ["sh", "-c", script], store)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (script[:80], done.stdout, done.stderr)
    return done.stdout


def _wait_for(store: Store, name: str, pattern: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    out = ""
    while time.monotonic() < deadline:
        out = _in(store, name, "compute0", f"cat {OUT} 2>/dev/null || true")
        if re.search(pattern, out) or "BAD" in out:
            return out
        time.sleep(1.0)
    raise AssertionError(f"no {pattern!r} after {seconds} s: {out[-400:]}")


def _start_job(store: Store, name: str, tmp_path: Path) -> None:
    binary = tmp_path / "pingpong"
    src = Path(__file__).parents[1] / "data" / "mpi" / "pingpong.c"
    subprocess.run(["mpicc", "-O2", "-o", str(binary), str(src)], check=True)
    b64 = base64.b64encode(binary.read_bytes()).decode()
    for node in ("compute0", "compute1"):
        _in(
            store, name, node, f"echo {b64} | base64 -d > /root/pingpong && chmod +x /root/pingpong"
        )
    job = ops.run_detached(name, ["/root/pingpong", str(ROUNDS), str(DELAY_US)], store=store)
    assert (job.job, job.node) == (1, "compute0")


def _cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpvc", *argv], capture_output=True, text=True, env=env, check=False
    )


def test_mpi_job_completes_after_checkpoint_down_restore(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"ck{os.getpid() % 10000}"
    lifecycle.up(_spec(tmp_path, name), store)
    _start_job(store, name, tmp_path)
    before = _wait_for(store, name, r"round [1-9]\d*00\n", 120)  # well under way
    assert "DONE" not in before, before
    dest = tmp_path / "ck1"
    path, m = ck.checkpoint(name, dest, stop=True, store=store)
    assert path == dest and m.stopped and [n.name for n in m.nodes] == ["compute0", "compute1"]
    assert store.load(name) is None and vm_leftovers(name, store) == []  # --stop: all gone
    back = cf.read_manifest(dest)
    cf.verify(dest, back)
    assert all(n.image_digest and n.kind == "vm" for n in back.nodes)
    assert {f.path.rsplit("/", 1)[-1] for f in back.nodes[0].files} >= {"state.bin", "disk.qcow2"}
    saved_rounds = max(int(r) for r in re.findall(r"round (\d+)", before))

    # A QEMU failing mid-restore: exit 1, everything restore made removed.
    os.environ["HPVC_FAIL_AT"] = "restore:compute1"
    try:
        with pytest.raises(HpvcError, match="injected failure") as failed:
            restore(dest, store=store)
    finally:
        del os.environ["HPVC_FAIL_AT"]
    assert failed.value.exit_code == 1
    assert store.load(name) is None and vm_leftovers(name, store) == []

    rec = restore(dest, store=store)
    assert rec.status == "running"
    plan = rec.the_plan()
    assert {(n.name, n.ip, n.mac) for n in plan.nodes} == {(n.name, n.ip, n.mac) for n in m.nodes}
    out = _wait_for(store, name, r"DONE \d+ \d+", 240)
    assert f"DONE {ROUNDS} {ROUNDS * ROUNDS}\n" in out, out[-400:]
    assert "BAD" not in out
    ended = jobs.wait(store, name, 1, poll_s=0.5)  # mpirun's exit code, kept in the guest
    assert (ended.state, ended.exit_code) == ("exited", 0), ended
    # The job went on from where it was saved, not from the start.
    assert out.count("round 0\n") == 1 and saved_rounds >= 100

    # The name taken, then (another name) the subnet taken: exit 2, nothing changed.
    with pytest.raises(InputError, match="already exists"):
        restore(dest, store=store)
    with pytest.raises(InputError, match="overlaps"):
        restore(dest, "other", store=store)
    assert store.names() == [name]
    lifecycle.down(name, store)
    assert vm_leftovers(name, store) == []
    env = {**os.environ, "HPVC_STATE_DIR": str(store.root)}
    listed = _cli("checkpoint", "ls", str(tmp_path), env=env)
    assert listed.returncode == 0 and str(dest) in listed.stdout and name in listed.stdout
    assert _cli("checkpoint", "rm", str(dest), env=env).returncode == 0
    assert not dest.exists()

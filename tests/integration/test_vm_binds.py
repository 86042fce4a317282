"""A site's binds in a VM guest, served by virtiofsd with the job's user's rights.

One small guest (TCG, 1 vCPU, 256 MiB) whose cluster record carries a bind
and a job user, as a Slurm share's does (``hpvc.slurm.node`` passes them to
``lifecycle.up_spec``; the same through a real job:
tests/integration/test_slurm_vm_binds.py). In the guest, whose shell is root:
the user's own 0600 file reads, another user's 0600 file does not, a new file
belongs to the user on the host; on the host the daemon runs as the user;
``down`` leaves no daemon, socket or folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpvc.bench.slurm.cluster import Submitter
from hpvc.cluster import lifecycle
from hpvc.host import procfs, virtiofsd
from hpvc.spec import read_spec
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import cli_env, image_ready

pytestmark = pytest.mark.integration

PID = os.getpid()


@dataclass
class Guest:
    name: str
    store: Store
    bind: Path
    user: Submitter


def _spec(tmp: Path, name: str) -> Path:
    p = tmp / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "vm"\n'
        f'[network]\nsubnet = "10.231.{PID % 250}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "compute"\ncount = 1\nvcpus = 1\nmemory = "256MiB"\n'
    )
    return p


def _file(path: Path, text: str, owner: Submitter, mode: int) -> None:
    path.write_text(text)
    os.chown(path, owner.uid, owner.gid)
    os.chmod(path, mode)


def hpvc(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**cli_env(store), "HPVC_ACCEL": "tcg"}
    return subprocess.run(
        [sys.executable, "-m", "hpvc", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def daemons(name: str) -> list[int]:
    return [
        p
        for p in (int(d) for d in os.listdir("/proc") if d.isdigit())
        if procfs.environ(p).get(virtiofsd.MARK_ENV, "").startswith(f"{name}/")
    ]


@pytest.fixture(scope="module")
def guest(tenants: tuple[Submitter, Submitter]) -> Iterator[Guest]:
    requires("root", "qemu", "ip")
    image_ready()
    me, other = tenants
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-vmbinds-"))
    os.chmod(tmp, 0o755)  # the tenants reach the bind below it
    bind = tmp / "home"
    bind.mkdir(mode=0o755)
    (bind / "me").mkdir()
    os.chown(bind / "me", me.uid, me.gid)
    _file(bind / "me" / "mine.txt", "mine\n", me, 0o600)
    _file(bind / "theirs.txt", "theirs\n", other, 0o600)
    store = Store(tmp / "state")
    name = f"vb{PID % 10000}"
    spec, doc = read_spec(str(_spec(tmp, name)))
    user = {"uid": me.uid, "gid": me.gid, "name": me.name}
    os.environ["HPVC_ACCEL"] = "tcg"
    try:
        lifecycle.up_spec(spec, doc, str(tmp), store, binds=(str(bind),), user=user, tenant=True)
        yield Guest(name, store, bind, me)
    finally:
        os.environ.pop("HPVC_ACCEL", None)
        hpvc(store, "down", name)
        shutil.rmtree(tmp, ignore_errors=True)


def in_guest(g: Guest, script: str) -> subprocess.CompletedProcess[str]:
    return hpvc(g.store, "exec", g.name, "compute0", "--", "sh", "-c", script)


def test_the_guest_root_sees_what_the_user_may_see(guest: Guest) -> None:
    r = in_guest(guest, f"id -u; cat {guest.bind}/me/mine.txt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["0", "mine"]
    r = in_guest(guest, f"cat {guest.bind}/theirs.txt")
    assert r.returncode != 0 and "theirs" not in r.stdout
    assert "Permission denied" in r.stdout + r.stderr


def test_a_file_the_guest_makes_is_the_users_on_the_host(guest: Guest) -> None:
    r = in_guest(guest, f"echo made > {guest.bind}/me/made.txt && mount | grep virtiofs")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"hpvcfs0 on {guest.bind} type virtiofs" in r.stdout
    assert "nosuid" in r.stdout and "nodev" in r.stdout
    st = (guest.bind / "me" / "made.txt").stat()
    assert (st.st_uid, st.st_gid) == (guest.user.uid, guest.user.gid)
    assert (guest.bind / "me" / "made.txt").read_text() == "made\n"
    # Outside the user's rights nothing is made, root's shell or not.
    r = in_guest(guest, f"echo x > {guest.bind}/rootsfile")
    assert r.returncode != 0 and not (guest.bind / "rootsfile").exists()


def test_the_daemon_runs_as_the_user_and_down_leaves_nothing(guest: Guest) -> None:
    pids = daemons(guest.name)
    assert pids, "no virtiofsd of the cluster runs"
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
        assert set(uids) == {str(guest.user.uid)}, status
    run = guest.store.layout.node_run_dir(guest.name, "compute0")
    assert (run / "hpvcfs0.sock").exists()
    assert (run.stat().st_mode & 0o777) == 0o700 and run.stat().st_uid == 0
    r = hpvc(guest.store, "down", guest.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert daemons(guest.name) == []
    assert not run.exists()

"""The host pieces of a cluster's shared directory: NFS-Ganesha in one network
namespace, hpvc-nfsfuse mounting it from another, on a private bridge.

A file made through the mount by root and by uid 1000 lands in the backing
folder with its owner (root squashed to nobody: a tenant's server); rename,
unlink and mkdir go through; an address on the bridge outside the exported
subnet cannot mount (exit 2, one line naming the server, the export and
why); a server that stops answering, then one that is killed, makes reads
fail and ``health`` say so, in bounded time; undoing the journal leaves no
server, client, mount, namespace or bridge. And the ext4 loop backing keeps
its data across a second ``backing`` only when asked to. A mount asked to
wait for its server (a Slurm job's server on another host) mounts once a
late server answers, and names one that never does.

All traffic stays on the bridge and in the namespaces the test makes; all of
it is removed, also when a check fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpvc.errors import HpvcError, InputError
from hpvc.host import net, nfs_backing, nfs_mount, nfs_server, procfs
from hpvc.host.journal import Journal
from tests.helpers import ROOT, requires

SUBNET = "10.231.7.0/25"  # exported to; the bridge's link is the /24
SERVER, CLIENT, OUTSIDER = "10.231.7.1", "10.231.7.2", "10.231.7.200"
USER = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups"]


def _need(what: str, missing: bool) -> None:
    if missing:
        reason = f"{what} not installed (make setup)"
        if os.environ.get("HPVC_REQUIRE_ALL") == "1":
            pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def client() -> Path:
    """hpvc-nfsfuse, built from this checkout."""
    requires("root", "ip")
    _need("nfs-ganesha", shutil.which("ganesha.nfsd") is None)
    _need("fuse3", shutil.which("fusermount3") is None or not os.path.exists("/dev/fuse"))
    _need("libfuse3-dev/libnfs-dev", not Path("/usr/include/nfsc/libnfs.h").exists())
    b = subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "native", "nfsfuse")],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert b.returncode == 0, b.stderr
    return nfs_mount.client_binary()


@dataclass
class Bed:
    tmp: Path
    journal: Journal
    bridge: str
    netns: dict[str, str]  # role -> name under /run/netns


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A cgroup of the test's own (pids controller: v1 here, else the v2 tree)."""
    base = Path("/sys/fs/cgroup/pids")
    if not (base / "cgroup.procs").exists():
        base = Path("/sys/fs/cgroup")
    cg = base / f"nfstest-{os.getpid()}"
    cg.mkdir()
    try:
        yield cg
    finally:
        deadline = time.monotonic() + 5
        while (cg / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)  # zombies not reaped yet
        cg.rmdir()


@pytest.fixture
def bed(client: Path, cgroup: Path) -> Iterator[Bed]:
    """A bridge and three namespaces on it: server, client, outsider; a folder
    uid 1000 can reach (pytest's own is root's alone). Undone before the
    cgroup is removed (the server runs in it)."""
    tag = f"nfst{os.getpid() % 100000}"
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-nfs-test-"))
    tmp.chmod(0o755)
    b = Bed(tmp, Journal(tmp / "journal"), net.short_ifname("nfsb", tag), {})
    try:
        net.ensure_bridge(b.journal, b.bridge, None, 24, 1500)
        for i, (role, address) in enumerate(
            (("server", SERVER), ("client", CLIENT), ("outsider", OUTSIDER))
        ):
            b.netns[role] = f"{tag}-{role}"
            net.create_netns(b.journal, b.netns[role])
            net.add_node_link(
                b.journal, bridge=b.bridge, netns=b.netns[role],
                host_ifname=net.short_ifname("nfsv", tag, role), mtu=1500, address=address,
                prefixlen=24, mac=f"02:00:0a:e7:07:{i + 1:02x}", gateway=SERVER,
            )  # fmt: skip
        yield b
    finally:
        left = b.journal.undo_all()
        for ns in b.netns.values():  # only if the undo above failed half-way
            net.nsenter.remove(f"/run/netns/{ns}")
        if not left:
            shutil.rmtree(tmp)
        assert left == [], left


def as_user(script: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*USER, "/bin/sh", "-c", script], capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def mounted_at(path: Path) -> bool:
    return any(line.split()[4] == str(path)
               for line in Path("/proc/self/mountinfo").read_text().splitlines())  # fmt: skip


def group_alive(pgid: int) -> bool:
    """Does a live (not zombie) process remain in process group ``pgid``?"""
    for p in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if (
                os.getpgid(int(p.name)) == pgid
                and (p / "stat").read_text().rsplit(")")[1][1] != "Z"
            ):
                return True
    return False


def test_nfs_server_and_client(bed: Bed, client: Path, cgroup: Path) -> None:
    export = nfs_backing.backing(bed.journal, path=bed.tmp / "export", size_mib=None, keep=False)
    assert export.stat().st_mode & 0o7777 == 0o1777
    pid = nfs_server.start(
        bed.journal, netns=bed.netns["server"], cgroup_procs=cgroup / "cgroup.procs",
        folder=bed.tmp / "server", export_dir=export, subnet=SUBNET, address=SERVER,
        root_squash=True, timeout_s=30,
    )  # fmt: skip
    started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    assert nfs_server.alive(pid, started)
    # Ganesha and its rpcbind run in the caller's cgroup, in the server's namespace.
    assert str(pid) in (cgroup / "cgroup.procs").read_text().split()
    assert len((cgroup / "cgroup.procs").read_text().split()) == 2
    assert (
        os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{bed.netns['server']}").st_ino
    )
    mnt, pidfile = bed.tmp / "mnt", bed.tmp / "client.pid"
    cpid = nfs_mount.mount(
        bed.journal, netns=bed.netns["client"], server=SERVER, export=nfs_server.PSEUDO,
        mountpoint=mnt, pidfile=pidfile, timeout_s=30, rpc_timeout_s=2,
    )  # fmt: skip
    assert mounted_at(mnt) and nfs_mount.health(mnt) is None
    # The client's NFS connection lives in the client's namespace, not the host's.
    assert (
        os.stat(f"/proc/{cpid}/ns/net").st_ino
        == os.stat(f"/run/netns/{bed.netns['client']}").st_ino
    )

    # Root (squashed: a tenant's server) and uid 1000, each owning what they make.
    (mnt / "by-root").write_text("root's\n")
    r = as_user(f"echo user > {mnt}/by-user && mkdir {mnt}/d && mv {mnt}/by-user {mnt}/d/u"
                f" && echo gone > {mnt}/tmp && rm {mnt}/tmp && ls {mnt}/d")  # fmt: skip
    assert r.returncode == 0 and r.stdout == "u\n", r.stderr
    assert (export / "by-root").read_text() == "root's\n"
    assert (export / "by-root").stat().st_uid == nfs_server.ANON_ID
    assert (export / "d" / "u").read_text() == "user\n"
    assert (export / "d").stat().st_uid == 1000 and (export / "d" / "u").stat().st_uid == 1000
    assert not (export / "by-user").exists() and not (export / "tmp").exists()
    # The server checks permissions: uid 1000 may not touch root's (nobody's) file.
    r = as_user(f"echo x >> {mnt}/by-root")
    assert r.returncode != 0 and "Permission denied" in r.stderr

    # An address outside the exported subnet cannot mount.
    denied = bed.tmp / "denied"
    denied.mkdir()
    r = subprocess.run(
        [str(client), "--netns", f"/run/netns/{bed.netns['outsider']}", "--server", SERVER,
         "--export", nfs_server.PSEUDO, "--pidfile", str(bed.tmp / "denied.pid"), str(denied)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert f"cannot mount {SERVER}:{nfs_server.PSEUDO}: " in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not mounted_at(denied)

    # A server that stops answering: reads fail after the RPC timeout (2 s).
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = subprocess.run(["cat", str(mnt / "d" / "u")], capture_output=True, text=True,
                           timeout=20, check=False)  # fmt: skip
        assert r.returncode != 0 and "timed out" in r.stderr, r
        assert time.monotonic() - t0 < 10
        t0 = time.monotonic()
        assert (nfs_mount.health(mnt, timeout_s=2) or "").startswith("server not answering")
        assert time.monotonic() - t0 < 3
    finally:
        os.kill(pid, signal.SIGCONT)
    assert nfs_mount.health(mnt) is None  # answering again

    # A killed server: reads fail at once, health says so, nothing hangs.
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    t0 = time.monotonic()
    r = subprocess.run(["cat", str(mnt / "d" / "u")], capture_output=True, text=True,
                       timeout=20, check=False)  # fmt: skip
    assert r.returncode != 0 and "Input/output error" in r.stderr, r
    reason = nfs_mount.health(mnt, timeout_s=2)
    assert reason is not None and reason.startswith("server not answering"), reason
    assert time.monotonic() - t0 < 5

    # The journal undoes it all: no server (nor its rpcbind), client, mount, namespace.
    assert bed.journal.undo_all() == []
    assert not group_alive(pid) and not procfs.running(cpid)
    assert not mounted_at(mnt) and not mnt.exists() and not export.exists()
    assert nfs_mount.health(mnt) == "not mounted"
    for ns in bed.netns.values():
        assert not Path(f"/run/netns/{ns}").exists()


def loops_of(image: Path) -> list[str]:
    found = []
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if f.read_text().strip().startswith(str(image)):
                found.append(f.parts[3])
    return found


def test_a_mount_waits_for_a_late_server_and_names_one_that_never_answers(
    bed: Bed, cgroup: Path
) -> None:
    """A Slurm job's nodes on other hosts than the server's (docs/slurm.md):
    the mount is asked again until the server answers; a server that never
    does gives one error naming it and its node, and nothing mounted."""
    never = bed.tmp / "never"
    with pytest.raises(HpvcError) as e:
        nfs_mount.mount(
            bed.journal, netns=bed.netns["client"], server=SERVER, export=nfs_server.PSEUDO,
            mountpoint=never, pidfile=bed.tmp / "never.pid", timeout_s=10, wait_s=2,
            server_name="head0, the NFS server's node",
        )  # fmt: skip
    line = e.value.line()
    assert f"the server {SERVER} (head0, the NFS server's node) did not answer within 2 s" in line
    assert "\n" not in line and not mounted_at(never)

    export = nfs_backing.backing(bed.journal, path=bed.tmp / "export", size_mib=None, keep=False)
    mnt, pidfile = bed.tmp / "mnt", bed.tmp / "client.pid"

    # The server starts only after the client has begun asking.
    def serve_later() -> None:
        time.sleep(1.5)
        nfs_server.start(
            bed.journal, netns=bed.netns["server"], cgroup_procs=cgroup / "cgroup.procs",
            folder=bed.tmp / "server", export_dir=export, subnet=SUBNET, address=SERVER,
            root_squash=True, timeout_s=30,
        )  # fmt: skip

    late = threading.Thread(target=serve_later)
    late.start()
    try:
        cpid = nfs_mount.mount(
            bed.journal, netns=bed.netns["client"], server=SERVER, export=nfs_server.PSEUDO,
            mountpoint=mnt, pidfile=pidfile, timeout_s=10, wait_s=60,
        )  # fmt: skip
    finally:
        late.join()
    assert procfs.running(cpid) and mounted_at(mnt) and nfs_mount.health(mnt) is None
    (mnt / "late").write_text("served\n")
    assert (export / "late").read_text() == "served\n"


def test_loop_backing_keep(tmp_path: Path) -> None:
    requires("root")
    _need("loop devices", not os.path.exists("/dev/loop-control"))
    # keep=False: a 64 MiB file system, gone (image, mount point, loop) after the undo.
    j = Journal(tmp_path / "j1")
    try:
        p = nfs_backing.backing(j, path=tmp_path / "scratch", size_mib=64, keep=False)
        assert os.path.ismount(p) and p.stat().st_mode & 0o7777 == 0o1777
        st = os.statvfs(p)
        assert 50 << 20 < st.f_blocks * st.f_frsize <= 64 << 20
        (p / "data").write_text("scratch")
    finally:
        assert j.undo_all() == []
    image = nfs_backing.image_of(tmp_path / "scratch")
    assert not os.path.ismount(p) and not p.exists() and not image.exists()
    assert loops_of(image) == []

    # keep=True: unmounted by the undo, the data back with the next backing().
    home, j2, j3 = tmp_path / "home", Journal(tmp_path / "j2"), Journal(tmp_path / "j3")
    try:
        nfs_backing.backing(j2, path=home, size_mib=64, keep=True)
        (home / "data").write_text("kept")
        assert j2.undo_all() == []
        assert not os.path.ismount(home) and nfs_backing.image_of(home).exists()
        assert loops_of(nfs_backing.image_of(home)) == []
        nfs_backing.backing(j3, path=home, size_mib=64, keep=True)
        assert os.path.ismount(home) and (home / "data").read_text() == "kept"
    finally:
        assert j2.undo_all() == [] and j3.undo_all() == []
    assert not os.path.ismount(home) and loops_of(nfs_backing.image_of(home)) == []

    # A plain folder: removed with keep=False, left with keep=True.
    j4 = Journal(tmp_path / "j4")
    plain = nfs_backing.backing(j4, path=tmp_path / "plain", size_mib=None, keep=True)
    (plain / "f").write_text("x")
    assert j4.undo_all() == [] and (plain / "f").read_text() == "x"


def test_an_image_a_guest_wrote_is_never_mounted_by_the_host(tmp_path: Path) -> None:
    """Issue 25 item 10: a kept share's ext4 image, written by a VM guest, is a
    tenant's bytes; the next container cluster of that name used to loop-mount it
    in the host kernel. Now that is refused before anything is made."""
    requires("root")
    _need("loop devices", not os.path.exists("/dev/loop-control"))
    _need("debugfs", shutil.which("debugfs", path="/usr/sbin:/sbin:/usr/bin") is None)
    home = tmp_path / "shared" / "c1"
    image = nfs_backing.image_of(home)
    home.parent.mkdir()
    vm, ct, ct2 = Journal(tmp_path / "vm"), Journal(tmp_path / "ct"), Journal(tmp_path / "ct2")
    try:
        # A VM cluster with keep = true: its image, handed to its server guest ...
        nfs_backing.disk_image(vm, image=image, size_mib=32, keep=True)
        assert nfs_backing.writer(image) == "guest"
        # ... which writes in it what it likes (here: a file, as any guest would).
        payload = tmp_path / "payload"
        payload.write_text("from the guest")
        debugfs = shutil.which("debugfs", path="/usr/sbin:/sbin:/usr/bin")
        subprocess.run([str(debugfs), "-w", "-R", f"write {payload} p", str(image)], check=True)
        assert vm.undo_all() == [] and image.exists()  # down: kept
        # A container cluster of the same name, keep = true, a size: the old mount path.
        with pytest.raises(InputError) as refused:
            nfs_backing.backing(ct, path=home, size_mib=32, keep=True)
        line = str(refused.value)
        assert refused.value.exit_code == 2 and "\n" not in line
        assert "last written by a VM guest" in line and "backend qemu" in line, line
        assert ct.entries() == [] and not home.exists()  # nothing made ...
        assert loops_of(image) == []  # ... and nothing mounted
        # Unrecorded (an older hpvc's kept image): refused the same way.
        os.removexattr(image, nfs_backing.WRITER)
        with pytest.raises(InputError, match="unrecorded writer"):
            nfs_backing.backing(ct, path=home, size_mib=32, keep=True)
        assert ct.entries() == [] and not home.exists() and loops_of(image) == []
        # An image the host made is marked so and attached again; once a guest has
        # had it, it is not.
        image.unlink()
        nfs_backing.backing(ct, path=home, size_mib=32, keep=True)
        assert nfs_backing.writer(image) == "host" and os.path.ismount(home)
        assert ct.undo_all() == [] and not os.path.ismount(home)
        nfs_backing.backing(ct2, path=home, size_mib=32, keep=True)
        assert os.path.ismount(home)
        assert ct2.undo_all() == []
        nfs_backing.disk_image(vm, image=image, size_mib=32, keep=True)
        assert nfs_backing.writer(image) == "guest"
        with pytest.raises(InputError, match="last written by a VM guest"):
            nfs_backing.backing(ct2, path=home, size_mib=32, keep=True)
    finally:
        assert ct.undo_all() == [] and ct2.undo_all() == [] and vm.undo_all() == []
    assert not os.path.ismount(home) and loops_of(image) == []

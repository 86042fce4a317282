"""hpvc-nfsfuse writes behind (native/nfsfuse/writebehind.c), and keeps an NFS
client's promises while it does.

On the bed of test_nfs_host (a bridge, a server and a client namespace, all
removed after the test): a write to a server that stopped answering returns
at once, and the close of the file reports the failure (a file opened
O_SYNC or O_DIRECT: the write itself fails); writes of the same
bytes land in the order they were made, even with several in flight; the
data of a long sequential write lands whole; a full shared directory says
"No space left on device" (the server's own error, which the client used to
turn into "Bad address"). A file opened only to write bypasses the node's
page cache, and a reader of the file that has it open sees the new bytes.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from hpvc.host import nfs_backing, nfs_mount, nfs_server
from tests.integration.test_nfs_host import (  # noqa: F401 (fixtures)
    SERVER,
    SUBNET,
    Bed,
    bed,
    cgroup,
    client,
)

# Writes through the mount, in a child (a hang would stop at its timeout):
# "stop": one 1 MiB write while the server is stopped, then close ("syncstop",
# "directstop": the file opened O_SYNC, O_DIRECT);
# "order": the same MiB written A, B, A, ... and the last must win;
# "stream": 32 distinct MiB in a row; "fill": write until the disk is full.
WRITER = r"""
import mmap, os, signal, sys
mode, path = sys.argv[1], sys.argv[2]
extra = {"syncstop": os.O_SYNC, "directstop": os.O_DIRECT}.get(mode, 0)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | extra, 0o644)
try:
    if mode in ("stop", "syncstop", "directstop"):
        data = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT wants
        os.kill(int(sys.argv[3]), signal.SIGSTOP)  # the server stops, the file open
        print("wrote", os.write(fd, data), flush=True)
    elif mode == "order":
        for i in range(41):
            os.pwrite(fd, (b"A" if i % 2 == 0 else b"B") * (1 << 20), 0)
    elif mode == "stream":
        for i in range(32):
            os.write(fd, bytes([i]) * (1 << 20))
    elif mode == "fill":
        while True:
            os.write(fd, b"f" * (1 << 20))
except OSError as e:
    print("write:", e.strerror, flush=True)
    sys.exit(3)
finally:
    try:
        os.close(fd)
    except OSError as e:
        print("close:", e.strerror, flush=True)
        sys.exit(4)
"""


def write(mode: str, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WRITER, mode, str(path), *extra],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def served(bed: Bed, cgroup: Path, rpc_timeout_s: int) -> tuple[Path, Path, int]:  # noqa: F811
    """A 64 MiB export served in the bed's server namespace and mounted in
    its client's: (the export folder, the mount point, the server's pid)."""
    export = nfs_backing.backing(bed.journal, path=bed.tmp / "export", size_mib=64, keep=False)
    pid = nfs_server.start(
        bed.journal, netns=bed.netns["server"], cgroup_procs=cgroup / "cgroup.procs",
        folder=bed.tmp / "server", export_dir=export, subnet=SUBNET, address=SERVER,
        root_squash=False, timeout_s=30,
    )  # fmt: skip
    mnt = bed.tmp / "mnt"
    nfs_mount.mount(
        bed.journal, netns=bed.netns["client"], server=SERVER, export=nfs_server.PSEUDO,
        mountpoint=mnt, pidfile=bed.tmp / "client.pid", timeout_s=30,
        rpc_timeout_s=rpc_timeout_s,
    )  # fmt: skip
    return export, mnt, pid


def test_writes_go_behind_and_report_their_errors(bed: Bed, cgroup: Path) -> None:  # noqa: F811
    export, mnt, pid = served(bed, cgroup, rpc_timeout_s=2)

    # The server stops answering with the file open: the write is answered
    # (it was sent, not yet answered); close waits for it and reports it.
    try:
        r = write("stop", mnt / "stopped", str(pid))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert r.stdout.splitlines() == [f"wrote {1 << 20}", "close: Input/output error"], r
    assert r.returncode == 4
    assert nfs_mount.health(mnt) is None  # answering again

    # O_SYNC, O_DIRECT: a write is answered only once the server has it, so
    # here it fails.
    for mode in ("syncstop", "directstop"):
        try:
            r = write(mode, mnt / f"stopped-{mode}", str(pid))
        finally:
            os.kill(pid, signal.SIGCONT)
        assert r.returncode == 3 and r.stdout.splitlines() == ["write: Input/output error"], r
        assert nfs_mount.health(mnt) is None

    # Writes of the same bytes, several in flight: the last one made wins.
    r = write("order", mnt / "order")
    assert r.returncode == 0, r
    assert (export / "order").read_bytes() == b"A" * (1 << 20)

    # A stream of distinct MiB lands whole and in place.
    r = write("stream", mnt / "stream")
    assert r.returncode == 0, r
    want = hashlib.sha256(b"".join(bytes([i]) * (1 << 20) for i in range(32))).hexdigest()
    assert hashlib.sha256((export / "stream").read_bytes()).hexdigest() == want
    (mnt / "stream").unlink()
    (mnt / "order").unlink()

    # A full shared directory: the server's own error, on a write or the close.
    r = write("fill", mnt / "fill")
    assert r.returncode in (3, 4), r
    assert r.stdout.strip().endswith("No space left on device"), r
    (mnt / "fill").unlink()
    (mnt / "after").write_text("room again\n")
    assert (export / "after").read_text() == "room again\n"


# A reader holds the file open (then its old bytes cached); another
# descriptor, opened write-only, writes it, then rewrites it. Prints how many
# of the file's pages the node's page cache holds after each step, and
# whether the reader sees the new bytes. mincore(2) on a mapping of the
# reader's descriptor counts them without opening the file again (an open
# may drop the cache: auto_cache).
CACHED = r"""
import ctypes, mmap, os, sys
path, size = sys.argv[1], 4 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

def cached(fd):
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert addr != ctypes.c_void_p(-1).value, os.strerror(ctypes.get_errno())
    vec = (ctypes.c_ubyte * (size // mmap.PAGESIZE))()
    assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
    libc.munmap(addr, size)
    return sum(v & 1 for v in vec)

def rewrite(byte):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    for _ in range(size >> 20):
        os.write(fd, byte * (1 << 20))
    os.close(fd)

os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
r = os.open(path, os.O_RDONLY)
rewrite(b"o")
print("written", cached(r))
assert os.pread(r, size, 0) == b"o" * size
print("read", cached(r))
rewrite(b"n")
print("rewritten", cached(r))
print("reader sees", "new" if os.pread(r, size, 0) == b"n" * size else "old")
"""


def test_writes_bypass_the_page_cache(bed: Bed, cgroup: Path) -> None:  # noqa: F811
    """Written pages were the writer's CPU's work (a copy into pages it had
    to allocate) and were dropped at the next open, as the file's mtime had
    changed: a write-only file bypasses the cache (FOPEN_DIRECT_IO). A
    reader's own cached pages do not go stale: the kernel drops them."""
    export, mnt, _ = served(bed, cgroup, rpc_timeout_s=10)
    r = subprocess.run([sys.executable, "-c", CACHED, str(mnt / "f")],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "written 0",  # the writes left nothing cached (through the cache: 1024)
        "read 1024",  # reads are cached (read-ahead, mmap)
        "rewritten 0",  # the rewrite dropped the reader's old pages (through: 1024)
        "reader sees new",
    ], r.stdout
    assert (export / "f").read_bytes() == b"n" * (4 << 20)
    (mnt / "f").unlink()

"""A node's view of its cluster's shared directory: the NFS export, FUSE-mounted.

This host kernel has no NFS client, so ``native/nfsfuse`` (``hpvc-nfsfuse``,
libfuse3 + libnfs) mounts the export at a host path, with its NFS connection
inside the node's network namespace (the only place the cluster's server can
be reached from); the node's container then sees that path (a bind mount).
The client checks nothing itself: every request carries the calling
process's uid, gid and groups, and the server decides (see
``hpvc.host.nfs_server`` for the protocol, NFSv3 over TCP).

``mount`` returns once the mount answers: ``hpvc-nfsfuse`` forks and its
parent exits only after the child served FUSE's first request. It is
journaled (kind ``"nfs-mount"``) before it is made; the undo detaches the
mount (``fusermount3 -u -z``), ends the client if it is still there (its PID
read from the pid file, checked against its command line), and removes the
mount point when empty.

``health`` asks the file system for its size (``statvfs``: one round trip to
the server, never answered from a cache) in a child process, so a mount
whose server stopped answering cannot hang the caller: the client fails
such a call after its RPC timeout (``rpc_timeout_s`` of ``mount``), at once
when the connection is lost, and the child is killed after ``health``'s own
timeout in any case.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from hpvc.errors import HpvcError, MissingDependency
from hpvc.host import procfs
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.nfs_server import MOUNT_PORT, NFS_PORT
from hpvc.host.probe import read_mounts
from hpvc.paths import native_binary

BINARY = "hpvc-nfsfuse"
FSTYPE = "fuse.hpvc-nfs"  # FUSE's "fuse." + the client's subtype
STOP_WAIT_S = (3.0, 2.0)  # after SIGTERM, after SIGKILL
RETRY_S = 0.5  # a server not answering yet (mount's wait_s) is asked again this often


def client_binary() -> Path:
    """The built ``hpvc-nfsfuse`` (``paths.native_binary``: this checkout's
    build, else the site install's, else the installed one)."""
    found = native_binary("nfsfuse", BINARY)
    if found is not None:
        return found
    raise MissingDependency(
        "NFS client",
        f"{BINARY} is not built",
        "make -C native/nfsfuse (needs libfuse3-dev and libnfs-dev), or make install there",
    )


def mounted(mountpoint: Path) -> bool:
    """Is an ``hpvc-nfsfuse`` mount at ``mountpoint`` (in this mount namespace)?"""
    target = os.path.abspath(mountpoint)
    return any(m.target == target and m.fstype == FSTYPE for m in read_mounts())


def mount(
    journal: Journal,
    *,
    netns: str,
    server: str,
    export: str,
    mountpoint: Path,
    pidfile: Path,
    timeout_s: float,
    rpc_timeout_s: int = 10,
    wait_s: float = 0.0,
    server_name: str = "",
) -> int:
    """FUSE-mount ``server:export`` at ``mountpoint``, talking NFS from inside
    ``netns``; return the client's PID. ``rpc_timeout_s``: how long each NFS
    call may wait for the server before it fails (ETIMEDOUT). ``wait_s``: a
    server that does not answer yet (on another host, still starting) is asked
    again every ``RETRY_S`` for that long; then one error says so, naming
    ``server_name``."""
    mountpoint = Path(os.path.abspath(mountpoint))
    what = f"NFS mount {server}:{export} at {mountpoint}"
    binary = client_binary()
    netns_path = netns if "/" in netns else f"/run/netns/{netns}"
    if mounted(mountpoint):
        raise HpvcError(what, "already mounted", "unmount it, or run 'hpvc down' for its cluster")
    journal.record("nfs-mount", path=str(mountpoint), pidfile=str(pidfile))
    with contextlib.suppress(FileExistsError):
        os.mkdir(mountpoint, 0o755)
    pidfile.unlink(missing_ok=True)
    argv = [
        str(binary), "--netns", netns_path, "--server", server, "--export", export,
        "--pidfile", str(pidfile), "--log", str(pidfile.with_suffix(".log")),
        "--timeout", str(max(1, int(rpc_timeout_s))), "--nfs-port", str(NFS_PORT),
        "--mount-port", str(MOUNT_PORT), str(mountpoint),
    ]  # fmt: skip
    deadline = time.monotonic() + wait_s
    while True:
        why = _try_mount(argv, timeout_s, server, export)
        if why is None:
            break
        if time.monotonic() >= deadline:
            if wait_s > 0:
                who = f"{server} ({server_name})" if server_name else server
                raise HpvcError(
                    what,
                    f"the server {who} did not answer within {wait_s:g} s: {why}",
                    "is the server's host up and its share started? (hpvc node ls there)",
                )
            raise HpvcError(what, why)
        time.sleep(RETRY_S)
    pid = procfs.read_pidfile(pidfile)
    if pid is None:
        raise HpvcError(what, f"{BINARY} wrote no pid file {pidfile}")
    return pid


def _try_mount(argv: list[str], timeout_s: float, server: str, export: str) -> str | None:
    """One run of the client: None once mounted, else why not."""
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:g} s"
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    why = lines[-1].removeprefix(f"{BINARY}: ") if lines else f"exit status {done.returncode}"
    return why.removeprefix(f"cannot mount {server}:{export}: ")


def health(mountpoint: Path, timeout_s: float = 2.0) -> str | None:
    """None when the mount answers within ``timeout_s``, else why not, in a few words."""
    if not mounted(mountpoint):
        return "not mounted"
    try:
        done = subprocess.run(
            ["stat", "--file-system", "--format=%b", str(mountpoint)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:  # the child is killed: a FUSE wait is killable
        return f"server not answering (nothing within {timeout_s:g} s)"
    if done.returncode == 0:
        return None
    why = done.stderr.strip().rpartition(": ")[2] or f"stat exit status {done.returncode}"
    if "not connected" in why:
        return "client gone (transport endpoint is not connected)"
    if "timed out" in why or "Input/output" in why:
        return f"server not answering ({why.lower()})"
    return why


def _is_client(pid: int, mountpoint: str) -> bool:
    args = procfs.cmdline(pid) or []
    return bool(args) and Path(args[0]).name == BINARY and mountpoint in args


def _end(pid: int, mountpoint: str) -> None:
    """SIGTERM, then SIGKILL, the client ``pid`` while it is the one for ``mountpoint``."""
    for sig, seconds in ((signal.SIGTERM, STOP_WAIT_S[0]), (signal.SIGKILL, STOP_WAIT_S[1])):
        if not _is_client(pid, mountpoint):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + seconds
        while procfs.running(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    if procfs.running(pid) and _is_client(pid, mountpoint):
        raise HpvcError(f"NFS client (PID {pid})", "still running after SIGKILL")


@undoer("nfs-mount", what=lambda a: f"NFS mount at {a['path']}")
def _undo_mount(args: Args) -> None:
    path, pidfile = Path(args["path"]), Path(args["pidfile"])
    if mounted(path):
        done = subprocess.run(
            ["fusermount3", "-u", "-z", str(path)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0 and mounted(path):
            raise HpvcError(f"fusermount3 -u -z {path}", done.stderr.strip() or "failed")
    pid = procfs.read_pidfile(pidfile)
    if pid is not None:
        _end(pid, os.path.abspath(path))
    pidfile.unlink(missing_ok=True)
    with contextlib.suppress(FileNotFoundError, OSError):
        os.rmdir(path)  # only when empty: never what a failed unmount left visible

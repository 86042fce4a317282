"""Host folders shared into VM guests: virtiofsd running with the job's user's rights.

A Slurm site's ``binds`` (home and scratch file systems) reach container
nodes as bind mounts, where every access is the task's own, the job's user's.
A VM guest's root is the job's user too, so a file server that opened files
as root (QEMU's 9p, or virtiofsd as root) would hand that user every file
under the bind. Here each bind of each guest gets its own virtiofsd (QEMU 7.2's,
``/usr/lib/qemu/virtiofsd``) whose every access on the host is the user's:

    setpriv --reuid=UID --regid=GID --clear-groups --
      unshare --user --map-root-user --
        virtiofsd --fd=N -o source=BIND -o sandbox=namespace ...

``setpriv`` drops root for the user's uid and primary gid; ``unshare`` makes a
user namespace whose root is that user (and no one else: other users' files
show as ``nobody`` and their permissions apply in full, since a capability in
a user namespace never reaches an inode whose owner is not mapped into it).
Inside it virtiofsd has the capabilities it asks for, so its own sandbox
(mount, PID and network namespaces, ``pivot_root`` into the bind, seccomp)
works unprivileged, and a guest's root, which virtiofsd serves as its uid 0,
is the user on the host: the user's 0600 files are readable, another user's
are not, new files belong to the user. Measured here: started as the user
without a user namespace, this virtiofsd cannot build its sandbox
(``unshare``/``chroot`` need capabilities), and with the user's
supplementary groups it stops at start (it drops them with ``setgroups``,
CVE-2022-0358, which an unprivileged process may not call). So the guest sees
what the user sees by uid and primary group; supplementary groups are not
carried (a narrower view, never a wider one: docs/slurm.md, "Security").

The vhost-user socket is made here, by root, in the node's run folder (root's
alone), and handed to virtiofsd as an open descriptor (``--fd``): the user's
process never needs to reach that folder, and QEMU connects to the socket as
root before it drops to its cluster's uid (``hpvc.render.qemu``).

architecture rule 5: journal kind ``"virtiofsd"``, recorded before the
socket is made or the daemon started: ``{mark, socket}``. Every process of
one daemon (virtiofsd and the child its sandbox forks) carries ``mark`` in its
environment (``HPVC_VIRTIOFSD``), so the undo finds them without a recorded
PID (a crash between the start and a write loses nothing) and never signals
a process that is not one of them; it sends SIGTERM, then SIGKILL, and
removes the socket. virtiofsd also ends on its own when QEMU goes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host import procfs
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.procfs import PROC
from hpvc.paths import private_dir

VIRTIOFSD = "/usr/lib/qemu/virtiofsd"  # Debian's qemu-system-common (QEMU 7.2, the C one)
MARK_ENV = "HPVC_VIRTIOFSD"
STOP_WAIT_S = (2.0, 2.0)  # after SIGTERM, after SIGKILL
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}  # daemons this process started


def argv(fd: int, source: str, uid: int, gid: int, binary: str = VIRTIOFSD) -> list[str]:
    """The command line of one daemon serving ``source`` on descriptor ``fd``
    with the rights of ``uid``:``gid`` (no supplementary groups)."""
    return [
        "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--",
        "unshare", "--user", "--map-root-user", "--",
        binary, f"--fd={fd}", "-o", f"source={source}", "-o", "sandbox=namespace",
        "-o", "cache=auto", "-o", "log_level=warn",
        "--rlimit-nofile=0",  # raising the limit needs a capability the user lacks
    ]  # fmt: skip


def check(source: str, uid: int, binary: str = VIRTIOFSD) -> None:
    """Refuse what cannot be served safely, before any change: root's rights
    (the very thing this module avoids), a source that is not a folder, no
    virtiofsd."""
    if uid <= 0:
        raise InputError(
            f"bind {source} in a VM guest",
            "needs the job's user (an ordinary uid) to serve it as",
            "run the job as an ordinary user (Slurm passes its uid to hpvc node up)",
        )
    if not os.path.isabs(source) or not os.path.isdir(source):
        raise InputError(
            f"bind {source}", "is not an absolute host folder", "fix binds= in plugstack.conf"
        )
    if not os.access(binary, os.X_OK):
        raise MissingDependency(
            "binds in VM guests", f"{binary} not found", "apt-get install qemu-system-common"
        )


def start(
    journal: Journal,
    *,
    sock: Path,
    source: str,
    uid: int,
    gid: int,
    mark: str,
    log: Path,
    binary: str = VIRTIOFSD,
) -> int:
    """Make the listening socket ``sock`` (its folder root's alone) and start the
    daemon on it as ``uid``:``gid``; return its PID. QEMU connects later."""
    check(source, uid, binary)
    private_dir(sock.parent)
    journal.record("virtiofsd", mark=mark, socket=str(sock))
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(sock))
        listener.listen(1)
        fd = listener.fileno()
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", MARK_ENV: mark}
        with open(log, "ab") as out:
            child = subprocess.Popen(
                argv(fd, source, uid, gid, binary),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                pass_fds=(fd,),
                env=env,
                start_new_session=True,
            )
    except OSError as e:
        raise HpvcError(f"virtiofsd for {source}", e.strerror or str(e)) from e
    finally:
        listener.close()  # the daemon holds its own copy
    _CHILDREN[child.pid] = child
    return child.pid


def processes(mark: str, proc: Path = PROC) -> list[int]:
    """The processes of the daemon ``mark`` (virtiofsd and its sandbox's child)."""
    return [p for p in procfs.pids(proc) if procfs.environ(p, proc).get(MARK_ENV) == mark]


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap() -> None:
    for pid, child in list(_CHILDREN.items()):
        if child.poll() is not None:
            del _CHILDREN[pid]


def stop(mark: str, proc: Path = PROC) -> None:
    """End the daemon ``mark``: SIGTERM, then SIGKILL; HpvcError if it stays."""
    for sig, wait in zip((signal.SIGTERM, signal.SIGKILL), STOP_WAIT_S, strict=True):
        pids = processes(mark, proc)
        if not pids:
            break
        _signal(pids, sig)
        deadline = time.monotonic() + wait
        while processes(mark, proc) and time.monotonic() < deadline:
            _reap()
            time.sleep(0.02)
    _reap()
    left = processes(mark, proc)
    if left:
        raise HpvcError(f"virtiofsd {mark}", f"still running as PID {left[0]}")


@undoer("virtiofsd", lambda a: f"virtiofsd {a.get('mark')}")
def _undo(args: Args) -> None:
    stop(str(args["mark"]))
    with contextlib.suppress(FileNotFoundError):
        Path(args["socket"]).unlink()

"""A cluster's NFS server: NFS-Ganesha in its server node's network namespace.

This host kernel has no nfsd (and no NFS client); NFS-Ganesha serves a host
directory (FSAL VFS) from user space, and every node mounts it with
``native/nfsfuse`` (``hpvc.host.nfs_mount``). Several clusters each run their
own Ganesha at once, so nothing of it is host-global:

- its config, log, pid file, NFSv4 recovery state (``RecoveryRoot``, default
  /var/lib/nfs/ganesha) and Kerberos credential cache (``CCacheDir``, default
  /var/run/ganesha) are all in the caller's ``folder``;
- D-Bus: Ganesha 4.3 connects to the system bus for its admin interface (and
  would claim one bus name for every instance); it runs without one, so
  ``DBUS_SYSTEM_BUS_ADDRESS`` points at a socket that does not exist;
- the network: it runs in the server node's namespace, bound to the node's
  address, and exports to the cluster's subnet only (``Access_Type = None``
  outside the ``CLIENT`` block).

Why NFSv3 (and rpcbind): the nodes' client is built on libnfs 4.0 (Debian
bookworm), whose NFSv4 cannot write more than ~3.9 KiB per call, loses OPENs
after a utimes() and never renews its lease (native/nfsfuse/hpvc-nfsfuse.c);
its NFSv3 moves 1 MiB per call. Clients reach NFS (2049) and MOUNT (20048)
on fixed TCP ports, without asking a portmapper, but Ganesha 4.3 exits when
it cannot register NFSv3 with one. So each server gets its own rpcbind,
started beside it in a mount namespace with a private /run (rpcbind's socket
and lock are fixed paths there, and must not be the host's). NFSv4 is served
too (graceless, for a VM guest's kernel client); NLM, RQUOTA and UDP are off.

The launcher is one ``sh`` process that waits on its stdin before doing
anything: its PID and start time are journaled (kind ``"nfs-server"``)
before it is let go, then it joins the caller's cgroup and becomes, by exec,
``nsenter`` > ``unshare`` > ``ganesha.nfsd``, keeping its PID. It leads a
process group of its own (rpcbind is in it too); the undo signals that group,
and only while the PID is still the one started (same start time) or gone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host import netns as nsenter
from hpvc.host import procfs
from hpvc.host.journal import Args, Journal, undoer

NFS_PORT = 2049
MOUNT_PORT = 20048  # MOUNT on a fixed port: clients need no portmapper
PSEUDO = "/shared"  # where the export sits in the server's namespace (the mount path)
MAX_IO = 1 << 20  # READ/WRITE size offered: FUSE's largest request
ANON_ID = 65534  # nobody/nogroup: what a squashed root becomes
CONF, LOG, PIDFILE = "ganesha.conf", "ganesha.log", "ganesha.pid"  # in the caller's folder
LAUNCHER, OUT = "start.sh", "start.log"  # the launcher script, and what it says
STOP_WAIT_S = (10.0, 3.0)  # after SIGTERM (Ganesha shuts down cleanly), after SIGKILL
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}  # servers this process started, to reap
_SAFE = frozenset('"\n\\{};#')  # characters a path may not carry into Ganesha's config
# stable_writes: every WRITE written through (O_SYNC), in the server's own context
STABLE = "\n    NFS_Commit = true;                # every WRITE stable: charged to its cgroup"


def _conf_path(what: str, path: Path) -> str:
    text = str(path)
    if not path.is_absolute() or _SAFE & set(text):
        raise InputError(
            f"NFS server {what} {text!r}", "want an absolute path, no quotes or braces"
        )
    return f'"{text}"'


def render_config(
    *,
    export_dir: Path,
    folder: Path,
    subnet: str,
    address: str,
    root_squash: bool,
    pseudo: str = PSEUDO,
    stable_writes: bool = False,
) -> str:
    """Ganesha's configuration: ``export_dir`` at ``pseudo``, read-write to
    ``subnet`` only, on ``address``; ``root_squash`` maps a node's root to
    nobody (tenant clusters), else root stays root (root's own clusters).
    ``stable_writes`` makes every WRITE stable (``NFS_Commit``: the server
    writes through O_SYNC), so the disk I/O happens in the server's own
    context and is charged to its cgroup (docs/io.md); off, writes land in
    the server's page cache and reach the disk by the kernel's flusher."""
    try:
        net = ipaddress.ip_network(subnet, strict=True)
        if ipaddress.ip_address(address) not in net:
            raise InputError(f"NFS server address {address}", f"not in the cluster subnet {subnet}")
    except ValueError as e:
        raise InputError(f"NFS server subnet {subnet}", str(e)) from None
    if not pseudo.startswith("/") or _SAFE & set(pseudo):
        raise InputError(f"NFS pseudo path {pseudo!r}", "want an absolute path")
    squash = "root_squash" if root_squash else "no_root_squash"
    return f"""\
# NFS-Ganesha for one hpvc cluster (written by hpvc.host.nfs_server).
# Every path below is this server's own: several run on one host at once.
NFS_CORE_PARAM {{
    Protocols = 3, 4;                 # 3: the nodes' hpvc-nfsfuse; 4: a VM guest's kernel
    NFS_Port = {NFS_PORT};
    MNT_Port = {MOUNT_PORT};              # fixed, so clients ask no portmapper
    Bind_Addr = {address};
    Enable_UDP = false;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Clustered = false;
    mount_path_pseudo = true;         # NFSv3 mounts the pseudo path too
    MaxRPCRecvBufferSize = {2 * MAX_IO};   # a 1 MiB WRITE and its header
    MaxRPCSendBufferSize = {2 * MAX_IO};
}}
NFSv4 {{
    Graceless = true;                 # no 90 s grace period at start
    RecoveryBackend = fs;
    RecoveryRoot = {_conf_path("recovery folder", folder / "recovery")};
    Only_Numeric_Owners = true;       # uids as numbers: no idmapd
}}
NFS_KRB5 {{
    Active_krb5 = false;
    CCacheDir = {_conf_path("folder", folder / "run")};
}}
EXPORT {{
    Export_Id = 1;
    Path = {_conf_path("export", export_dir)};
    Pseudo = "{pseudo}";
    Protocols = 3, 4;
    Transports = TCP;
    SecType = sys;
    Access_Type = None;               # nobody outside the CLIENT block
    Squash = {squash};{STABLE if stable_writes else ""}
    Anonymous_Uid = {ANON_ID};
    Anonymous_Gid = {ANON_ID};
    MaxRead = {MAX_IO};
    MaxWrite = {MAX_IO};
    PrefRead = {MAX_IO};
    PrefWrite = {MAX_IO};
    CLIENT {{
        Clients = {net};
        Access_Type = RW;
    }}
    FSAL {{
        Name = VFS;
    }}
}}
LOG {{
    Default_Log_Level = EVENT;
    COMPONENTS {{
        DBUS = FATAL;                 # it runs without D-Bus, on purpose
    }}
}}
"""


def _tool(name: str, package: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin:/usr/bin")
    if found is None:
        raise MissingDependency("NFS server", f"{name} not found", f"apt-get install {package}")
    return found


def tools() -> dict[str, str]:
    """The programs the server needs; MissingDependency (exit 2) naming the package."""
    return {
        "nsenter": _tool("nsenter", "util-linux"),
        "unshare": _tool("unshare", "util-linux"),
        "rpcbind": _tool("rpcbind", "rpcbind"),
        "ganesha": _tool("ganesha.nfsd", "nfs-ganesha nfs-ganesha-vfs"),
    }


def render_launcher(*, folder: Path, netns_path: str, cgroup_procs: Path | None) -> str:
    """The ``sh`` script that becomes the server (see the module's docstring)."""
    q = shlex.quote
    progs = tools()
    procs = q(str(cgroup_procs)) if cgroup_procs else "''"
    return f"""\
#!/bin/sh
# NFS-Ganesha for one hpvc cluster (written by hpvc.host.nfs_server).
set -eu
if [ "${{1:-}}" != inside ]; then
    read -r go   # hpvc journals this PID before it lets us go; EOF: it died, so do we
    procs={procs}
    [ -z "$procs" ] || echo 0 > "$procs"
    exec {q(progs["nsenter"])} --net={q(netns_path)} \\
        {q(progs["unshare"])} --mount --propagation private /bin/sh "$0" inside
fi
# A private /run: rpcbind's socket and lock are fixed paths there.
mount -t tmpfs -o mode=0755,size=1m hpvc-nfs-run /run
{q(progs["rpcbind"])} -f &
i=0
while [ ! -S /run/rpcbind.sock ] && [ "$i" -lt 200 ]; do i=$((i + 1)); sleep 0.02; done
export DBUS_SYSTEM_BUS_ADDRESS=unix:path={q(str(folder / "no-dbus"))}
exec {q(progs["ganesha"])} -F -f {q(str(folder / CONF))} -L {q(str(folder / LOG))} \\
    -p {q(str(folder / PIDFILE))}
"""


_LOGGED = re.compile(r" :(FATAL|CRIT|MAJ|WARN|EVENT|INFO) :(.*)$")
_NOISE = ("DBUS", "dbus", "keytab", "krb5", "Cannot register")  # expected here, not why


def _tail(folder: Path, lines: int = 3) -> str:
    """Why the server failed, from its launcher's output and Ganesha's log: the
    first serious messages (FATAL, CRIT, MAJ), else the last lines."""
    serious, last = [], []
    for name in (OUT, LOG):
        with contextlib.suppress(OSError):
            for text in (folder / name).read_text(errors="replace").splitlines():
                m = _LOGGED.search(text)
                msg = (m.group(2) if m else text).strip()
                if not msg or any(n in text for n in _NOISE):
                    continue
                last.append(msg)
                if m and m.group(1) in ("FATAL", "CRIT", "MAJ"):
                    serious.append(msg)
    return " | ".join(serious[:lines] or last[-lines:]) or "no output"


def _answers(netns_path: str, address: str, port: int) -> bool:
    with nsenter.entered(netns_path):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # stays in the namespace
    try:
        s.settimeout(0.2)
        s.connect((address, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def start(
    journal: Journal,
    *,
    netns: str,
    cgroup_procs: Path | None,
    folder: Path,
    export_dir: Path,
    subnet: str,
    address: str,
    root_squash: bool,
    timeout_s: float,
    pseudo: str = PSEUDO,
    stable_writes: bool = False,
) -> int:
    """Start the cluster's NFS server in ``netns`` (a name under /run/netns or
    a path), exporting ``export_dir`` as ``pseudo``; return its PID once NFS
    and MOUNT accept on ``address`` (else HpvcError with its log's tail, the
    server ended, after ``timeout_s``)."""
    what = f"NFS server in {netns}"
    netns_path = netns if "/" in netns else f"/run/netns/{netns}"
    if not os.path.exists(netns_path):
        raise HpvcError(what, f"network namespace {netns_path} does not exist")
    if not export_dir.is_dir():
        raise HpvcError(what, f"export {export_dir} is not a directory")
    for path in (folder, export_dir):  # the server's /run is a tmpfs of its own
        if Path(os.path.abspath(path)).is_relative_to("/run"):
            raise InputError(what, f"{path} is under /run, which the server cannot see")
    for sub in ("", "recovery", "run"):
        (folder / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    (folder / CONF).write_text(
        render_config(
            export_dir=export_dir, folder=folder, subnet=subnet, address=address,
            root_squash=root_squash, pseudo=pseudo, stable_writes=stable_writes,
        )
    )  # fmt: skip
    (folder / LAUNCHER).write_text(
        render_launcher(folder=folder, netns_path=netns_path, cgroup_procs=cgroup_procs)
    )
    (folder / LOG).unlink(missing_ok=True)  # this start's messages only: errors quote its tail
    with open(folder / OUT, "wb") as out:
        child = subprocess.Popen(
            ["/bin/sh", str(folder / LAUNCHER)],
            stdin=subprocess.PIPE, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    _CHILDREN[child.pid] = child
    assert child.stdin is not None
    try:
        started = procfs.start_time(child.pid)
        journal.record("nfs-server", pid=child.pid, start_time=started, folder=str(folder))
        child.stdin.write(b"go\n")
    finally:
        child.stdin.close()  # unwritten: the launcher reads EOF and exits
    _wait_ready(child, started, netns_path, address, timeout_s, what, folder)
    return child.pid


def _wait_ready(
    child: subprocess.Popen[bytes],
    started: str | None,
    netns_path: str,
    address: str,
    timeout_s: float,
    what: str,
    folder: Path,
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if child.poll() is not None:
            raise HpvcError(what, f"exited with status {child.returncode}: {_tail(folder)}")
        if all(_answers(netns_path, address, p) for p in (NFS_PORT, MOUNT_PORT)):
            return
        if time.monotonic() >= deadline:
            stop(child.pid, started)
            why = f"not answering on {address}:{NFS_PORT} after {timeout_s:g} s"
            raise HpvcError(what, f"{why}: {_tail(folder)}")
        time.sleep(0.05)


def alive(pid: int, start_time: str | None) -> bool:
    """Is the server started as ``pid`` at ``start_time`` still running?"""
    return procfs.running(pid) and procfs.start_time(pid) == start_time


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]


def _group_left(pid: int) -> bool:
    """Does any process (not a zombie we can reap) remain in process group ``pid``?"""
    _reap(pid)
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(procfs.running(p) and _pgid(p) == pid for p in procfs.pids())


def _pgid(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        return os.getpgid(pid)
    return None


def stop(pid: int, start_time: str | None) -> None:
    """End the server (and its rpcbind): SIGTERM to its process group, then
    SIGKILL. Nothing is signalled when ``pid`` now runs another process."""
    for sig, seconds in ((signal.SIGTERM, STOP_WAIT_S[0]), (signal.SIGKILL, STOP_WAIT_S[1])):
        now = procfs.start_time(pid)
        if now is not None and now != start_time:
            return  # the PID was reused; while our group lived, it could not have been
        if not _group_left(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + seconds
        while _group_left(pid):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        else:
            return
    raise HpvcError(f"NFS server (PID {pid})", "still running after SIGKILL")


@undoer("nfs-server", what=lambda a: f"NFS server (PID {a['pid']})")
def _undo_server(args: Args) -> None:
    stop(int(args["pid"]), args.get("start_time"))

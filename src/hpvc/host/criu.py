"""CRIU for container nodes: whether it runs here (``check``), ``dump`` and ``restore``.

Container nodes are checkpointed by CRIU driven directly: Debian's crun 1.8
is built without CRIU, so there is no ``crun checkpoint`` (HOST-NOTES).
Before anything is frozen, the crun backend asks ``check`` whether CRIU runs
on this kernel at all: CRIU 3.17 (Debian bookworm's) stops at its kernel
feature detection on kernels 6.13 and newer; scripts/setup-criu.sh installs
4.2 (docs/checkpoint.md "Containers"). ``criu check`` reads the kernel and
changes nothing on the host (on success it may cache what it found in
/run/criu.kdat, CRIU's own cache). ``dump`` writes only into the folder it
is given; ``restore`` starts processes in namespaces and cgroups the crun
backend made and journaled (its caller records the container before).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpvc.errors import HpvcError

Which = Callable[[str], str | None]
TIMEOUT_S = 30
# CRIU's error lines: "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds".
_ERROR = re.compile(r"^(?:\(\d+\.\d+\) )?Error \(([^)]*)\): (.*)$")
_VERSION = re.compile(r"^Version: (\S+)", re.MULTILINE)


@dataclass(frozen=True)
class CriuCheck:
    """``installed``: a criu binary was found; ``ok``: ``criu check`` passed;
    ``version`` as criu prints it ("3.17.1"); ``error``: CRIU's first error,
    one line, "" when ok."""

    installed: bool
    ok: bool
    version: str
    error: str


def parse_version(text: str) -> str:
    """The version in ``criu --version``'s output ("" when there is none)."""
    m = _VERSION.search(text)
    return m.group(1) if m else ""


def first_error(text: str) -> str:
    """CRIU's first error line in ``text`` as "<message> (<source>:<line>)"; the
    first non-empty line when CRIU wrote no error line; "" for no output."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        m = _ERROR.match(ln)
        if m:
            return f"{m.group(2)} ({m.group(1)})"
    return lines[0] if lines else ""


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=TIMEOUT_S)


def check(which: Which = shutil.which) -> CriuCheck:
    """Run ``criu --version`` and ``criu check`` on this host."""
    criu = which("criu")
    if criu is None:
        return CriuCheck(installed=False, ok=False, version="", error="criu not found")
    version = parse_version(_run([criu, "--version"]).stdout)
    done = _run([criu, "check"])
    if done.returncode == 0:
        return CriuCheck(installed=True, ok=True, version=version, error="")
    why = first_error(done.stderr + "\n" + done.stdout) or f"exit status {done.returncode}"
    return CriuCheck(installed=True, ok=False, version=version, error=why)


# --- dump and restore ------------------------------------------------------------------
# What hpvc asks of CRIU for a container node whose runtime (crun 1.8) has no
# CRIU of its own: the node's process tree, from its init, with its mount, PID,
# IPC and UTS namespaces; its network namespace kept outside the image
# (``--external net[inode]``, given back on restore as an inherited descriptor
# of the namespace hpvc recreated); the folders bound into it from the host
# named by their mount point (``--ext-mount-map``), mapped on restore to where
# they are then; other host mounts (crun's masked paths, its cgroup binds)
# found by CRIU (``--external mnt[]``) and resolved again (``auto``); its stdio
# (a pipe to the node's console reader, /dev/null) outside too, handed over on
# restore as new descriptors (``--inherit-fd``). The tasks are frozen by hpvc
# before the dump (``--freeze-cgroup`` then finds them frozen and leaves them
# so, ``-R`` keeps them), and come back frozen: CRIU restores the freezer state.

NETNS_KEY = "hpvc-netns"
DUMP_LOG = "dump.log"
RESTORE_LOG = "restore.log"
# A node's cgroup v1 mounts (crun binds each hierarchy's node folder at
# /sys/fs/cgroup/<controller>) are named to CRIU by the host's mount point of
# their hierarchy, behind this prefix (no ':', CRIU splits its maps at the
# first one), so that a restore under another cluster name maps each to the
# new cluster's folder instead of the one CRIU would find by itself.
CGROUP_KEY = "hpvc-cgroup"


def parse_cgroup_mounts(node_info: str, host_info: str, cgroup: str) -> dict[str, str]:
    """Mount point inside a node -> the host's mount point of the same cgroup v1
    hierarchy, for each cgroup mount in the node's mountinfo (``node_info``)
    whose root is the node's cgroup ``cgroup`` ("/hpvc/<cluster>/<node>");
    hierarchies are matched by their super options (controllers, name=)."""

    def cgroup_rows(text: str) -> list[tuple[str, str, str]]:
        rows = []
        for line in text.splitlines():
            head, sep, tail = line.partition(" - ")
            f, t = head.split(), tail.split()
            if sep and len(f) >= 5 and len(t) >= 3 and t[0] == "cgroup":
                opts = ",".join(sorted(o for o in t[2].split(",") if o not in ("rw", "ro")))
                rows.append((f[3], f[4], opts))
        return rows

    host = {opts: mnt for root, mnt, opts in cgroup_rows(host_info) if root == "/"}
    return {
        mnt: host[opts]
        for root, mnt, opts in cgroup_rows(node_info)
        if root == cgroup and opts in host
    }


def cgroup_mounts(pid: int, cgroup: str) -> dict[str, str]:
    """``parse_cgroup_mounts`` for the task ``pid`` on this host."""
    node = Path(f"/proc/{pid}/mountinfo").read_text()
    return parse_cgroup_mounts(node, Path("/proc/self/mountinfo").read_text(), cgroup)


def stable_mountinfo(path: Path = Path("/proc/self/mountinfo"), tries: int = 10) -> str:
    """``path`` read until two reads in a row agree: a read while mounts come and
    go (another node's overlay, a CRIU restore's own) can miss lines. Seen
    2026-11-27: nodes restored side by side, one restore's list of the host's
    cgroup hierarchies lacked ``cpu`` and CRIU stopped (``mnt: No mapping for
    158:(null) mountpoint``)."""
    last = path.read_text()
    for _ in range(tries):
        now = path.read_text()
        if now == last:
            return now
        last = now
    return last


def host_cgroup_mounts() -> list[str]:
    """The host's mount points of its cgroup v1 hierarchies."""
    text = stable_mountinfo()
    return sorted(set(parse_cgroup_mounts(text, text, "/").values()))


def cgroup_key(host_mountpoint: str) -> str:
    return CGROUP_KEY + host_mountpoint


def stdio_keys(pid: int) -> dict[int, str]:
    """How CRIU names descriptors 0-2 of ``pid`` that lead out of its node: a pipe
    ``pipe:[INODE]``, any other file ``file[MNT_ID:INODE]``."""
    out: dict[int, str] = {}
    for fd in (0, 1, 2):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
            ino = os.stat(f"/proc/{pid}/fd/{fd}").st_ino
        except OSError:
            continue
        if target.startswith("pipe:"):
            out[fd] = target
            continue
        mnt = next((ln.split()[1] for ln in info.splitlines() if ln.startswith("mnt_id:")), "")
        if mnt:
            out[fd] = f"file[{mnt}:{ino}]"
    return out


def _criu() -> str:
    path = shutil.which("criu")
    if path is None:
        raise HpvcError("criu", "not found", "make setup (scripts/setup-criu.sh)")
    return path


def _fail(what: str, log: Path, rc: int) -> HpvcError:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    lines = [ln for ln in text.splitlines() if "Error (" in ln and "RLIMIT_NOFILE" not in ln]
    why = first_error("\n".join(lines)) if lines else f"exit status {rc}"
    return HpvcError(what, why, f"see {log}")


def dump(
    pid: int,
    images: Path,
    *,
    netns: Path,
    binds: list[str],
    stdio: dict[int, str],
    freezer: Path,
    root: Path,
    cgroups: dict[str, str] | None = None,
    pidns: tuple[Path, str] | None = None,
    ghost_mib: int | None = None,
) -> None:
    """``criu dump`` of the process tree of ``pid`` (a frozen node's init) into
    ``images``; the tasks stay, frozen. ``binds``: mount points inside the node
    of folders bound from the host; ``cgroups``: its cgroup mounts (mount point
    -> the host's mount point of that hierarchy, ``cgroup_mounts``); ``pidns``:
    a PID namespace the tree shares with others (its path, CRIU's key for it),
    kept outside the images; ``ghost_mib``: the largest deleted file still open
    whose contents go into the images (CRIU's default: 1 MiB)."""
    images.mkdir(parents=True, exist_ok=True)
    argv = [_criu(), "dump", "-t", str(pid), "-D", str(images), "-o", DUMP_LOG, "-v4"]
    argv += ["--tcp-established", "--file-locks", "-R", "--root", str(root)]
    argv += ["--freeze-cgroup", str(freezer), "--manage-cgroups=soft"]
    argv += ["--network-lock", "nftables"]
    argv += ["--external", f"net[{os.stat(netns).st_ino}]:{NETNS_KEY}", "--external", "mnt[]"]
    for dest in binds:
        argv += ["--ext-mount-map", f"{dest}:{dest}"]
    for inside, host in (cgroups or {}).items():
        argv += ["--ext-mount-map", f"{inside}:{cgroup_key(host)}"]
    for key in stdio.values():
        if key.startswith("file["):
            argv += ["--external", key]
    if pidns is not None:
        argv += ["--external", f"pid[{os.stat(pidns[0]).st_ino}]:{pidns[1]}"]
    if ghost_mib is not None:
        argv += ["--ghost-limit", f"{ghost_mib}M"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise _fail(f"criu dump of PID {pid}", images / DUMP_LOG, done.returncode)


def restore(
    images: Path,
    *,
    netns: Path,
    binds: dict[str, str],
    stdio: dict[int, str],
    console_fd: int,
    root: Path,
    pidfile: Path,
    cgroup: str = "",
    cgroup_mounts: Sequence[str] = (),
    move_cgroup: bool = False,
    shared_ns: tuple[Path, str, Path] | None = None,
) -> int:
    """``criu restore`` of ``images`` into the network namespace at ``netns`` and
    the root ``root``, its tasks in the cgroups they were saved in (with their
    limits: CRIU's soft mode), or, with ``move_cgroup``, in ``cgroup``
    ("/hpvc/<cluster>/<node>") instead (``--cgroup-root``: a restore under
    another cluster name); the node's cgroup mounts are bound from ``cgroup``
    under each of the host's hierarchy mount points ``cgroup_mounts``
    (``host_cgroup_mounts``); ``binds`` maps each
    bound mount point (as saved) to its folder on this host now; the saved
    stdio pipes become ``console_fd``, other stdio files /dev/null; ``shared_ns``:
    the PID namespace saved as external (its path now, its key) and the IPC
    namespace the tasks join (nodes sharing their cluster's). Returns the
    restored init's PID; its tasks are frozen (as they were dumped)."""
    fds: list[int] = []
    argv = [_criu(), "restore", "-D", str(images), "-o", RESTORE_LOG, "-v4", "-d"]
    argv += ["--tcp-established", "--file-locks", "--root", str(root)]
    argv += ["--manage-cgroups=soft", "--pidfile", str(pidfile)]  # the saved cgroup paths
    argv += ["--network-lock", "nftables", "--ext-mount-map", "auto"]
    try:
        ns_fd = os.open(netns, os.O_RDONLY)
        fds.append(ns_fd)
        argv += ["--inherit-fd", f"fd[{ns_fd}]:{NETNS_KEY}"]
        null = os.open("/dev/null", os.O_RDWR)
        fds.append(null)
        for key in dict.fromkeys(stdio.values()):  # once per saved pipe or file
            fd = console_fd if key.startswith("pipe:") else null
            argv += ["--inherit-fd", f"fd[{fd}]:{key}"]
        for dest, source in binds.items():
            argv += ["--ext-mount-map", f"{dest}:{source}"]
        if shared_ns is not None:
            pid_fd = os.open(shared_ns[0], os.O_RDONLY)
            fds.append(pid_fd)
            argv += ["--inherit-fd", f"fd[{pid_fd}]:{shared_ns[1]}"]
            argv += ["--join-ns", f"ipc:{shared_ns[2]}"]
        if move_cgroup:
            argv += ["--cgroup-root", cgroup]
        for host in cgroup_mounts:
            argv += ["--ext-mount-map", f"{cgroup_key(host)}:{host}{cgroup}"]
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, pass_fds=(*fds, console_fd)
        )
    finally:
        for fd in fds:
            os.close(fd)
    if done.returncode != 0:
        raise _fail(f"criu restore of {images}", images / RESTORE_LOG, done.returncode)
    return int(pidfile.read_text().split()[0])

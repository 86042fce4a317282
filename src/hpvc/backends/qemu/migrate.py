"""A direct-QEMU node moved into a new QEMU process on the same host (issue 27).

``hpvc.cluster.migrate`` finds this module by the backend's registry name (as
``hpvc.cluster.across`` finds ``across``) and calls ``refusal`` (and, for
``--postcopy``, ``postcopy_refusal``) before it plans anything, then
``migrate_node`` with the node's old and new place. The QMP side is
``hpvc.backends.vm.migration``; this module is the host side:

1. the target: the source's own command line (``/proc/PID/cmdline``: the
   device model the guest runs on, whatever made it) with the new place's
   memory bindings (``host-nodes`` per guest cell), its own tap, its own
   run folder (``run/<cluster>/<node>~migrating``) and ``-incoming defer``;
   pinned at once to the new place's CPUs (``qemu_pinning``), told to listen
   on a unix socket in a folder only the QEMU's uid may enter (QEMU has
   dropped root by then). Every change is journaled in the node's
   migration journal (``nodes/<cluster>/<node>~migrating/journal``, which
   ``hpvc down`` replays like a node's after a crash); its QEMU with the
   undo kind ``qemu-target``, which stops only the PID in the target's own
   pid file (the source runs under the same ``-name``).
2. the move, then the switch: the source QEMU stopped, its console reader
   and tap given back (their journal entries undone one by one), the
   target's run folder renamed to the node's (open sockets keep working),
   and the node's journal rewritten to hold the target's changes.
3. any failure (QEMU's, the target dying, the timeout, Ctrl-C): the
   migration is cancelled, QEMU resumes the source guest, and the
   migration journal is undone: nothing of the target is left.

A node has two taps by turns (``tap_name(cluster, node)`` and the same with
``~migrating``): a tap cannot be renamed while up, and taking it down would
add to what the guest sees. ``hpvc gc`` keeps both names of a live cluster.
Architecture: docs/architecture.md (``backends/``); docs/vms.md "Live migration".
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hpvc.backends.base import ClusterEnv
from hpvc.backends.qemu import process as vm_qemu
from hpvc.backends.qemu import region
from hpvc.backends.qemu.across import qmp_socket
from hpvc.backends.qemu.backend import QemuBackend, qmp_wait_s, vm_state
from hpvc.backends.qemu.qmp import wait_qmp
from hpvc.backends.vm import guest as g
from hpvc.backends.vm import migration
from hpvc.backends.vm.console import with_tail
from hpvc.errors import HpvcError
from hpvc.host import console_ring, disk_access, net, procfs, qemu_user, userfaultfd
from hpvc.host.journal import Args, Change, Journal, undo_one, undoer
from hpvc.paths import private_dir
from hpvc.plan import Plan, PlannedNode
from hpvc.progress import Progress
from hpvc.render.context import tap_name
from hpvc.render.qemu import QemuLaunch, qemu_name, qemu_pinning

SOCKET_DIR = "hpvc-migrate-"
MIGRATING = "~migrating"  # suffix of the target's run folder, journal folder and tap
NOT_MIGRATABLE = {
    # An ivshmem region moves on its host with its peers stopped (hpvc.backends.qemu.
    # region); across hosts the guest leaves it first (hpvc.backends.qemu.across).
    "vhost-user-fs-pci": "it mounts host folders over virtiofs"
    " (QEMU 7.2 cannot migrate vhost-user-fs)",
}


# --- the target's command line (pure) -----------------------------------------------


def _cells(value: str, host_nodes: dict[int, int]) -> str:
    """A ``memory-backend-*`` option string bound to its cell's new host node."""
    m = re.search(r"(?:^|,)id=mem(\d+)(?:,|$)", value)
    if not m or "host-nodes=" not in value:
        return value
    cell = int(m.group(1))
    if cell not in host_nodes:
        raise HpvcError("migration target", f"no planned host node for guest cell {cell}")
    return re.sub(r"host-nodes=\d+(?:-\d+)?", f"host-nodes={host_nodes[cell]}", value)


def target_argv(
    argv: Sequence[str],
    *,
    run_from: str,
    run_to: str,
    tap_from: str,
    tap_to: str,
    host_nodes: dict[int, int],
) -> list[str]:
    """The source's command line as the target's: paths in ``run_from`` moved to
    ``run_to``, the tap ``tap_from`` replaced by ``tap_to``, each guest cell's
    memory bound to ``host_nodes[cell]``, and ``-incoming defer``."""
    out: list[str] = []
    prev = ""
    for i, arg in enumerate(argv):
        if arg == "-incoming" or (i and argv[i - 1] == "-incoming"):
            continue  # a node that moved before runs with the -incoming it was started with
        value = arg.replace(f"{run_from}/", f"{run_to}/")
        value = value.replace(f"ifname={tap_from},", f"ifname={tap_to},")
        if prev == "-object" and value.startswith("memory-backend-"):
            value = _cells(value, host_nodes)
        out.append(value)
        prev = arg
    return migration.incoming_argv(out)


def current_tap(argv: Sequence[str]) -> str | None:
    """The tap a QEMU command line's ``-netdev tap`` names."""
    for value in argv:
        m = re.search(r"(?:^|,)ifname=([^,]+)", value)
        if value.startswith("tap,") and m:
            return m.group(1)
    return None


def refusal_for(argv: Sequence[str]) -> str | None:
    """Why a QEMU running this command line cannot move, or None."""
    for device, why in NOT_MIGRATABLE.items():
        if any(device in a for a in argv):
            return why
    return None


# --- the target's QEMU -----------------------------------------------------------------


@undoer("qemu-target")
def _undo_target(args: Args) -> None:
    """Stop a migration target: only the PID its own pid file names (the source
    QEMU has the same ``-name``, so never a search by name)."""
    name, pidfile = str(args["name"]), Path(args["pidfile"])
    pid = procfs.read_pidfile(pidfile)
    if pid is not None and procfs.is_qemu(pid, name):
        vm_qemu.stop_qemu(pid, name, args.get("qmp"))
    pidfile.unlink(missing_ok=True)


@undoer("migrate-socket-dir")
def _undo_socket_dir(args: Args) -> None:
    path = Path(args["path"])
    if path.parent != Path(tempfile.gettempdir()) or not path.name.startswith(SOCKET_DIR):
        raise HpvcError(f"refusing to remove {path}", "not a migration socket folder")
    shutil.rmtree(path, ignore_errors=True)


def _socket_dir(journal: Journal, uid: int) -> Path:
    """A folder only ``uid`` (the QEMUs' own, after they dropped root) may enter,
    where the target listens: hpvc's run folders are root's alone."""
    path = Path(tempfile.mkdtemp(prefix=SOCKET_DIR))
    journal.record("migrate-socket-dir", path=str(path))
    os.chown(path, uid, -1)
    return path


def _start_target(
    journal: Journal, launch: QemuLaunch, log: Path, qmp_timeout: float, console_cap: int
) -> int:
    """Start the target QEMU (its console appended to the node's log); its PID."""
    name = vm_qemu.name_of(launch.argv)
    private_dir(log.parent)
    if launch.console_fifo is not None and launch.console_log is not None:
        console_ring.start(journal, Path(launch.console_log), console_cap, append=True,
                           fifo=Path(launch.console_fifo))  # fmt: skip
    journal.record("qemu-target", name=name, pidfile=launch.pidfile, qmp=launch.qmp_socket)
    with open(log, "wb") as out:
        child = subprocess.Popen(
            list(launch.argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True,
        )  # fmt: skip
    vm_qemu._CHILDREN[child.pid] = child  # reaped when stopped
    try:
        wait_qmp(launch.qmp_socket, child.pid, qmp_timeout, log)
    except BaseException as e:
        died = child.poll() is not None
        with contextlib.suppress(ProcessLookupError):
            child.kill()  # our own child, by its PID: it may not have written its pid file
        child.wait()
        if died and isinstance(e, HpvcError):
            # Nothing was sent yet: to the user this is the same failure as a
            # target dying mid-copy (the guest stays at the source).
            why = "the target QEMU exited while starting"
            raise migration.MigrationFailed("target-died", why) from e
        raise
    return child.pid


def refusal(backend: QemuBackend, env: ClusterEnv, plan: Plan, node: PlannedNode) -> str | None:
    """Why this node cannot move here (one line), or None."""
    pid = backend.live_pid(env, plan, node)
    if pid is None:
        return f"node {node.name} is not running"
    argv = procfs.cmdline(pid) or []
    return refusal_for(argv)


def postcopy_refusal(
    backend: QemuBackend, env: ClusterEnv, plan: Plan, node: PlannedNode
) -> tuple[str, str] | None:
    """Why this node cannot move by postcopy here (``--postcopy``) and the fix, or None:
    a guest that ``migration.start`` would stop for the whole copy (TCG before
    QEMU 9.0: nothing left for postcopy to do after the switch), or QEMU's uid
    kept from userfaultfd."""
    pid = backend.live_pid(env, plan, node)
    run = migration.socket_runner(qmp_socket(env, plan, node.name), pid) if pid else None
    if run is not None and migration.copied_stopped(run):
        return (
            "this QEMU copies a TCG guest with its vCPUs stopped (a live copy loses"
            " guest writes before QEMU 9.0), so there is no postcopy phase",
            "move it without --postcopy, or on a KVM host (docs/vms.md, Live migration)",
        )
    why = userfaultfd.postcopy_refusal(qemu_user.find(env.store.root, env.name) or 0)
    if why is None:
        return None
    return why, (
        "move it without --postcopy, or let the site allow it:"
        " sysctl -w vm.unprivileged_userfaultfd=1 (docs/vms.md, Live migration)"
    )


def migrate_node(
    backend: QemuBackend,
    env: ClusterEnv,
    old: Plan,
    new: Plan,
    name: str,
    settings: migration.MigrationSettings,
    progress: Progress,
) -> migration.MigrationStats:
    """Move running node ``name`` into a new QEMU at its place in ``new``."""
    src, dst = old.node(name), new.node(name)
    pid = backend.node_pid(env, old, src)
    argv = [a for a in (procfs.cmdline(pid) or []) if a != ""]
    qname = qemu_name(old, src)
    layout = env.store.layout
    canon_run = layout.node_run_dir(old.cluster, name)
    tgt_run = canon_run.with_name(name + MIGRATING)
    tgt_dir = env.node_dir(name + MIGRATING)
    tap_from = current_tap(argv) or tap_name(old.cluster, name)
    canon_tap = tap_name(old.cluster, name)
    tap_to = tap_name(old.cluster, name + MIGRATING) if tap_from == canon_tap else canon_tap
    jt = env.node_journal(name + MIGRATING)  # hpvc down replays it after a crash
    launch = QemuLaunch(
        argv=tuple(
            target_argv(
                argv,
                run_from=str(canon_run),
                run_to=str(tgt_run),
                tap_from=tap_from,
                tap_to=tap_to,
                host_nodes={c.guest_node: c.host_node for c in dst.numa},
            )
        ),
        pinning=qemu_pinning(dst),
        tap=tap_to,
        qmp_socket=str(tgt_run / "qmp.sock"),
        pidfile=str(tgt_run / "qemu.pid"),
        console_fifo=str(tgt_run / "console.fifo"),
        console_log=str(env.node_dir(name) / "console.log"),
    )
    try:
        jt.record("node-run-dir", path=str(tgt_run))
        private_dir(tgt_run)
        uid = qemu_user.find(env.store.root, old.cluster) or 0  # the QEMUs' -runas uid
        incoming = _socket_dir(jt, uid)
        if uid:  # QEMU reopens the disk by path at the switch (hpvc.host.disk_access)
            disk = env.node_dir(name) / f"disk.{g.DISK_MODE}"
            disk_access.grant(jt, disk, env.store.root, uid)
        net.create_tap(jt, tap_to, new.network.bridge, new.network.mtu)
        progress(f"node {name}: starting the target QEMU (CPUs {_cpus(dst)})")
        log = tgt_dir / "qemu.log"
        tpid = _start_target(jt, launch, log, qmp_wait_s(dst), env.rec.console_bytes())
        vm_qemu.apply_pinning(launch.qmp_socket, tpid, launch.pinning)
        uri = migration.unix_uri(str(incoming / "migrate.sock"))
        migration.listen(migration.socket_runner(launch.qmp_socket, tpid), settings, uri)
        source = migration.socket_runner(str(canon_run / "qmp.sock"), pid)
        migration.apply_settings(source, settings)
        shm = region.region_of(argv)  # its peers and it stopped for the copy (region.py)
        others = region.peers(backend, env, old, name, shm) if shm else {}
        with region.paused(env, old, others, progress) as left:
            paused = migration.start(source, uri, stop=shm is not None)
            stats = migration.wait(
                source,
                settings.timeout_s,
                progress,
                target_alive=lambda: procfs.is_qemu(tpid, qname) and procfs.running(tpid),
                postcopy_after_passes=2 if settings.postcopy else None,
                paused=paused,
            )
    except migration.MigrationFailed as e:
        tail = with_tail("the target QEMU said", tgt_dir / "qemu.log")
        tail += "; " + with_tail("the source", env.node_dir(name) / "qemu.log")
        abandon(env, name, progress)
        raise migration.MigrationFailed(e.reason, f"{e.why}; {tail}") from e
    except BaseException:
        abandon(env, name, progress)
        raise
    _switch(env, old, name, pid, qname, tpid, canon_run, tgt_run, progress)
    vm_state(env).pids[name] = tpid
    if left:
        raise HpvcError(
            f"node {name}",
            f"moved, but its region peers stay paused: {'; '.join(left)}",
            "resume them with QMP cont on their qmp.sock, or hpvc down the cluster",
        )
    return stats


def _cpus(node: PlannedNode) -> str:
    from hpvc.units import format_cpulist

    return format_cpulist(set(node.cpuset))


def abandon(env: ClusterEnv, name: str, progress: Progress) -> list[str]:
    """Undo everything of the target (its QEMU, console reader, tap, run folder)."""
    jt = env.node_journal(name + MIGRATING)
    errors = jt.undo_all(progress)
    if not errors:
        shutil.rmtree(env.node_dir(name + MIGRATING), ignore_errors=True)
    return errors


SOURCE_KINDS = ("qemu", "console-ring", "tap")  # what the source process holds


def _switch(
    env: ClusterEnv,
    old: Plan,
    name: str,
    pid: int,
    qname: str,
    tpid: int,
    canon_run: Path,
    tgt_run: Path,
    progress: Progress,
) -> None:
    """The guest runs in the target: stop the source, give back its console reader
    and tap, move the target's run folder to the node's, rewrite the node's journal."""
    progress(f"node {name}: switched over; stopping the source QEMU (PID {pid})")
    vm_qemu.stop_qemu(pid, qname, str(canon_run / "qmp.sock"))
    journal = env.node_journal(name)
    entries = journal.entries()
    for change in reversed(entries):
        if change.kind in ("console-ring", "tap"):
            error = undo_one(change, progress)
            if error:
                raise HpvcError(f"migration of {name}", f"giving back the source's {error}")
    shutil.rmtree(canon_run, ignore_errors=True)
    os.rename(tgt_run, canon_run)
    target = env.node_journal(name + MIGRATING).entries()
    for change in target:
        if change.kind in ("migrate-socket-dir", "disk-access"):
            undo_one(change, progress)
    dropped = ("node-run-dir", "migrate-socket-dir", "disk-access")
    moved = [_renamed(c, str(tgt_run), str(canon_run)) for c in target if c.kind not in dropped]
    kept = [c for c in entries if c.kind not in SOURCE_KINDS]
    journal.replace_with(kept + moved)
    shutil.rmtree(env.node_dir(name + MIGRATING), ignore_errors=True)
    if not procfs.running(tpid):
        raise HpvcError(f"node {name}", f"its new QEMU (PID {tpid}) exited after the switch")


def _renamed(change: Change, old: str, new: str) -> Change:
    """A target's change as the node's: paths in ``old`` now in ``new``; the
    target's QEMU now the node's (undo kind ``qemu``, found by pid file or name)."""

    def fix(v: object) -> object:
        if isinstance(v, str):
            return v.replace(f"{old}/", f"{new}/")
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    args = {k: fix(v) for k, v in change.args.items()}
    if change.kind == "qemu-target":
        sockets = [args["qmp"], str(Path(new) / "console.sock")]
        return Change("qemu", {**args, "sockets": sockets}, vm_qemu.__name__)
    return Change(change.kind, args, change.module)

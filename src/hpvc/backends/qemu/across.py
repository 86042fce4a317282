"""A direct-QEMU node moved to another host: the target's and the source's halves.

Issue 27 across hosts (docs/slurm.md "Moving a VM node to another host"). The
two halves run in two hpvc processes on two hosts, joined by a TCP URI on the
hosts' fabric addresses; ``hpvc.backends.vm.migration`` (the QMP primitive,
shared with the one-host path) does the moving, this module the host side:

- ``receive`` (target): the node's tap on this host's bridge, its own disk
  (a new overlay over the same base image, which every host has in the site's
  image folder), QEMU from the node's command line as planned here plus
  ``-incoming defer``, pinned; then told to listen on this host's fabric
  address (port 0: the kernel picks; read back from ``query-migrate``).
- ``send`` (source): the settings, block migration of the node's writable
  disk layer (``block`` with ``block-incremental``: only the overlay's
  clusters travel, the base image is the same file name on every host; QEMU
  7.2 has it, and it works beside multifd here, see docs/slurm.md), then
  ``migrate`` and ``wait``.

A node that shares its host's ivshmem region with other guests leaves it
first (``send``: ``hpvc.host.region_departure``: its ranks' pairs move to
TCP), and the target gives it a region of its own of the same size
(``receive``): QEMU copies the region like RAM (``master=on``), and those
pages must never land in the region this host's guests share.

``refusal`` says, before anything moves, why a node cannot go: its region
written by an older UCX module (which cannot leave it), or one QEMU itself
blocks migration for (``query-migrate``'s ``blocked-reasons``: a virtiofs
bind's vhost-user-fs).
Architecture: docs/architecture.md (``backends/``: one folder per backend).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hpvc.backends.base import ClusterEnv
from hpvc.backends.qemu import process as vm_qemu
from hpvc.backends.qemu.backend import QemuBackend, qmp_wait_s, vm_state
from hpvc.backends.vm import guest as g
from hpvc.backends.vm import migration
from hpvc.errors import HpvcError, InputError
from hpvc.host import (
    disk_access,
    ivshmem,
    migration_guard,
    net,
    procfs,
    qemu_user,
    region_departure,
)
from hpvc.host.journal import Journal
from hpvc.plan import Plan, PlannedNode
from hpvc.plan.overlay import Overlay
from hpvc.progress import Progress
from hpvc.render.context import tap_name
from hpvc.render.qemu import render_qemu

# The node's writable layer travels with its memory; the base image does not.
BLOCK: list[migration.Command] = [
    ("migrate-set-capabilities", {"capabilities": [{"capability": "block", "state": True}]}),
    ("migrate-set-parameters", {"block-incremental": True}),
]


def qmp_socket(env: ClusterEnv, plan: Plan, node: str) -> str:
    return str(env.store.layout.node_run_dir(plan.cluster, node) / "qmp.sock")


def receive(
    backend: QemuBackend,
    env: ClusterEnv,
    plan: Plan,
    node: PlannedNode,
    settings: migration.MigrationSettings,
    address: str,
    source: str,
    progress: Progress,
    region_mib: int = 0,
) -> tuple[int, str]:
    """Start ``node`` of ``plan`` (already booked in ``env``'s record) as a paused
    migration target listening on ``address``, reachable from the fabric address
    ``source`` only (``hpvc.host.migration_guard``); (QEMU's PID, the URI to send
    to). ``region_mib``: the size of the source's ivshmem region (0: none), given
    to the target as a region of the node's own. Everything is journaled in the
    node's journal: undoing it removes the target, its region and its guard."""
    st = vm_state(env)
    guest = backend._guest(plan.image, progress)
    j = env.node_journal(node.name)
    # The context of this node alone (never the share's region here), the
    # cluster's uid and key.
    ctx = backend._context(env, replace(plan, nodes=(node,)), guest)
    if region_mib:
        own = ivshmem.allocate(j, env.store.root, own_region(plan.cluster, node.name),
                               region_mib, None)  # fmt: skip
        ctx = replace(ctx, ivshmem=(str(own), region_mib))
    overlay = Overlay.from_json(env.rec.overlay) if env.rec.overlay else None
    remotes = [n for v in overlay.remotes for n in v.nodes] if overlay else []
    node_ctx = g.node_context(env.store, plan, node, guest, ctx, remotes)
    net.create_tap(j, tap_name(plan.cluster, node.name), plan.network.bridge, plan.network.mtu)
    launch = render_qemu(plan, node, node_ctx)
    launch = replace(launch, argv=tuple(migration.incoming_argv(launch.argv)))
    progress(f"node {node.name}: starting the target QEMU (-incoming)")
    pid = vm_qemu.start_qemu(
        j,
        launch,
        log=env.node_dir(node.name) / "qemu.log",
        qmp_timeout=qmp_wait_s(node),
        console_cap=env.rec.console_bytes(),
    )
    st.pids[node.name] = pid
    _reopenable(env, plan, node.name, j)  # QEMU takes write access back at the switch-over
    vm_qemu.apply_pinning(launch.qmp_socket, pid, launch.pinning)
    run = migration.socket_runner(launch.qmp_socket, pid)
    run(*BLOCK)
    migration.listen(run, settings, migration.tcp_uri(address, 0))
    port = _listening_port(run)
    # Before anyone is told the port: only the source host reaches it.
    migration_guard.guard_target(j, launch.tap, address, port, source)
    return pid, migration.tcp_uri(address, port)


def _listening_port(run: migration.Runner) -> int:
    """The port a target told to listen on port 0 got (``query-migrate``)."""
    reply = run("query-migrate")[0]
    addresses = reply.get("socket-address", []) if isinstance(reply, dict) else []
    for a in addresses:
        if isinstance(a, dict) and str(a.get("port", "0")).isdigit() and int(a["port"]) > 0:
            return int(a["port"])
    raise HpvcError("migration target", f"no listening port in query-migrate: {reply!r:.200}")


def own_region(cluster: str, node: str) -> str:
    """The name a moved node's own region is held under (never its cluster's)."""
    return f"{cluster}:{node}"


def region_path(env: ClusterEnv, node: str) -> Path | None:
    """The ivshmem region file ``node``'s QEMU maps, or None."""
    from hpvc.backends.qemu import region  # it takes qmp_socket from this module

    pid = vm_state(env).pids.get(node)
    found = region.region_of(procfs.cmdline(pid) or []) if pid is not None else None
    return Path(found) if found else None


def region_mib(env: ClusterEnv, plan: Plan, node: str) -> int:
    """The size in MiB of the region ``node`` maps (0: none)."""
    path = region_path(env, node)
    return path.stat().st_size // ivshmem.MiB if path is not None else 0


def refusal(env: ClusterEnv, plan: Plan, node: str) -> str | None:
    """Why ``node`` cannot move to another host, or None; asked before anything moves."""
    pid = vm_state(env).pids.get(node)
    if pid is None:
        return "it has no QEMU recorded here"
    run = migration.socket_runner(qmp_socket(env, plan, node), pid)
    shm = region_path(env, node)
    why = region_departure.refusal(shm) if shm is not None else None
    if why is not None:
        return why
    reply = run("query-migrate")[0]
    if isinstance(reply, dict) and reply.get("blocked"):
        reasons = reply.get("blocked-reasons") or ["QEMU blocks migration"]
        return f"QEMU cannot migrate it: {'; '.join(map(str, reasons))}"
    return None


def send(
    env: ClusterEnv,
    plan: Plan,
    node: str,
    uri: str,
    settings: migration.MigrationSettings,
    progress: Progress,
) -> migration.MigrationStats:
    """Move ``node``'s guest to the target at ``uri``; QEMU's figures. On failure
    (``MigrationFailed``) the guest keeps running here."""
    pid = vm_state(env).pids.get(node)
    if pid is None:
        raise HpvcError(f"node {node}", "has no QEMU recorded here")
    why = refusal(env, plan, node)
    if why is not None:
        raise InputError(f"node {node}", why, "")
    run = migration.socket_runner(qmp_socket(env, plan, node), pid, command_s=30.0)
    run(*BLOCK)
    migration.apply_settings(run, settings)
    address, _, port = uri.removeprefix("tcp:").rpartition(":")
    # No other user of this host (nor a guest routed through it) connects first.
    uid = qemu_user.find(env.store.root, plan.cluster) or 0
    j = env.node_journal(node)
    table = migration_guard.guard_source(j, tap_name(plan.cluster, node), address, int(port), uid)
    disk = _reopenable(env, plan, node, j)  # QEMU reopens it read-only at the switch-over
    try:
        shm = region_path(env, node)
        if shm is not None:  # no process writes its FIFOs, nor it theirs, from here on
            left = region_departure.depart(shm, plan.node(node).ip)
            progress(f"node {node}: leaves the shared region; its pairs go over TCP"
                     f" ({left.members} processes let go in {left.waited_s:.2f} s)")  # fmt: skip
        paused = migration.start(run, uri)
        stats = migration.wait(run, settings.timeout_s, progress, paused=paused)
        if shm is not None:  # it runs on the target now: what it held here is free to take
            region_departure.gone(shm, plan.node(node).ip)
        return stats
    finally:
        migration_guard.remove(table)
        if disk is not None:
            disk_access.revoke(disk, [str(d) for d in disk_access.closed_folders(disk)], uid)


def _reopenable(env: ClusterEnv, plan: Plan, node: str, j: Journal) -> Path | None:
    """The node's disk reopenable by its QEMU's uid (``hpvc.host.disk_access``: why);
    the disk, or None when QEMU runs as root (no ``-runas``)."""
    uid = qemu_user.find(env.store.root, plan.cluster)
    if not uid:
        return None
    disk = env.store.node_dir(plan.cluster, node) / f"disk.{g.DISK_MODE}"
    disk_access.grant(j, disk, env.store.root, uid)
    return disk

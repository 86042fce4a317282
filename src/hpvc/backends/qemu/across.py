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

A node whose QEMU shares an ivshmem region with co-resident guests is refused
here: its device would have to be unplugged by the guest first (docs).
Architecture: docs/architecture.md (``backends/``: one folder per backend).
"""

from __future__ import annotations

from dataclasses import replace

from hpvc.backends.base import ClusterEnv
from hpvc.backends.qemu import process as vm_qemu
from hpvc.backends.qemu.backend import QemuBackend, qmp_wait_s, vm_state
from hpvc.backends.vm import guest as g
from hpvc.backends.vm import migration
from hpvc.errors import HpvcError, InputError
from hpvc.host import migration_guard, net, qemu_user
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
) -> tuple[int, str]:
    """Start ``node`` of ``plan`` (already booked in ``env``'s record) as a paused
    migration target listening on ``address``, reachable from the fabric address
    ``source`` only (``hpvc.host.migration_guard``); (QEMU's PID, the URI to send
    to). Everything is journaled in the node's journal: undoing it removes the
    target and its guard."""
    st = vm_state(env)
    guest = backend._guest(plan.image, progress)
    # The context of this node alone: no ivshmem region (the moved guest has
    # none: its devices must match the source's), the cluster's uid and key.
    ctx = backend._context(env, replace(plan, nodes=(node,)), guest)
    overlay = Overlay.from_json(env.rec.overlay) if env.rec.overlay else None
    remotes = [n for v in overlay.remotes for n in v.nodes] if overlay else []
    node_ctx = g.node_context(env.store, plan, node, guest, ctx, remotes)
    j = env.node_journal(node.name)
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


def has_ivshmem(env: ClusterEnv, plan: Plan, node: str) -> bool:
    """Whether the node's QEMU has the cluster's ivshmem region (co-resident guests)."""
    run = migration.socket_runner(qmp_socket(env, plan, node), vm_state(env).pids.get(node))
    reply = run(("qom-list", {"path": "/objects"}))[0]
    return isinstance(reply, list) and any(
        isinstance(o, dict) and o.get("name") == "ivshmem0" for o in reply
    )


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
    if has_ivshmem(env, plan, node):
        raise InputError(
            f"node {node}",
            "shares an ivshmem region with the guests beside it on this host",
            'give the job\'s spec tuning.locality = "none" to move its nodes between hosts',
        )
    run = migration.socket_runner(qmp_socket(env, plan, node), pid, command_s=30.0)
    run(*BLOCK)
    migration.apply_settings(run, settings)
    address, _, port = uri.removeprefix("tcp:").rpartition(":")
    # No other user of this host (nor a guest routed through it) connects first.
    uid = qemu_user.find(env.store.root, plan.cluster) or 0
    j = env.node_journal(node)
    table = migration_guard.guard_source(j, tap_name(plan.cluster, node), address, int(port), uid)
    try:
        migration.start(run, uri)
        return migration.wait(run, settings.timeout_s, progress)
    finally:
        migration_guard.remove(table)

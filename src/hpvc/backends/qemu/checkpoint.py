"""Checkpoint and restore of QEMU nodes (``QemuBackend``'s ``freeze``, ``thaw``,
``save``, ``restore_nodes``; docs/checkpoint.md).

freeze: QMP ``stop`` on each node (every vCPU of every guest stops before any
state is saved: the cluster layer freezes all nodes first). save, per frozen
node, into its folder of the checkpoint:

- ``state.bin``: memory, CPUs and devices, QEMU's migration stream
  (``hpvc.backends.qemu.snapshot``);
- ``disk.qcow2``: the node's writable disk, copied after the stream is
  written (QEMU has then flushed and let go of it; the vCPUs are stopped, so
  nothing writes it); it is an overlay over the image's base disk, which the
  checkpoint names by digest, not copies;
- ``shared.img``: the NFS server node's backing disk of the shared directory
  (``[shared] server = "nfs"``: the data lives in that disk, nowhere else);
- ``keys/``: the cluster's ssh key and agent key: the saved guests hold their
  public half and the agent key in memory, so the restored cluster needs the
  same ones (the checkpoint's folder is root's alone).

restore: per node, the folder, tap and overlay as ``start`` makes them
(journaled the same way, so ``down`` and a failed restore undo them), the
saved disk copied over the new overlay and pointed at this host's base disk,
then QEMU with the node's command line plus ``-incoming defer -S``, pinned,
fed ``state.bin``; it stays paused until ``thaw`` (QMP ``cont``) runs on all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpvc.backends.agentkey import AGENT_KEY
from hpvc.backends.base import ClusterEnv
from hpvc.backends.qemu import process as vm_qemu
from hpvc.backends.qemu import snapshot
from hpvc.backends.vm import guest as g
from hpvc.backends.vm import guest_shared
from hpvc.errors import HpvcError, InputError
from hpvc.faults import inject
from hpvc.host import net, qemu_access, qemu_user
from hpvc.plan import Plan, PlannedNode
from hpvc.plan.overlay import Overlay
from hpvc.progress import Progress
from hpvc.render.context import RenderContext, tap_name
from hpvc.render.qemu import render_qemu

if TYPE_CHECKING:
    from hpvc.backends.qemu.backend import QemuBackend

STATE = "state.bin"
DISK = f"disk.{g.DISK_MODE}"
SHARED_IMG = "shared.img"
KEYS = "keys"
KEY_FILES = ("id_ed25519", "id_ed25519.pub", AGENT_KEY)
SAVE_S, SAVE_S_PER_GIB = 60.0, 30.0  # a busy host writes a few hundred MiB/s at worst


def _timeout(node: PlannedNode) -> float:
    return SAVE_S + SAVE_S_PER_GIB * node.memory_mib / 1024


def _qmp(env: ClusterEnv, plan: Plan, name: str) -> Path:
    return env.store.layout.node_run_dir(plan.cluster, name) / "qmp.sock"


def freeze(b: QemuBackend, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
    for name in names:
        snapshot.stop_vcpus(_qmp(env, plan, name), b.node_pid(env, plan, plan.node(name)))


def thaw(b: QemuBackend, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
    for name in names:
        snapshot.resume(_qmp(env, plan, name), b.node_pid(env, plan, plan.node(name)))


def _copy(src: Path, dest: Path) -> None:
    """Copy a file's bytes into ``dest`` (a file already there keeps its inode,
    owner and mode: QEMU's uid may need them)."""
    try:
        shutil.copyfile(src, dest)
    except OSError as e:
        raise HpvcError(f"copy {src} to {dest}", e.strerror or str(e)) from e


def _let_qemu_reopen(env: ClusterEnv, plan: Plan, name: str) -> None:
    """ACL entries that let the node's QEMU, running as its cluster's uid, open its
    disks again by path: when migration completes QEMU lets go of them
    (``bdrv_inactivate_all``: the image files are reopened read-only) and ``cont``
    takes them back read-write, each a new open(2) as that uid, which hpvc's
    root-only folders refuse ("bdrv_inactivate_all() failed (-1)"). The
    node's disk is journaled with the node, the base disks with the cluster."""
    uid = qemu_user.find(env.store.root, plan.cluster)
    if uid is None:  # QEMU runs as root: it opens what it likes
        return
    lock = env.store.root / qemu_access.LOCK_NAME
    node_dir = Path(os.path.realpath(env.node_dir(name)))
    disks = [env.node_dir(name) / DISK]
    sh = guest_shared.nfs_of(plan)
    if sh is not None and sh.node == name:
        disks.append(guest_shared.image_path(env, sh))
    for disk in disks:
        mine = Path(os.path.realpath(disk)).is_relative_to(node_dir)
        journal = env.node_journal(name) if mine else env.journal()
        qemu_access.grant(journal, uid, disk, "rw", lock=lock)  # each entry once
        for base in qemu_access.backing_chain(disk):
            qemu_access.grant(env.journal(), uid, base, "r", lock=lock)


def save(
    b: QemuBackend, env: ClusterEnv, plan: Plan, name: str, dest: Path, progress: Progress
) -> dict[str, Any]:
    node = plan.node(name)
    pid = b.node_pid(env, plan, node)
    _let_qemu_reopen(env, plan, name)
    progress(f"node {name}: saving memory and devices ({node.memory_mib} MiB)")
    log = env.node_dir(name) / "qemu.log"
    snapshot.save_state(_qmp(env, plan, name), pid, dest / STATE, _timeout(node), log)
    inject(f"save:{name}")
    progress(f"node {name}: copying its disk")
    _copy(env.node_dir(name) / DISK, dest / DISK)
    files = [STATE, DISK]
    sh = guest_shared.nfs_of(plan)
    if sh is not None and sh.node == name:
        _copy(guest_shared.image_path(env, sh), dest / SHARED_IMG)
        files.append(SHARED_IMG)
    (dest / KEYS).mkdir(mode=0o700)
    for key in KEY_FILES:
        if (env.dir / key).exists():
            _copy(env.dir / key, dest / KEYS / key)
            files.append(f"{KEYS}/{key}")
    from hpvc.backends.qemu.backend import QEMU, vm_state

    version = subprocess.run([QEMU, "--version"], capture_output=True, text=True, check=False)
    return {
        "files": files,
        "qemu": (version.stdout.splitlines() or [""])[0],
        "accel": vm_state(env).accel,
        "memory_mib": node.memory_mib,
        "vcpus": len(node.vcpus),
    }


def _restore_keys(env: ClusterEnv, src: Path, names: list[str]) -> None:
    """The saved cluster keys into the new cluster's folder (before QEMU reads
    the agent key: ``_context``)."""
    for key in KEY_FILES:
        saved = src / names[0] / KEYS / key
        if saved.exists():
            (env.dir / key).unlink(missing_ok=True)
            _copy(saved, env.dir / key)
            (env.dir / key).chmod(0o644 if key.endswith(".pub") else 0o600)


def _start_incoming(
    b: QemuBackend, env: ClusterEnv, plan: Plan, node: PlannedNode, ctx: RenderContext
) -> int:
    """``start_node`` for a node that loads its state: the same command line with
    ``-incoming defer -S`` (QEMU waits, paused, for the stream)."""
    from hpvc.backends.qemu.backend import qmp_wait_s

    j = env.node_journal(node.name)
    net.create_tap(j, tap_name(plan.cluster, node.name), plan.network.bridge, plan.network.mtu)
    launch = render_qemu(plan, node, ctx)
    launch = replace(launch, argv=(*launch.argv, *snapshot.INCOMING_ARGS))
    pid = vm_qemu.start_qemu(
        j,
        launch,
        log=env.node_dir(node.name) / "qemu.log",
        qmp_timeout=qmp_wait_s(node),
        console_cap=env.rec.console_bytes(),
    )
    vm_qemu.apply_pinning(launch.qmp_socket, pid, launch.pinning)
    return pid


def _check_saved(src: Path, names: list[str]) -> None:
    for name in names:
        if not (src / name / STATE).is_file():
            raise InputError(f"checkpoint {src.parent}", f"node {name} has no {STATE}")


def restore_nodes(
    b: QemuBackend,
    env: ClusterEnv,
    plan: Plan,
    names: list[str],
    src: Path,
    progress: Progress,
) -> None:
    from hpvc.backends.qemu.backend import vm_state

    _check_saved(src, names)
    st = vm_state(env)
    _restore_keys(env, src, names)
    guest = b._guest(plan.image, progress)
    ctx = b._context(env, plan, guest)
    overlay = Overlay.from_json(env.rec.overlay) if env.rec.overlay else None
    remotes = [n for v in overlay.remotes for n in v.nodes] if overlay else []
    sh = guest_shared.nfs_of(plan)
    for name in names:
        node = plan.node(name)
        progress(f"node {name}: its disk and QEMU, loading its saved state")
        node_ctx = g.node_context(env.store, plan, node, guest, ctx, remotes)
        disk = env.node_dir(name) / DISK
        _copy(src / name / DISK, disk)
        _rebase(disk, guest.disk)
        if sh is not None and sh.node == name and (src / name / SHARED_IMG).exists():
            _copy(src / name / SHARED_IMG, guest_shared.image_path(env, sh))
        _let_qemu_reopen(env, plan, name)  # an incoming QEMU opens its disks at cont
        st.pids[name] = pid = _start_incoming(b, env, plan, node, node_ctx)
        env.save()  # its PID: a failure from here on is undone by the journals alone
        inject(f"restore:{name}")
        log = env.node_dir(name) / "qemu.log"
        snapshot.load_state(_qmp(env, plan, name), pid, src / name / STATE, _timeout(node), log)


def _rebase(disk: Path, base: Path) -> None:
    """Point a saved overlay at this host's base disk of the same image (the
    digest matched; only its path may differ), without touching the data."""
    argv = ["qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", str(base), str(disk)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HpvcError(f"disk {disk}", done.stderr.strip() or "qemu-img rebase failed")

"""The VM backend that runs QEMU directly: one process per node, pinned over QMP.

Per node: a disk over the image's (``hpvc.backends.vm.guest``), a tap on the
cluster bridge, QEMU from the command line ``hpvc render`` writes, and vCPU
and emulator threads pinned over QMP (``hpvc.backends.qemu.process``). Nodes boot
in parallel; ``start`` returns once every new guest is ready and configured.
``LibvirtBackend`` (``hpvc.backends.libvirt.backend``) differs only in how a node is
started, read back and repinned.
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from hpvc.backends import agentkey
from hpvc.backends.base import (
    Capabilities,
    ClusterEnv,
    InNodeLaunch,
    MpiLaunch,
    Phases,
    State,
    TaskEntry,
    undo_nodes,
)
from hpvc.backends.qemu import checkpoint, leftovers
from hpvc.backends.qemu import process as vm_qemu
from hpvc.backends.qemu.qmp import QMP_CONNECT_S
from hpvc.backends.vm import binds as vm_binds
from hpvc.backends.vm import guest as g
from hpvc.backends.vm import guest_shared, tasks
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.faults import inject
from hpvc.host import net, procfs, qemu_user
from hpvc.host.accel import accelerator
from hpvc.host.orphans import Keep, Orphan
from hpvc.image import resolve_image
from hpvc.image.guest import GuestArtifacts, build_guest
from hpvc.plan import Plan, PlannedNode
from hpvc.plan.overlay import Overlay
from hpvc.progress import Progress
from hpvc.render.context import RenderContext, tap_name
from hpvc.render.qemu import qemu_name, qemu_pinning, render_qemu
from hpvc.spec import Spec

QEMU = "qemu-system-x86_64"

VM_RANK_SCRIPT = """#!/bin/bash
# hpvc: start MPI rank $OMPI_COMM_WORLD_RANK inside its VM over ssh (see ranks beside this file).
set -e
here=$(dirname "$0")
ip=$(sed -n "$((OMPI_COMM_WORLD_RANK + 1))p" "$here/ranks")
args=()
while IFS= read -r -d '' kv; do
  case "$kv" in OMPI_*|PMIX_*|OPAL_*|ORTE_*|HPVC_*) args+=("$(printf '%q' "$kv")");; esac
done < <(env -0)
cmd=()
for a in "$@"; do cmd+=("$(printf '%q' "$a")"); done
exec ssh -i "$here/id_ed25519" {opts} "root@$ip" env "${{args[@]}}" "${{cmd[@]}}"
"""


PREALLOC_S_PER_GIB = 5.0  # QEMU answers QMP once its memory is preallocated: on a busy
# host zeroing a GiB took up to a few seconds (a 4 GiB guest beside running JVMs
# missed the 10 s a bare start needs)


def qmp_wait_s(node: PlannedNode) -> float:
    """How long to wait for a node's QEMU to answer QMP: a bare start's wait, plus
    time to preallocate its memory."""
    return QMP_CONNECT_S + PREALLOC_S_PER_GIB * node.memory_mib / 1024


@dataclass
class VmState(State):
    """What a VM backend keeps of a running cluster."""

    accel: str = "tcg"
    accel_warning: str | None = None
    pids: dict[str, int] = field(default_factory=dict)  # node -> its QEMU
    ivshmem: list[Any] | None = None  # [path, MiB] shared by co-resident guests
    boot_seconds: dict[str, float] = field(default_factory=dict)
    libvirt_uri: str | None = None  # the libvirt backend's connection
    # An image without sshd: the host's hpvc-rsh (its guest build's) that reaches
    # the guests' agents, and the image's Env and WorkingDir for ``exec``; "" : ssh.
    agent_rsh: str = ""
    image_env: list[str] = field(default_factory=list)
    image_workdir: str = ""


def vm_state(env: ClusterEnv) -> VmState:
    assert isinstance(env.state, VmState)
    return env.state


class QemuBackend:
    name: ClassVar[str] = "qemu"
    kind: ClassVar[str] = "vm"
    # Ranks in different guests share no memory: MPI takes the network path.
    capabilities: ClassVar[Capabilities] = Capabilities(
        repin=True, shared_memory=False, checkpoint=True, job_user_daemons=False
    )

    def __init__(self) -> None:
        self._guests: dict[str, GuestArtifacts] = {}

    def new_state(self) -> VmState:
        return VmState()

    def load_state(self, data: dict[str, Any]) -> VmState:
        return VmState.from_json(data)

    def preflight(self, spec: Spec) -> None:
        if shutil.which(QEMU) is None:
            raise MissingDependency(
                "VM nodes", f"{QEMU} not found", "apt-get install qemu-system-x86"
            )
        accelerator()  # a bad HPVC_ACCEL is bad input: refused before any change
        guest_shared.preflight(spec)  # an NFS shared directory needs Ganesha in the image

    def build_image(self, spec: Spec, progress: Progress) -> None:
        self._guest(spec.image, progress)

    def _guest(self, image: str, progress: Progress) -> GuestArtifacts:
        """Kernel, initramfs and base disk of ``image`` (built once; remembered
        here so one command does not look them up again)."""
        resolved = resolve_image(image)
        found = self._guests.get(resolved.digest)
        if found is None:
            found = self._guests[resolved.digest] = build_guest(resolved, progress=progress)
        return found

    def prepare(self, env: ClusterEnv, plan: Plan, progress: Progress) -> None:
        """The cluster's ssh key, the accelerator its guests run on, and how hpvc
        reaches them: ssh, or their agents where the image has no sshd."""
        st = vm_state(env)
        g.ssh_key(env.dir)
        image = resolve_image(plan.image)
        if not g.has_sshd(image):
            st.agent_rsh = str(self._guest(plan.image, progress).disk.with_name("hpvc-rsh"))
            st.image_env, st.image_workdir = list(image.env), image.workdir
        env.store.run_dir(env.name)  # QMP and console sockets: root's alone
        # The warning (TCG) is shown once, by status (``summary``), under the
        # nodes' table `up` and `scale` print; their boot line names the accelerator.
        choice = accelerator()
        st.accel, st.accel_warning = choice.name, choice.warning
        guest_shared.prepare(env, plan)  # the NFS server's backing image

    # --- nodes ---------------------------------------------------------------

    def start_node(self, env: ClusterEnv, plan: Plan, node: PlannedNode, ctx: RenderContext) -> int:
        """Tap, QEMU and pinning for one node; QEMU's PID (the guest not yet booted)."""
        j = env.node_journal(node.name)
        net.create_tap(j, tap_name(plan.cluster, node.name), plan.network.bridge, plan.network.mtu)
        launch = render_qemu(plan, node, ctx)
        pid = vm_qemu.start_qemu(
            j,
            launch,
            log=env.node_dir(node.name) / "qemu.log",
            qmp_timeout=qmp_wait_s(node),
            console_cap=env.rec.console_bytes(),  # the serial console's log, kept to it
        )
        vm_qemu.apply_pinning(launch.qmp_socket, pid, launch.pinning)
        return pid

    def _context(self, env: ClusterEnv, plan: Plan, guest: GuestArtifacts) -> RenderContext:
        st = vm_state(env)
        ctx = g.vm_context(env.store, guest, env.rec.hugetlbfs, st.accel)
        # Locality for VMs: co-resident guests share an ivshmem region (a PCI BAR).
        locality = str(env.rec.spec.get("tuning", {}).get("locality", "shm"))
        shm = g.ivshmem_for(env.store, plan, env.journal(), locality)
        if shm is not None:
            st.ivshmem = list(shm)
            ctx = replace(ctx, ivshmem=shm)
        # Every QEMU of the cluster drops to the cluster's own uid, sandboxed.
        ctx = replace(ctx, qemu_uid=qemu_user.claim(env.journal(), env.store.root, plan.cluster))
        # The agents' key (fw_cfg: read by QEMU as root, before it drops to that uid).
        overlay = Overlay.from_json(env.rec.overlay) if env.rec.overlay else None
        key = agentkey.agent_key(env.store, plan.cluster, overlay.key_id if overlay else "")
        ctx = replace(ctx, agent_key=str(key))
        return guest_shared.context(env, plan, guest, ctx)  # NFS: its initramfs and disk

    def start(self, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress) -> Phases:
        """Start the VMs (they boot in parallel), wait for all, configure them."""
        if not names:
            return {}
        st = vm_state(env)
        guest = self._guest(plan.image, progress)
        ctx = self._context(env, plan, guest)
        # A Slurm job's share: the nodes on the job's other hosts, by VXLAN.
        overlay = Overlay.from_json(env.rec.overlay) if env.rec.overlay else None
        remotes = [n for v in overlay.remotes for n in v.nodes] if overlay else []
        t0 = time.perf_counter()
        over_ssh = []
        binds = vm_binds.shares(env, progress)  # the site's binds, as the job's user
        for name in names:
            progress(f"node {name}: starting QEMU")
            node = plan.node(name)
            node_ctx = g.node_context(env.store, plan, node, guest, ctx, remotes, binds)
            if not g.configured_at_boot(node_ctx):
                over_ssh.append(name)
            node_ctx = vm_binds.serve(env, plan, node, node_ctx, binds)  # virtiofsd per bind
            st.pids[name] = self.start_node(env, plan, node, node_ctx)
            inject(f"node:{name}")
        t1 = time.perf_counter()
        progress(f"waiting for {len(names)} guest(s) to boot ({ctx.accel})")
        waited = g.wait_all(env.store, plan, {n: st.pids[n] for n in names}, ctx, g.READY_TIMEOUT_S)
        t2 = time.perf_counter()
        st.boot_seconds.update(waited)
        if over_ssh:
            progress(f"configuring {len(over_ssh)} guest(s) over ssh (too many nodes to boot with)")
            g.configure(env.store, plan, over_ssh, st.agent_rsh)
        t3 = time.perf_counter()
        shared_s = guest_shared.start(env, plan, names, progress)
        # start: disks, taps, QEMU, pinning; boot: to every hpvc-ready line (the
        # guests' hosts and ARP made by their init); configure: the same over ssh
        # for guests whose command line could not carry them; shared: NFS.
        phases = {"start": t1 - t0, "boot": t2 - t1, "configure": t3 - t2}
        return phases | ({"shared": shared_s} if shared_s is not None else {})

    def stop(self, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress) -> None:
        st = vm_state(env)
        errors = undo_nodes(env, names, progress)
        for name in names:
            st.pids.pop(name, None)
        if errors:
            raise HpvcError(f"remove {', '.join(names)}", errors[0], "run hpvc down")

    def refresh(self, env: ClusterEnv, old: Plan, plan: Plan, progress: Progress) -> None:
        """Guests that stay get the new /etc/hosts and ARP entries over ssh."""
        staying = [n.name for n in plan.nodes if n.name in {o.name for o in old.nodes}]
        if staying and {n.name for n in old.nodes} != {n.name for n in plan.nodes}:
            g.configure(env.store, plan, staying, vm_state(env).agent_rsh)

    def repin(self, env: ClusterEnv, old: Plan, plan: Plan) -> None:
        """Running VMs whose floating set or emulator CPUs changed get them live."""
        before = {n.name: n for n in old.nodes}
        for n in plan.nodes:
            was = before.get(n.name)
            if was is None or (was.cpuset, was.emulator_cpus) == (n.cpuset, n.emulator_cpus):
                continue
            self.repin_node(env, plan, n)

    def repin_node(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> None:
        qmp = env.store.layout.node_run_dir(plan.cluster, node.name) / "qmp.sock"
        vm_qemu.apply_pinning(qmp, vm_state(env).pids[node.name], qemu_pinning(node))

    # --- reading back --------------------------------------------------------

    def live_pid(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> int | None:
        """The node's QEMU as /proc has it: the recorded PID while it is still that
        QEMU, else the process running under the node's ``-name`` (an ``up``
        killed before it recorded its PIDs); None when none runs."""
        name = qemu_name(plan, node)
        pid = vm_state(env).pids.get(node.name)
        if pid and procfs.is_qemu(pid, name) and procfs.running(pid):
            return pid
        found = [p for p in procfs.find_qemu(name) if procfs.running(p)]
        return found[0] if found else None

    def node_state(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> str:
        return "running" if self.live_pid(env, plan, node) else "stopped"

    def read_back(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> dict[str, Any]:
        """Thread affinities and memory backends, over QMP and from /proc."""
        pid = self.live_pid(env, plan, node)
        if pid is None:
            raise HpvcError(f"node {node.name}", "is not running")
        qmp = env.store.layout.node_run_dir(plan.cluster, node.name) / "qmp.sock"
        return dict(vm_qemu.read_back(pid, qmp))

    def node_status(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> dict[str, Any]:
        out: dict[str, Any] = {
            "state": self.node_state(env, plan, node),
            "network": {"address": node.ip, "mtu": plan.network.mtu},
        }
        if out["state"] == "running":
            try:
                out["vm"] = self.read_back(env, plan, node)
            except HpvcError as e:
                out["vm"] = {"error": e.why}
        return out

    def emulated(self, env: ClusterEnv) -> bool:
        return vm_state(env).accel == "tcg"  # the accelerator `up` chose

    def summary(self, env: ClusterEnv) -> dict[str, Any]:
        """The accelerator the running QEMUs use (read from their command lines;
        the one ``up`` chose while none runs)."""
        st = vm_state(env)
        plan = env.rec.the_plan()
        live, running = set(), []
        for node in plan.nodes:
            pid = self.live_pid(env, plan, node)
            argv = procfs.cmdline(pid) if pid else None
            accel = vm_qemu.accel_of(argv) if argv else None
            if accel:
                live.add(accel)
            running += [node.name] if pid else []
        return {
            "backend": self.name,
            "accelerator": ",".join(sorted(live)) if live else st.accel,
            "accelerator_warning": st.accel_warning,
            # Guests mount no host directory (no 9p/virtiofs); NFS: read in the guests.
            "shared_dir": guest_shared.status(env, plan, running),
        }

    def node_pid(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> int:
        pid = self.live_pid(env, plan, node)
        if not pid:
            raise HpvcError(f"node {node.name}", "is not running", f"hpvc down {env.name}")
        return pid

    def exec_argv(
        self, env: ClusterEnv, plan: Plan, node: PlannedNode, argv: list[str], tty: bool = False
    ) -> list[str]:
        st = vm_state(env)
        if st.agent_rsh:  # no sshd in the image: through the guest's agent
            if not os.path.isfile(st.agent_rsh):  # its guest build was removed since
                raise HpvcError(
                    f"node {node.name}",
                    f"{st.agent_rsh} (how hpvc reaches a guest without sshd) is gone",
                    f"hpvc down {env.name}, then hpvc up again",
                )
            return g.agent_argv(
                st.agent_rsh, env.dir, node.ip, argv, st.image_env, st.image_workdir, tty=tty
            )
        return g.ssh_argv(env.dir, node.ip, argv, tty=tty)

    def exec_status(
        self, env: ClusterEnv, plan: Plan, node: PlannedNode, argv: list[str], rc: int
    ) -> int:
        return rc  # ssh passes the guest shell's 127/126 through, the agent its own

    def in_node_launch(self, env: ClusterEnv, plan: Plan) -> InNodeLaunch | None:
        """Every guest runs the agent (native/guest/init.c) and has hpvc-rsh; mpirun
        there gets what a Slurm task's does (hpvc.backends.vm.tasks: eth0, root)."""
        return InNodeLaunch(tasks.RSH, tasks.TASK_ENV)

    def mpi_launch(self, env: ClusterEnv, plan: Plan) -> MpiLaunch:
        if vm_state(env).agent_rsh:  # the rank script below is ssh's
            raise InputError(
                f"hpvc run with Open MPI in VM cluster {env.name}",
                f"image {plan.image!r} has no sshd ({g.SSHD}), which starts its ranks",
                "use an image with openssh-server (/usr/sbin/sshd) for Open MPI jobs",
            )
        return MpiLaunch(
            script=VM_RANK_SCRIPT.format(opts=shlex.join(g.SSH_OPTS)),
            targets={n.name: n.ip for n in plan.nodes},
            # The host's PMIx server (in mpirun) would publish job data in shared
            # memory under its session dir (gds ds21/ds12), which ranks in guests
            # cannot map: every rank then failed to take the dstore's lock ("PMIX
            # ERROR ... gds_ds12_lock_pthread.c"). The hash component serves the
            # same data over the ranks' TCP connection to the server.
            env={"PMIX_MCA_gds": "hash"},
        )

    def task_entry(self, mpi: str) -> TaskEntry:
        """Tasks relay to the guest's agent (``hpvc.backends.vm.tasks``)."""
        return tasks.task_entry(mpi)

    def orphans(self, keep: Keep, prefix: str) -> list[Orphan]:
        """QEMU processes hpvc named (``hpvc.backends.qemu.leftovers``)."""
        return leftovers.find(keep, prefix)

    def remove_orphan(self, orphan: Orphan) -> None:
        leftovers.remove(orphan)

    # --- checkpoint (issue 28): hpvc.backends.qemu.checkpoint ----------------------

    def refuse_checkpoint(self, env: ClusterEnv, plan: Plan) -> None:
        """Nothing more than the cluster layer's refusals: QEMU saves a guest whole."""

    def freeze(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        checkpoint.freeze(self, env, plan, names)

    def thaw(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        checkpoint.thaw(self, env, plan, names)

    def save(
        self, env: ClusterEnv, plan: Plan, name: str, dest_dir: Path, progress: Progress
    ) -> dict[str, Any]:
        return checkpoint.save(self, env, plan, name, dest_dir, progress)

    def restore_nodes(
        self, env: ClusterEnv, plan: Plan, names: list[str], src_dir: Path, progress: Progress
    ) -> None:
        checkpoint.restore_nodes(self, env, plan, names, src_dir, progress)

"""The container backend: each node an OCI container run by crun.

Per cluster: a cgroup parent holding the cluster's CPUs (exclusive for an
``hpc`` partition), a namespace holder and a tmpfs shared as /dev/shm when
co-resident nodes talk through shared memory, bfq on the state disk when a
node has an I/O weight. Per node: a writable layer of the spec's ``disk``
size (``hpvc.host.layer``: ext4 on a loop device), an overlay root over the
image whose upper folder is in that layer, its own
network namespace with a veth on the cluster bridge, and the container
itself (``hpvc.backends.crun.container`` holds those crun and mount primitives).

A tenant's cluster (``ClusterRecord.tenant``: a Slurm share, run for an
ordinary user) gets every mount a user can reach nosuid,nodev: the node's
root, its /dev/shm and the folders bound into it, so the image's setuid
binaries (su, mount, passwd) give a user inside nothing. Root's own clusters
(``hpvc up``) keep the image as it is: root runs them for itself.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hpvc.backends import agentkey, shared
from hpvc.backends.agentkey import AGENT_KEY
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
from hpvc.backends.crun import container as ct
from hpvc.backends.crun import nodeinit, ranks
from hpvc.concurrent import each
from hpvc.errors import HpvcError, InputError
from hpvc.faults import inject
from hpvc.host import blkio, cgroups, layer, net, procfs, tree
from hpvc.image import oci, resolve_image
from hpvc.image.mpi import DEFAULT_PATH
from hpvc.image.rootfs import missing_for_node
from hpvc.plan import Plan, PlannedNode
from hpvc.plan.overlay import Overlay
from hpvc.progress import Progress
from hpvc.render import files as render_files
from hpvc.render.context import DEFAULT_ENV, RenderContext
from hpvc.units import format_cpulist

if TYPE_CHECKING:  # the spec's schema (pydantic), gc's netlink: not on status's path (issue 33)
    from hpvc.host.orphans import Keep, Orphan
    from hpvc.spec import Spec

SHM_MIB = 1024


@dataclass
class CrunState(State):
    """What the container backend keeps of a running cluster."""

    shm: str | None = None  # the tmpfs co-resident nodes share as /dev/shm
    holder_pid: int | None = None  # init of the IPC+PID namespaces they join
    block_device: list[int] | None = None  # (major, minor) the I/O limits apply to
    node_init: bool = False  # init hpvc-nodeinit, commands under it (crun.nodeinit)
    agent: bool = False  # and an hpvc-agent in each node, hpvc-rsh bound (crun.nodeinit)


def _state(env: ClusterEnv) -> CrunState:
    assert isinstance(env.state, CrunState)
    return env.state


def render_context(env: ClusterEnv) -> RenderContext:
    """How the OCI config of this cluster's nodes is rendered on this host."""
    st = _state(env)
    dev = st.block_device
    plan = env.rec.the_plan()
    init = nodeinit.node_init(st.node_init, env.dir / AGENT_KEY if st.agent else None)
    return RenderContext(
        base_dir=str(env.store.root),
        node_rootfs=True,
        command=init.command,
        # An imported image's Env (hpvc image import): the init's and, as crun
        # exec inherits it, every `hpvc exec`'s; mpirun's way to the other nodes.
        env=oci.merged_env(resolve_image(plan.image).env, (*DEFAULT_ENV, *init.env)),
        hugetlbfs=tuple((int(k), v) for k, v in env.rec.hugetlbfs.items()),
        shared_ns_pid=st.holder_pid,
        shared_shm=st.shm,
        shm_size_mib=SHM_MIB,
        binds=(
            # Open MPI's session dir: same path inside as outside (PMIx files).
            (str(env.dir / "mpi"), str(env.dir / "mpi"), False),
            # A host folder every node sees, like a cluster's shared home
            # (none here when it is served over NFS: see node_binds).
            *shared.binds(env, plan),
            # Host directories a site shares with Slurm jobs' nodes (hpvc.slurm).
            *((p, p, False) for p in env.rec.binds),
            *init.binds,  # the nodes' init (and hpvc-rsh, the agent's key), read-only
        ),
        node_binds=shared.node_binds(plan),
        block_device=(int(dev[0]), int(dev[1])) if dev else None,
        tenant=env.rec.tenant,
    )


def cluster_memory(plan: Plan) -> tuple[int, dict[int, int]]:
    """(normal MiB, page KiB -> hugepage MiB) of the plan's nodes together: what
    the cluster's cgroup parent holds them to (a Slurm share: what its host runs)."""
    normal = sum(n.normal_mib for n in plan.nodes)
    huge: dict[int, int] = {}
    for n in plan.nodes:
        if n.hugepages is not None:
            size = n.hugepages.size_kib
            huge[size] = huge.get(size, 0) + n.hugepage_mib
    return normal, huge


def io_warning(env: ClusterEnv, plan: Plan) -> str | None:
    """Nodes with block-I/O limits whose disk (their writable layer, in the state
    directory) is on no block device: the limits cannot apply, say so."""
    limited = [n.name for n in plan.nodes if n.io is not None]
    why = blkio.no_block_device(env.store.root) if limited else None
    if why is None:
        return None
    return (
        f"block-I/O limits of {', '.join(limited)} not applied: the nodes' disks are in"
        f" the state directory and {why} (put HPVC_STATE_DIR on a disk)"
    )


def remote_arp(env: ClusterEnv) -> list[tuple[str, str]]:
    """Static ARP entries of the cluster's nodes on other hosts (none on one host)."""
    return Overlay.from_json(env.rec.overlay).arp_entries() if env.rec.overlay else []


class CrunBackend:
    name: ClassVar[str] = "crun"
    kind: ClassVar[str] = "container"
    capabilities: ClassVar[Capabilities] = Capabilities(
        repin=True, shared_memory=True, pages_on_demand=True, checkpoint=True
    )

    def new_state(self) -> CrunState:
        return CrunState()

    def load_state(self, data: dict[str, Any]) -> CrunState:
        return CrunState.from_json(data)

    def preflight(self, spec: Spec) -> None:
        ct.runtime()
        nodeinit.preflight()  # MissingDependency, nothing changed
        shared.preflight(spec)

    def build_image(self, spec: Spec, progress: Progress) -> None:
        # The rootfs `hpvc image build` made or `hpvc image import` brought, or
        # exit 2; refused before any host change when it lacks what the init runs.
        image = resolve_image(spec.image)
        missing = missing_for_node(image.rootfs, image.env)
        if missing:
            raise InputError(
                f"image {spec.image!r}",
                f"has no {' or '.join(missing)}, which a container node's init runs",
                "add them to the image (busybox has both)",
            )

    def prepare(self, env: ClusterEnv, plan: Plan, progress: Progress) -> None:
        """The cluster's cgroup parent, shared memory and the disk scheduler."""
        st = _state(env)
        j = env.journal()
        cpus = sorted({c for n in plan.nodes for c in n.cpuset})
        mems = sorted({c.host_node for n in plan.nodes for c in n.numa})
        with cgroups.v1_mount_lock():  # no other job's teardown unbinds hugetlb meanwhile
            cgroups.ensure_hugetlb_v1(env.host_journal())
            cgroups.ensure_cluster_cgroup(
                j,
                env.name,
                cpus=format_cpulist(cpus),
                mems=format_cpulist(mems),
                exclusive=any(n.partition == "hpc" for n in plan.nodes),
            )
        inject("cgroup")
        shared.prepare(env, plan)
        if env.rec.spec.get("tuning", {}).get("locality", "shm") == "shm":
            ct.mount_tmpfs(j, env.dir / "shm", SHM_MIB, tenant=env.rec.tenant)
            st.shm = str(env.dir / "shm")
            st.holder_pid = ct.start_holder(j, env.dir / "holder.pid", env.name)
        st.node_init = True
        st.agent = nodeinit.wanted(env.rec.tenant, bool(env.rec.overlay))  # in each node
        if st.agent:  # its key in the cluster's folder, gone with it at down
            agentkey.agent_key(env.store, env.name)
        dev = blkio.block_device(env.store.root)
        st.block_device = list(dev) if dev else None
        warning = io_warning(env, plan)
        if warning is not None:
            progress(f"warning: {warning}")
        if dev is not None and any(n.io and n.io.weight for n in plan.nodes):
            # Weights need the bfq scheduler; the device is host-wide, so is the undo.
            blkio.ensure_bfq(env.host_journal(), blkio.device_name(dev))

    def start(self, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress) -> Phases:
        rootfs = resolve_image(plan.image).rootfs
        ctx = render_context(env)
        sizes = [plan.node(n).disk_mib for n in names]
        warning = layer.overcommit(env.store.root, [s for s in sizes if s is not None])
        if warning is not None:
            progress(f"warning: {warning}")
        for size in sorted({s for s in sizes if s is not None}):
            layer.template(env.store.root, size)  # made once, before the nodes use it
        arp = remote_arp(env)
        # Before any node starts (a scale up raises the caps, a scale down has
        # stopped its nodes): the nodes together hold no more than the plan says.
        cgroups.limit_cluster(env.name, *cluster_memory(plan))

        def one(name: str) -> None:
            progress(f"node {name}")
            node = plan.node(name)
            j = env.node_journal(name)
            node_dir = env.node_dir(name)
            tree.record(j, node_dir)
            top = None  # a plan from before `disk` existed: the layer in the state dir
            if node.disk_mib is not None:
                top = layer.mount_layer(j, env.store.root, node_dir, node.disk_mib)
            ct.mount_overlay(j, rootfs, node_dir, tenant=env.rec.tenant, layer=top)
            ct.wire_node(j, plan, node, arp)
            shared.before_container(env, plan, name, net.netns_path(ct.netns_name(env.name, name)))
            ct.start_container(j, plan, node, ctx, node_dir, env.rec.console_bytes())
            if node.io is not None:  # bfq weight (crun cannot), and a check of the throttles
                cgroups.apply_node_extras(env.name, name, io=node.io, device=ctx.block_device)
            inject(f"node:{name}")

        # Each node's changes are its own (journal, folder, netns, veth,
        # container): they are made side by side (hpvc.concurrent), after the
        # node that serves the shared directory over NFS, if it starts now.
        server, others = shared.server_first(plan, names)
        each(server, one)
        each(others, one)
        return {}  # one phase

    def stop(self, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress) -> None:
        errors = undo_nodes(env, names, progress)
        if errors:
            raise HpvcError(f"remove {', '.join(names)}", errors[0], "run hpvc down")

    def refresh(self, env: ClusterEnv, old: Plan, plan: Plan, progress: Progress) -> None:
        """Nodes that stay see the new /etc/hosts (bind-mounted) and ARP entries."""
        ct.write_in_place(env.dir / "hosts", render_files.hosts(plan))
        entries = [*render_files.arp_entries(plan), *remote_arp(env)]
        before = {n.name for n in old.nodes}
        for n in plan.nodes:
            if n.name in before:
                net.set_static_neighbors(ct.netns_name(plan.cluster, n.name), entries)

    def repin(self, env: ClusterEnv, old: Plan, plan: Plan) -> None:
        before = {n.name: n for n in old.nodes}
        for n in plan.nodes:
            if n.name in before and n.cpuset != before[n.name].cpuset:
                ct.update_cpus(ct.container_id(plan.cluster, n.name), format_cpulist(n.cpuset))

    def node_state(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> str:
        return ct.container_state(ct.container_id(plan.cluster, node.name))

    def node_status(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.node_state(env, plan, node)}
        try:
            out["network"] = dict(net.read_link(ct.netns_name(plan.cluster, node.name)))
        except HpvcError as e:
            out["network"] = {"error": e.why}
        try:
            out["limits"] = cgroups.read_node_limits(plan.cluster, node.name)
        except (HpvcError, OSError) as e:
            out["limits"] = {"error": str(e)}
        return out

    def emulated(self, env: ClusterEnv) -> bool:
        return False  # containers run at the host's speed

    def summary(self, env: ClusterEnv) -> dict[str, Any]:
        plan = env.rec.the_plan()
        return {
            "backend": self.name,
            "io_warning": io_warning(env, plan),
            "shared_dir": shared.status(env, plan),
        }

    def node_pid(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> int:
        return ct.container_pid(ct.container_id(plan.cluster, node.name))

    def exec_argv(
        self, env: ClusterEnv, plan: Plan, node: PlannedNode, argv: list[str], tty: bool = False
    ) -> list[str]:
        cid = ct.container_id(plan.cluster, node.name)
        env_kv = None
        if tty:  # crun exec --env replaces the node's environment: give it all, TERM added
            image_env = list(resolve_image(plan.image).env)
            if not any(kv.startswith("PATH=") for kv in image_env):
                image_env.append(f"PATH={DEFAULT_PATH}")
            env_kv = [*image_env, *ct.tty_env()]
        argv = nodeinit.client(argv) if _state(env).node_init else argv  # under its init
        out = ct.exec_argv(cid, argv, env_kv)
        workdir = resolve_image(plan.image).workdir  # an imported image's WorkingDir
        if workdir != "/":
            out[2:2] = ["--cwd", workdir]  # after `crun exec`: crun does not take it from config
        # A terminal: crun's pty master relayed by hpvc itself (ttyrelay.py: resizes too).
        return [sys.executable, "-m", "hpvc.backends.crun.ttyrelay", *out] if tty else out

    def exec_status(
        self, env: ClusterEnv, plan: Plan, node: PlannedNode, argv: list[str], rc: int
    ) -> int:
        """crun exec exits 255 when the command is missing or not executable:
        report 127/126 as shells and ``docker exec`` do (looked up in the
        node's root, on the image's PATH)."""
        if rc != 255 or not argv:
            return rc
        try:
            pid = ct.container_pid(ct.container_id(plan.cluster, node.name))
        except HpvcError:
            return rc
        image_env = resolve_image(plan.image).env
        path = next((kv[5:] for kv in image_env if kv.startswith("PATH=")), DEFAULT_PATH)
        mapped = ct.command_status(procfs.root(pid), argv[0], path)
        return rc if mapped is None else mapped

    def mpi_launch(self, env: ClusterEnv, plan: Plan) -> MpiLaunch:
        return ranks.mpi_launch(plan, ct.runtime(), _state(env).node_init)

    def in_node_launch(self, env: ClusterEnv, plan: Plan) -> InNodeLaunch | None:
        """Root's own nodes run an agent and see hpvc-rsh (hpvc.backends.crun.nodeinit);
        a tenant's, one across hosts or one made before the agent do not."""
        return InNodeLaunch(nodeinit.RSH_IN_NODE) if _state(env).agent else None

    def task_entry(self, mpi: str) -> TaskEntry:
        """Tasks enter the node's namespaces (which ones: hpvc.slurm's policy)."""
        return TaskEntry()

    def orphans(self, keep: Keep, prefix: str) -> list[Orphan]:
        """Containers and namespace holders (``hpvc.backends.crun.leftovers``)."""
        from hpvc.backends.crun import leftovers  # gc's: it loads netlink (host.orphans)

        return leftovers.find(keep, prefix)

    def remove_orphan(self, orphan: Orphan) -> None:
        from hpvc.backends.crun import leftovers

        leftovers.remove(orphan)

    # Checkpoint (issue 28): CRIU driven directly, hpvc.backends.crun.checkpoint.
    def refuse_checkpoint(self, env: ClusterEnv, plan: Plan) -> None:
        from hpvc.backends.crun import checkpoint

        checkpoint.refuse(env, plan)

    def freeze(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        from hpvc.backends.crun import checkpoint

        checkpoint.freeze(env, plan, names)

    def thaw(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        from hpvc.backends.crun import checkpoint

        checkpoint.thaw(env, plan, names)

    def save(
        self, env: ClusterEnv, plan: Plan, name: str, dest_dir: Path, progress: Progress
    ) -> dict[str, Any]:
        from hpvc.backends.crun import checkpoint

        return checkpoint.save(env, plan, name, dest_dir, progress)

    def restore_nodes(
        self, env: ClusterEnv, plan: Plan, names: list[str], src_dir: Path, progress: Progress
    ) -> None:
        from hpvc.backends.crun import checkpoint

        checkpoint.restore_nodes(env, plan, names, src_dir, progress)

"""The VM backend that runs each node as a libvirt domain.

The same guests as ``QemuBackend`` (disk, kernel command line, readiness,
configuration over ssh), but each node is the domain XML ``hpvc render``
writes, defined and started through libvirt (``hpvc.backends.libvirt.domain``):
libvirt creates the tap and applies the pinning, NUMA and memory backing
itself, and ``hpvc status`` reads them back from libvirt. Running domains keep
their pinning when the cluster is scaled (no live repin here yet).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from hpvc.backends.base import Capabilities, ClusterEnv, no_checkpoint
from hpvc.backends.libvirt import domain as vm_libvirt
from hpvc.backends.libvirt import leftovers
from hpvc.backends.libvirt.domain_xml import qemu_opens
from hpvc.backends.qemu.backend import QemuBackend, vm_state
from hpvc.host import qemu_access
from hpvc.host.orphans import Keep, Orphan
from hpvc.paths import private_dir
from hpvc.plan import Plan, PlannedNode
from hpvc.progress import Progress
from hpvc.render.context import RenderContext
from hpvc.render.libvirt import domain_name, domain_uuid, render_domain_xml
from hpvc.spec import Spec

URI_ENV = "HPVC_LIBVIRT_URI"


def libvirt_uri() -> str:
    """Where the backend connects: $HPVC_LIBVIRT_URI, else the system daemon."""
    return os.environ.get(URI_ENV, vm_libvirt.DEFAULT_URI)


class LibvirtBackend(QemuBackend):
    name: ClassVar[str] = "libvirt"
    capabilities: ClassVar[Capabilities] = Capabilities(
        repin=False, shared_memory=False, job_user_daemons=False
    )

    def preflight(self, spec: Spec) -> None:
        super().preflight(spec)
        vm_libvirt.connect(libvirt_uri()).close()  # libvirtd answers, or exit 2 now

    def prepare(self, env: ClusterEnv, plan: Plan, progress: Progress) -> None:
        super().prepare(env, plan, progress)
        vm_state(env).libvirt_uri = libvirt_uri()

    def _uri(self, env: ClusterEnv) -> str:
        return vm_state(env).libvirt_uri or libvirt_uri()

    def uri_for(self, env: ClusterEnv) -> str:
        """The libvirtd the cluster's domains live in."""
        return self._uri(env)

    def start_node(self, env: ClusterEnv, plan: Plan, node: PlannedNode, ctx: RenderContext) -> int:
        """Define and start the node's domain; QEMU's PID (the guest not yet booted)."""
        private_dir(Path(ctx.node_run_dir(plan.cluster, node.name)))
        xml = render_domain_xml(plan, node, ctx)
        (env.node_dir(node.name) / "domain.xml").write_text(xml)
        if ctx.qemu_uid is not None:
            self._let_qemu_open(env, node, ctx, xml, ctx.qemu_uid)
        conn = vm_libvirt.connect(self._uri(env))
        try:
            return vm_libvirt.start_domain(
                env.node_journal(node.name), conn, xml, domain_name(plan, node)
            )
        finally:
            conn.close()

    def _let_qemu_open(
        self, env: ClusterEnv, node: PlannedNode, ctx: RenderContext, xml: str, uid: int
    ) -> None:
        """ACL entries for ``uid`` (the domain's DAC label) on what its QEMU opens:
        the node's own files journaled with the node, the rest (the folders above
        the node's, the guest cache, the ivshmem region, /dev/kvm) with the cluster."""
        lock = env.store.root / qemu_access.LOCK_NAME
        node_dir = Path(os.path.realpath(env.node_dir(node.name)))
        files = [(Path(p), perms) for p, perms in qemu_opens(xml)]
        for path, perms in list(files):
            if perms == "rw" and path.suffix == ".qcow2":
                files += [(b, "r") for b in qemu_access.backing_chain(path)]
        if ctx.accel == "kvm":
            files.append((Path("/dev/kvm"), "rw"))
        for path, perms in files:
            if Path(os.path.realpath(path)).is_relative_to(node_dir):
                qemu_access.traverse(env.journal(), uid, node_dir.parent, lock=lock)
                qemu_access.grant(env.node_journal(node.name), uid, path, perms, lock=lock)
            else:
                qemu_access.grant(env.journal(), uid, path, perms, lock=lock)
        if node.hugepages is not None:  # libvirt makes the domain's folder in the mount
            pages = Path(ctx.hugetlbfs_path(node.hugepages.size_kib))
            qemu_access.traverse(env.journal(), uid, pages, lock=lock)

    def live_pid(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> int | None:
        """The domain's QEMU from libvirt's pid file or /proc (libvirtd need not answer)."""
        return vm_libvirt.find_pid(domain_name(plan, node), domain_uuid(plan, node))

    def repin_node(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> None:
        pass  # running domains keep the pinning they were defined with (see above)

    def orphans(self, keep: Keep, prefix: str) -> list[Orphan]:
        """Domains hpvc defined, at $HPVC_LIBVIRT_URI or the system daemon
        (``hpvc.backends.libvirt.leftovers``); their QEMUs are the QEMU backend's."""
        return leftovers.find(keep, prefix, libvirt_uri())

    def remove_orphan(self, orphan: Orphan) -> None:
        leftovers.remove(orphan, libvirt_uri())

    def read_back(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> dict[str, Any]:
        """libvirt's view, in the shape `hpvc status` shows for both VM backends."""
        conn = vm_libvirt.connect(self._uri(env))
        try:
            rb = vm_libvirt.read_back(conn, domain_name(plan, node))
        finally:
            conn.close()
        return {
            "vcpus": [
                {"vcpu": v["vcpu"], "cpus": v["cpus"], "pinned": v["pinned"]} for v in rb["vcpus"]
            ],
            "emulator": [{"cpus": rb["emulator"]["cpus"]}],
            "memdevs": [],
            "libvirt": dict(rb),
        }

    # Checkpoint (issue 28): not through libvirt yet (its domains would be saved
    # with virDomainSave, not QMP on hpvc's own socket): refused in one line.
    def refuse_checkpoint(self, env: ClusterEnv, plan: Plan) -> None:
        raise no_checkpoint(self.name)

    def freeze(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        raise no_checkpoint(self.name)

    def thaw(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        raise no_checkpoint(self.name)

    def save(
        self, env: ClusterEnv, plan: Plan, name: str, dest_dir: Path, progress: Progress
    ) -> dict[str, Any]:
        raise no_checkpoint(self.name)

    def restore_nodes(
        self, env: ClusterEnv, plan: Plan, names: list[str], src_dir: Path, progress: Progress
    ) -> None:
        raise no_checkpoint(self.name)

"""What the artifacts need beyond the Plan: paths, accelerator, binaries, limits.

A ``RenderContext`` is plain immutable data. Every path has a default derived
from ``base_dir`` (hpvc's state directory), so rendering needs no host; the
backends fill in what they probed (accelerator, block device, kernel).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hpvc.paths import CLUSTERS, DEFAULT_STATE_DIR, IMAGES, NODES, RUN, SHARED

if TYPE_CHECKING:
    from hpvc.plan.services import SharedPlan

Accel = Literal["kvm", "tcg"]

DEFAULT_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "TERM=xterm",
)
KERNEL_ARGS = "console=ttyS0 root=/dev/vda rw no_timer_check"
IFNAMSIZ = 15  # usable bytes of a Linux interface name
# The virtio serial of the NFS server VM's backing disk: how its guest finds it.
SHARED_DISK_SERIAL = "hpvc-shared"
# The fw_cfg entry that carries a VM's agent key; the guest's hpvc-init reads it
# (native/guest/init.c).
AGENT_KEY_FWCFG = "opt/hpvc/agent-key"


def tap_name(cluster: str, node: str) -> str:
    """Deterministic host tap/veth name of a node, short enough for IFNAMSIZ.

    Cluster names may hold '-', so joining names could collide; a digest of
    ``cluster/node`` cannot in practice and always fits (``hv`` + 12 hex).
    """
    digest = hashlib.sha256(f"{cluster}/{node}".encode()).hexdigest()
    return f"hv{digest[:12]}"


@dataclass(frozen=True)
class RenderContext:
    """Host-side facts the renderers need; defaults live under ``base_dir``.

    Per-node paths are methods so one context serves every node of a cluster.
    ``hugetlbfs`` maps a page size in KiB to the mount of that size;
    ``disk_images`` and ``netns`` override the derived per-node paths.
    """

    base_dir: str = DEFAULT_STATE_DIR
    run_dir: str | None = None  # sockets and pid files; default <base_dir>/run
    accel: Accel = "tcg"
    qemu_binary: str = "/usr/bin/qemu-system-x86_64"
    kernel: str | None = None
    initrd: str | None = None
    kernel_args: str = ""  # appended to KERNEL_ARGS
    cmdline: str | None = None  # the whole kernel command line, instead of the two above
    hugetlbfs: tuple[tuple[int, str], ...] = ()  # (page KiB, mount); default <base>/hugepages/
    disk_images: tuple[tuple[str, str], ...] = ()  # (node, disk image) overrides
    disk_format: str = "raw"  # or "qcow2" (an overlay on the image's base disk)
    rootfs: str | None = None  # container rootfs; default <base>/images/<image>/rootfs
    rootfs_readonly: bool = False
    netns_dir: str | None = "/run/netns"  # None: containers get a fresh, unwired netns
    netns: tuple[tuple[str, str], ...] = ()  # (node, netns path) overrides
    block_device: tuple[int, int] | None = None  # (major, minor) the I/O limits apply to
    shm_size_mib: int = 1024
    pids_limit: int = 32768
    command: tuple[str, ...] = ("/bin/sh",)
    env: tuple[str, ...] = DEFAULT_ENV
    cgroup_parent: str = "/hpvc"
    vhost: bool | None = None  # None: vhost-net with kvm, userspace virtio-net with tcg
    # Containers, as the container backend runs them:
    node_rootfs: bool = False  # root is <node_dir>/rootfs (the node's overlay), not `rootfs`
    # Locality: co-resident nodes join the IPC and PID namespaces of this holder
    # process and share the host directory `shared_shm` as /dev/shm, so MPI
    # ranks in different nodes use shared memory and CMA between them.
    shared_ns_pid: int | None = None
    shared_shm: str | None = None
    binds: tuple[tuple[str, str, bool], ...] = ()  # (host path, container path, read-only)
    # Binds whose host path is relative to each node's own folder (its NFS mount).
    node_binds: tuple[tuple[str, str, bool], ...] = ()
    # A tenant's nodes (a Slurm share): the folders bound into them are nosuid,nodev.
    tenant: bool = False
    # VMs: co-resident nodes map this host file (size in MiB, a power of two) as
    # the BAR 2 of an ivshmem-plain device (hpvc.host.ivshmem allocates it).
    ivshmem: tuple[str, int] | None = None
    # VMs: the uid (and gid) QEMU drops to once it has opened its files, under a
    # seccomp sandbox (hpvc.host.qemu_user gives each cluster its own); None: root.
    qemu_uid: int | None = None
    # VMs: the root-only file of the cluster's agent key (32 random bytes), which
    # QEMU hands the guest as fw_cfg entry ``opt/hpvc/agent-key``: never on a
    # command line (every user reads QEMU's and the guest's); None: no key.
    agent_key: str | None = None
    # VMs, ``[shared] server = "nfs"``: the raw ext4 image the serving node gets as
    # its second disk (``shared_disk``); None: the default path under ``base_dir``.
    shared_image: str | None = None
    # VMs: host folders shared into the guest (a Slurm site's binds), each a
    # vhost-user-fs device on the socket of a virtiofsd that runs with the job's
    # user's rights (hpvc.host.virtiofsd): (tag, socket path). The guest's memory
    # is then shared with those daemons (share=on), as vhost-user needs.
    virtiofs: tuple[tuple[str, str], ...] = ()

    def cluster_dir(self, cluster: str) -> str:
        """State directory of one cluster (rendered artifacts, the hosts file)."""
        return os.path.join(self.base_dir, CLUSTERS, cluster)

    def node_dir(self, cluster: str, node: str) -> str:
        """State directory of one node; for a container it is the OCI bundle."""
        return os.path.join(self.cluster_dir(cluster), NODES, node)

    def node_run_dir(self, cluster: str, node: str) -> str:
        """Where a node's sockets and pid file live."""
        run = self.run_dir or os.path.join(self.base_dir, RUN)
        return os.path.join(run, cluster, node)

    def disk_image(self, cluster: str, node: str) -> str:
        """Raw root disk of a VM node."""
        return dict(self.disk_images).get(node) or os.path.join(
            self.node_dir(cluster, node), "disk.raw"
        )

    def shared_disk(self, cluster: str, node: str, shared: SharedPlan | None) -> str | None:
        """The backing disk of a VM that serves the shared directory over NFS (a
        raw ext4 image: ``<base>/shared/<cluster>.img`` with ``keep``, else
        ``<cluster dir>/export.img``, as for containers); None for other nodes."""
        if shared is None or shared.server != "nfs" or shared.node != node:
            return None
        if self.shared_image is not None:
            return self.shared_image
        if shared.keep:
            return os.path.join(self.base_dir, SHARED, f"{cluster}.img")
        return os.path.join(self.cluster_dir(cluster), "export.img")

    def console_log(self, cluster: str, node: str) -> str:
        return os.path.join(self.node_dir(cluster, node), "console.log")

    def console_fifo(self, cluster: str, node: str) -> str:
        """The FIFO QEMU logs a VM's serial console to (its chardev ``logfile=``);
        hpvc's console reader copies it into ``console_log``, kept to a cap."""
        return os.path.join(self.node_run_dir(cluster, node), "console.fifo")

    def qmp_socket(self, cluster: str, node: str) -> str:
        return os.path.join(self.node_run_dir(cluster, node), "qmp.sock")

    def console_socket(self, cluster: str, node: str) -> str:
        return os.path.join(self.node_run_dir(cluster, node), "console.sock")

    def pidfile(self, cluster: str, node: str) -> str:
        return os.path.join(self.node_run_dir(cluster, node), "qemu.pid")

    def hosts_file(self, cluster: str) -> str:
        """The cluster's /etc/hosts, bind-mounted into containers."""
        return os.path.join(self.cluster_dir(cluster), "hosts")

    def hugetlbfs_path(self, size_kib: int) -> str:
        """hugetlbfs mount for pages of ``size_kib`` (the host layer mounts it)."""
        return dict(self.hugetlbfs).get(size_kib) or os.path.join(
            self.base_dir, "hugepages", f"{size_kib}kB"
        )

    def container_rootfs(self, image: str) -> str:
        return self.rootfs or os.path.join(self.base_dir, IMAGES, image, "rootfs")

    def node_container_rootfs(self, cluster: str, node: str, image: str) -> str:
        if self.node_rootfs:
            return os.path.join(self.node_dir(cluster, node), "rootfs")
        return self.container_rootfs(image)

    def netns_path(self, cluster: str, node: str) -> str | None:
        """Network namespace a container joins, or None for a fresh one."""
        given = dict(self.netns).get(node)
        if given or self.netns_dir is None:
            return given
        return os.path.join(self.netns_dir, f"hpvc-{cluster}-{node}")

    def cgroup_path(self, cluster: str, node: str) -> str:
        """cgroupfs path (relative to each controller's root) of a container."""
        return f"{self.cgroup_parent.rstrip('/')}/{cluster}/{node}"

    def use_vhost(self) -> bool:
        return self.accel == "kvm" if self.vhost is None else self.vhost

    def full_kernel_args(self) -> str:
        if self.cmdline is not None:
            return self.cmdline
        return f"{KERNEL_ARGS} {self.kernel_args}".strip()

"""What both VM backends share: guest disks, the cluster's ssh key, readiness, configuration.

Per node: a writable disk over the image's base disk and a kernel command
line carrying the node's address, the cluster's public key and, where they
fit (about 30 nodes), every node's address, MAC and name, which the guest
init makes /etc/hosts and permanent ARP entries of before it says it is
ready; then, for all nodes at once (they boot in parallel), the wait for the
guest init's ``hpvc-ready`` line, and /etc/hosts plus static ARP pushed over
ssh with the key hpvc makes for the cluster only to guests whose command
line could not carry them, and to running guests when a scale changes the
nodes. Co-resident guests share an ivshmem region.

An image without sshd (an imported one, docs/vms.md): its guests are reached
through the agent hpvc-init starts in each (``agent_argv``: the guest build's
static ``hpvc-rsh``, run on the host as root with the cluster's agent key),
for ``hpvc exec`` and the configuration pushes alike (``guest_argv``).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hpvc.backends.agentkey import AGENT_KEY
from hpvc.backends.vm.console import wait_ready
from hpvc.errors import HpvcError, MissingDependency
from hpvc.host import ivshmem, tree
from hpvc.host.journal import Args, Journal, undoer
from hpvc.image.guest import (
    CmdlineError,
    DiskMode,
    GuestArtifacts,
    kernel_cmdline,
    node_disk,
    peers_text,
)
from hpvc.image.model import Image
from hpvc.image.rootfs import in_root
from hpvc.paths import RUN, private_dir
from hpvc.plan import Plan, PlannedNode
from hpvc.render import files as render_files
from hpvc.render.context import RenderContext
from hpvc.store import Store

DISK_MODE: DiskMode = "qcow2"  # see docs/vms.md: made in milliseconds, boots like a raw copy
READY_TIMEOUT_S = 300.0
SSH_OPTS = (
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=10",
    # ssh's own retry (one a second) of a connect that fails at once: in CI a
    # just-booted TCG guest once left the host's ARP unanswered for its 3 s
    # ("No route to host") right after hpvc-ready (clean-clone run, stop 37).
    "-o", "ConnectionAttempts=3",
)  # fmt: skip


SSHD = "/usr/sbin/sshd"  # what hpvc-init starts where the image has it (native/guest/init.c)


def has_sshd(image: Image) -> bool:
    """Whether hpvc-init starts sshd in ``image``'s guests; without it the agent
    is the only way in (``agent_argv``)."""
    found = in_root(image.rootfs, SSHD)
    return found is not None and found.is_file()


def ssh_key(cluster_dir: Path) -> Path:
    """The cluster's ssh key (made once; its public half goes to every guest)."""
    key = cluster_dir / "id_ed25519"
    if not key.exists():
        try:
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hpvc", "-f", str(key)],
                check=True,
                capture_output=True,
            )
        except FileNotFoundError:
            raise MissingDependency(
                "VM nodes", "ssh-keygen not found", "apt-get install openssh-client"
            ) from None
    return key


def ssh_argv(
    cluster_dir: Path, ip: str, argv: list[str], env: list[str] | None = None, tty: bool = False
) -> list[str]:
    """ssh into a guest as root and run ``argv`` (with ``env`` KEY=VALUE pairs);
    ``tty``: on a pty in the guest (ssh -t, which also sends TERM and resizes)."""
    remote = shlex.join([*(["env", *env] if env else []), *argv])
    key = cluster_dir / "id_ed25519"
    return ["ssh", *(["-t"] if tty else []), "-i", str(key), *SSH_OPTS, f"root@{ip}", remote]


def agent_argv(
    rsh: str,
    cluster_dir: Path,
    ip: str,
    argv: list[str],
    env: Sequence[str] = (),
    cwd: str = "",
    tty: bool = False,
) -> list[str]:
    """Run ``argv`` as it is (no shell) in a guest through its agent: ``rsh`` is
    the guest build's static hpvc-rsh, run here as root (the agent trusts a
    reserved port on the cluster's subnet, the bridge's address) with the
    cluster's agent key; ``env`` (KEY=VALUE) and ``cwd`` are the command's;
    ``tty``: on a pty in the guest (hpvc-rsh -t; native/agent/pty.c)."""
    out = [rsh, "-a", *(["-t"] if tty else []), "-k", str(cluster_dir / AGENT_KEY)]
    for kv in env:
        out += ["-e", kv]
    out += ["-C", cwd] if cwd else []
    return [*out, "--", ip, *argv]


def guest_argv(cluster_dir: Path, ip: str, argv: list[str], rsh: str = "") -> list[str]:
    """``argv`` in a guest: over ssh, or through its agent where ``rsh`` is
    given (the cluster's image has no sshd)."""
    return agent_argv(rsh, cluster_dir, ip, argv) if rsh else ssh_argv(cluster_dir, ip, argv)


def vm_context(
    store: Store, guest: GuestArtifacts, hugetlbfs: dict[str, str], accel: str
) -> RenderContext:
    return RenderContext(
        base_dir=str(store.root),
        accel="kvm" if accel == "kvm" else "tcg",
        kernel=str(guest.kernel),
        initrd=str(guest.initrd),
        hugetlbfs=tuple((int(k), v) for k, v in hugetlbfs.items()),
        disk_format=DISK_MODE,
        disk_images=(),
    )


def ivshmem_for(
    store: Store,
    plan: Plan,
    journal: Journal,
    locality: str,
    *,
    host: str | None = None,
    hugetlbfs: dict[str, str] | None = None,
    size_mib: int = ivshmem.DEFAULT_MIB,
) -> tuple[str, int] | None:
    """The cluster's shared ivshmem region on ``host`` as ``(path, MiB)``, or None.

    A region exists when ``locality`` is "shm" and ``host`` (default: the plan's
    first) holds at least two of the cluster's VM nodes. It is allocated once,
    journaled in ``journal``; a second call (scale) finds the cluster's region
    again. ``hugetlbfs`` (page KiB -> mount) puts it on the smallest huge pages
    when the pool has room for it beyond the nodes' memory (the plan does not
    count it): leave it out to use /dev/shm.
    """
    where = host if host is not None else plan.hosts[0].name
    here = [n for n in plan.nodes if n.kind == "vm" and n.host == where]
    if locality != "shm" or len(here) < 2:
        return None
    found = ivshmem.find(store.root, plan.cluster)
    if found is not None:
        return str(found), found.stat().st_size // ivshmem.MiB if found.exists() else size_mib
    pages = Path(hugetlbfs[min(hugetlbfs, key=int)]) if hugetlbfs else None
    path = ivshmem.allocate(journal, store.root, plan.cluster, size_mib, pages)
    return str(path), size_mib


def node_context(
    store: Store,
    plan: Plan,
    node: PlannedNode,
    guest: GuestArtifacts,
    ctx: RenderContext,
    remotes: Sequence[tuple[str, str, str]] = (),
    binds: tuple[tuple[str, str], ...] = (),
) -> RenderContext:
    """``ctx`` for one node: its own disk over the image's (journaled with the
    node's tree) and a kernel command line with its address and the cluster key.
    ``remotes`` (name, ip, mac): the cluster's nodes on its other hosts (a Slurm
    job's shares), in the guest's hosts and ARP table beside the plan's own;
    ``binds`` (virtiofs tag, path): what the guest mounts (``hpvc.backends.vm.binds``)."""
    j = store.node_journal(plan.cluster, node.name)
    node_dir = store.node_dir(plan.cluster, node.name)
    tree.record(j, node_dir)
    # Its sockets and pid file (made by QEMU or libvirt): the folder goes with
    # the node, also when a scale removes it (``down`` removes run/<cluster>).
    j.record("node-run-dir", path=ctx.node_run_dir(plan.cluster, node.name))
    private_dir(node_dir)
    disk = node_disk(guest.disk, node_dir / f"disk.{DISK_MODE}", DISK_MODE)
    pub = (store.cluster_dir(plan.cluster) / "id_ed25519.pub").read_text().strip()
    args = (node.name, f"{node.ip}/{plan.network.prefixlen}", plan.network.mtu, pub)
    here = [(n.ip, n.mac, n.name) for n in plan.nodes]
    peers = peers_text(plan.cluster, here + [(ip, mac, name) for name, ip, mac in remotes])
    try:  # the cluster's hosts and ARP at boot, where they fit on the command line
        cmdline = kernel_cmdline(*args, peers=peers, binds=binds)
    except CmdlineError:  # a big cluster: configure() sends them over ssh
        cmdline = kernel_cmdline(*args, binds=binds)
    return replace(ctx, cmdline=cmdline, disk_images=((node.name, str(disk)),))


def configured_at_boot(ctx: RenderContext) -> bool:
    """Whether the node's command line carried its cluster's hosts and ARP."""
    return " hpvc.peers=" in f" {ctx.cmdline}"


@undoer("node-run-dir")
def _undo_node_run_dir(args: Args) -> None:
    path = Path(args["path"])
    if path.parent.parent.name != RUN:  # only ever run/<cluster>/<node>
        raise HpvcError(f"refusing to remove {path}", "not a node's folder in a run directory")
    shutil.rmtree(path, ignore_errors=True)


def wait_all(
    store: Store, plan: Plan, pids: dict[str, int], ctx: RenderContext, timeout: float
) -> dict[str, float]:
    """Wait for every guest's ready line; return seconds waited per node."""
    waited: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    for name, pid in pids.items():
        log = Path(ctx.console_log(plan.cluster, name))
        left = max(1.0, deadline - time.monotonic())
        waited[name] = wait_ready(log, f"hpvc-ready {name}", left, pid)
    return waited


def configure(store: Store, plan: Plan, names: list[str], rsh: str = "") -> None:
    """/etc/hosts and permanent ARP entries of every node, in the given guests.

    One ssh per guest, all at once: under TCG a handshake costs about a second
    (through the agents instead where ``rsh`` is given: ``guest_argv``; the
    image's own ``sh``, ``cat`` and ``ip`` run it).
    """
    cdir = store.cluster_dir(plan.cluster)
    hosts = render_files.hosts(plan)
    neigh = " && ".join(
        f"ip neigh replace {ip} lladdr {mac} dev eth0 nud permanent"
        for ip, mac in render_files.arp_entries(plan)
    )
    script = f"cat > /etc/hosts && {neigh}"
    left: list[str] = list(names)
    failed: list[str] = []
    for attempt in range(3):  # a guest busy booting its neighbours may miss an ARP
        procs = {
            name: subprocess.Popen(
                guest_argv(cdir, plan.node(name).ip, ["sh", "-c", script], rsh),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in left
        }
        left, failed = [], []
        for name, proc in procs.items():
            _, err = proc.communicate(hosts)
            if proc.returncode == 255 and attempt < 2:  # ssh itself failed: try again
                left.append(name)
            elif proc.returncode != 0:
                failed.append(f"{name}: {err.strip() or 'ssh failed'}")
        if not left:
            break
        time.sleep(1.0)
    if failed:
        raise HpvcError("configure guests", failed[0], "see the node's console.log")

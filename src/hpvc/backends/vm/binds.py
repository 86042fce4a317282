"""A Slurm site's binds in VM guests: one virtiofsd per bind per guest, as the job's user.

Container nodes get the site's ``binds`` (``ClusterRecord.binds``) as bind
mounts. A guest gets each as a virtiofs file system: the host runs a
virtiofsd for it with the job's user's rights (``hpvc.host.virtiofsd``: why
that keeps the user's own view), QEMU gives the guest a ``vhost-user-fs-pci``
device on the daemon's socket (``hpvc.render.qemu``; the guest's memory is
then shared, as vhost-user needs), and the guest's init mounts tag
``hpvcfs<i>`` at the bind's own path before the guest says it is ready
(``hpvc.binds=`` on its command line, ``native/guest/init.c``).

Each daemon is in its node's journal after the node's folders and before its
QEMU, so taking the node down stops QEMU, then the daemons (which end on
their own once QEMU has gone), then removes the sockets' folder.
"""

from __future__ import annotations

from dataclasses import replace

from hpvc.backends.base import ClusterEnv
from hpvc.errors import InputError
from hpvc.host import virtiofsd
from hpvc.plan import Plan, PlannedNode
from hpvc.render.context import RenderContext

TAG = "hpvcfs"


def tags(env: ClusterEnv) -> tuple[tuple[str, str], ...]:
    """(virtiofs tag, guest path) of each of the cluster's binds: what the
    guest's command line carries; the path in the guest is the host's."""
    return tuple((f"{TAG}{i}", path) for i, path in enumerate(env.rec.binds))


def owner(env: ClusterEnv) -> tuple[int, int]:
    """The job's uid and gid, which serve the binds; InputError without them."""
    # ClusterRecord.user: {"uid", "gid", "name"} of a Slurm share's job (hpvc.slurm.node).
    user = getattr(env.rec, "user", None) or {}
    uid, gid = int(user.get("uid", -1)), int(user.get("gid", -1))
    if uid <= 0 or gid < 0:
        raise InputError(
            f"binds {', '.join(env.rec.binds)} in VM guests",
            "the job's user is not known (or is root), and only its rights may serve them",
            "update the SPANK plugin (it passes --uid/--gid to hpvc node up)",
        )
    return uid, gid


def check(env: ClusterEnv) -> None:
    """Refuse, before any change, binds that cannot be served here."""
    if not env.rec.binds:
        return
    if env.rec.backend not in ("", "qemu"):
        raise InputError(
            f"binds {', '.join(env.rec.binds)} in VM guests",
            f"are served to the qemu backend's guests only, not {env.rec.backend}'s",
            "leave out the spec's backend (qemu is the default for VMs)",
        )
    uid, _ = owner(env)
    for path in env.rec.binds:
        virtiofsd.check(path, uid)


def serve(env: ClusterEnv, plan: Plan, node: PlannedNode, ctx: RenderContext) -> RenderContext:
    """Start one daemon per bind for ``node`` (in its journal); ``ctx`` with the
    sockets its QEMU connects to. ``ctx`` unchanged when the cluster has none."""
    if not env.rec.binds:
        return ctx
    uid, gid = owner(env)
    j = env.node_journal(node.name)
    run = env.store.layout.node_run_dir(plan.cluster, node.name)
    sockets = []
    for tag, path in tags(env):
        sock = run / f"{tag}.sock"
        virtiofsd.start(
            j,
            sock=sock,
            source=path,
            uid=uid,
            gid=gid,
            mark=f"{plan.cluster}/{node.name}/{tag}",
            log=env.node_dir(node.name) / f"virtiofsd-{tag}.log",
        )
        sockets.append((tag, str(sock)))
    return replace(ctx, virtiofs=tuple(sockets))

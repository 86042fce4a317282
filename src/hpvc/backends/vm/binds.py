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
from hpvc.progress import Progress
from hpvc.render.context import RenderContext

TAG = "hpvcfs"


def tags(env: ClusterEnv) -> tuple[tuple[str, str], ...]:
    """(virtiofs tag, guest path) of each of the cluster's binds: what the
    guest's command line carries; the path in the guest is the host's."""
    return tuple((f"{TAG}{i}", path) for i, path in enumerate(env.rec.binds))


def owner(env: ClusterEnv) -> tuple[int, int] | None:
    """The job's uid and gid, whose rights serve the binds; None when not known."""
    user = env.rec.user or {}  # {"uid", "gid", "name"} of a Slurm share's job
    uid, gid = int(user.get("uid", -1)), int(user.get("gid", -1))
    return (uid, gid) if uid >= 0 and gid >= 0 else None


def shares(env: ClusterEnv, progress: Progress) -> tuple[tuple[str, str], ...]:
    """The binds the guests get (``tags``), checked before any node starts: a
    backend other than qemu or a bind that is no folder is refused (exit 2).
    Without the job's user (a SPANK plugin older than hpvc, which passes no
    --uid), and for root's jobs, the guests get none, as before binds were
    served, and the step's progress says why."""
    if not env.rec.binds:
        return ()
    what = f"binds {', '.join(env.rec.binds)} in VM guests"
    if env.rec.backend not in ("", "qemu"):
        raise InputError(
            what,
            f"are served to the qemu backend's guests only, not {env.rec.backend}'s",
            "leave out the spec's backend (qemu is the default for VMs)",
        )
    user = owner(env)
    if user is None:
        progress(f"{what}: not shared, the job's user is not known (update the SPANK plugin)")
        return ()
    if user[0] == 0:  # served only with an ordinary user's rights (hpvc.host.virtiofsd)
        progress(f"{what}: not shared into a job of root's")
        return ()
    for path in env.rec.binds:
        virtiofsd.check(path, user[0])
    return tags(env)


def serve(
    env: ClusterEnv,
    plan: Plan,
    node: PlannedNode,
    ctx: RenderContext,
    binds: tuple[tuple[str, str], ...],
) -> RenderContext:
    """Start one daemon per bind (``shares``) for ``node`` (in its journal);
    ``ctx`` with the sockets its QEMU connects to (unchanged without binds)."""
    user = owner(env)
    if not binds or user is None:
        return ctx
    uid, gid = user
    j = env.node_journal(node.name)
    run = env.store.layout.node_run_dir(plan.cluster, node.name)
    sockets = []
    for tag, path in binds:
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

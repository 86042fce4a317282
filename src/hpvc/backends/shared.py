"""The shared directory of container nodes (spec ``[shared]``, docs/storage.md).

``server = "host"``: one host folder bound into every node at the spec's path.
``server = "nfs"``: the same data served over NFS by one node of the cluster,
as the seed's storage node does: NFS-Ganesha (``hpvc.host.nfs_server``) runs
in that node's network namespace on its cluster address, exporting a backing
on the host (a folder, or an ext4 loop file system of ``size``) to the
cluster's subnet only; every node, the server's own included, mounts it with
hpvc-nfsfuse (``hpvc.host.nfs_mount``) from inside its own network namespace,
on a folder in the node's state directory that its container binds at the
spec's path. So a node's file traffic is real NFS over the cluster network,
across hosts too.

The data lives in the cluster's folder (gone at ``down``), or with
``keep = true`` in ``<state>/shared/<cluster>`` where the next ``up`` of the
same name finds it again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpvc.backends.base import ClusterEnv
from hpvc.errors import InputError
from hpvc.host import nfs_backing, nfs_mount, nfs_server
from hpvc.image import resolve_image
from hpvc.image.rootfs import in_root
from hpvc.plan import Plan
from hpvc.plan.services import DEFAULT_SHARED, SharedPlan
from hpvc.spark.model import IMAGE_JAVA_HOME, IMAGE_SPARK_HOME

if TYPE_CHECKING:  # the spec's schema (pydantic): not on status's path (issue 33 item 4)
    from hpvc.spec import Spec

MOUNT_TIMEOUT_S = 30.0  # a node waits this long for the server (another host may be slower)
SERVER_TIMEOUT_S = 20.0
# How long a node waits for a server on another host (a Slurm job's shares come
# up side by side; the server's host may be slower, e.g. with an image to unpack).
REMOTE_WAIT_S = 90.0


def preflight(spec: Spec) -> None:
    """Refuse, before any host change, a spec this host cannot serve: the NFS
    server's and client's programs, and Spark without Spark in the image."""
    if spec.shared.server == "nfs":
        nfs_server.tools()
        nfs_mount.client_binary()
    if spec.spark is not None:
        # Judged by the files the daemons run, built (hpvc image build spark) or imported.
        missing = spark_missing(resolve_image(spec.image).rootfs)
        if missing:
            raise InputError(
                f"image {spec.image!r}",
                f"has no {' or '.join(missing)}, which the spec's [spark] runs",
                'hpvc image build spark, and image = "spark" in the spec',
            )


def across_hosts(spec: Spec, origin: str) -> None:
    """NFS and Spark split over a Slurm job's hosts: container nodes serve and
    mount them from the shares' own hosts (``before_container``), VM guests
    from inside the guests, over the job's network (``vm.guest_shared``)."""
    if spec.kind not in ("container", "vm"):
        what = "[spark]" if spec.spark is not None else 'shared.server = "nfs"'
        raise InputError(
            f"{origin}: {what} with kind = {spec.kind!r}",
            "Slurm jobs run NFS and Spark in container nodes only, so far",
            'kind = "container", or hpvc up runs them in VMs on one host (docs/slurm.md)',
        )


def spark_missing(rootfs: Path) -> list[str]:
    """What the Spark daemons run that ``rootfs`` lacks (an imported image may
    bring its own Java and Spark at the places hpvc's recipe puts them)."""
    needs = (f"{IMAGE_JAVA_HOME}/bin/java", f"{IMAGE_SPARK_HOME}/bin/spark-class")
    return [p for p in needs if in_root(rootfs, p) is None]


def shared_of(plan: Plan) -> SharedPlan:
    return plan.shared or DEFAULT_SHARED


def kept_dir(env: ClusterEnv) -> Path:
    """Where a ``keep = true`` cluster's data lives between its ups."""
    return env.store.layout.kept_shared(env.name)


def host_folder(env: ClusterEnv, sh: SharedPlan) -> Path:
    """The host folder of ``server = "host"``."""
    return kept_dir(env) if sh.keep else env.dir / "shared"


def export_dir(env: ClusterEnv, sh: SharedPlan) -> Path:
    """What the NFS server exports: the backing folder, or the loop file
    system's mount point (its image file beside it)."""
    return kept_dir(env) if sh.keep else env.dir / "export"


def binds(env: ClusterEnv, plan: Plan) -> tuple[tuple[str, str, bool], ...]:
    """The cluster-wide bind of a host folder (none with NFS: see ``node_binds``)."""
    sh = shared_of(plan)
    if sh.server != "host":
        return ()
    return ((str(host_folder(env, sh)), sh.path, False),)


def node_binds(plan: Plan) -> tuple[tuple[str, str, bool], ...]:
    """With NFS, each node binds its own mount (``<node dir>/shared``)."""
    sh = shared_of(plan)
    return (("shared", sh.path, False),) if sh.server == "nfs" else ()


def prepare(env: ClusterEnv, plan: Plan) -> None:
    """The folder or backing file system the shared directory lives in."""
    sh = shared_of(plan)
    if sh.server == "host":
        host_folder(env, sh).mkdir(parents=True, exist_ok=True)
        return
    if not serves_here(plan):
        return  # a Slurm share on another host than the server's: nothing to back
    if sh.keep:
        kept_dir(env).parent.mkdir(parents=True, exist_ok=True)
    nfs_backing.backing(env.journal(), path=export_dir(env, sh), size_mib=sh.size_mib, keep=sh.keep)


def serves_here(plan: Plan) -> bool:
    """Does this plan hold the NFS server's node? A Slurm share on another host
    than the server's holds only clients (docs/slurm.md, "NFS and Spark")."""
    sh = shared_of(plan)
    return sh.server == "nfs" and any(n.name == sh.node for n in plan.nodes)


def server_first(plan: Plan, names: list[str]) -> tuple[list[str], list[str]]:
    """(the server node if it starts now, the other nodes): the server's node
    starts first so the others can mount from it."""
    sh = shared_of(plan)
    if sh.server == "nfs" and sh.node in names:
        return [sh.node], [n for n in names if n != sh.node]
    return [], list(names)


def before_container(env: ClusterEnv, plan: Plan, name: str, netns_path: str) -> None:
    """After the node's network namespace is wired, before its container starts:
    the server (on its node), then the node's own mount."""
    sh = shared_of(plan)
    if sh.server != "nfs":
        return
    assert sh.node is not None and sh.address is not None
    j = env.node_journal(name)
    node_dir = env.node_dir(name)
    if name == sh.node:
        # imported here: the coordinator loads the site config's schema (pydantic),
        # which status and the nodes without the NFS server never need (issue 33)
        from hpvc.coordinator.coordinator import server_io

        io = server_io(j, env.name, export_dir(env, sh))  # docs/io.md
        nfs_server.start(
            j,
            netns=netns_path,
            cgroup_procs=io.procs,
            stable_writes=io.stable_writes,
            folder=node_dir / "nfs-server",
            export_dir=export_dir(env, sh),
            subnet=plan.network.subnet,
            address=sh.address,
            pseudo=sh.export,
            root_squash=env.rec.tenant,
            timeout_s=SERVER_TIMEOUT_S,
        )
    nfs_mount.mount(
        j,
        netns=netns_path,
        server=sh.address,
        export=sh.export,
        mountpoint=node_dir / "shared",
        pidfile=node_dir / "nfs-client.pid",
        timeout_s=MOUNT_TIMEOUT_S,
        # A server on another host (a Slurm job's) may start after this node:
        # try again until it answers, for as long as a node may take to come up.
        wait_s=0.0 if serves_here(plan) else REMOTE_WAIT_S,
        server_name=f"{sh.node}, the NFS server's node",
    )


def status(env: ClusterEnv, plan: Plan) -> dict[str, Any] | None:
    """What ``hpvc status`` shows of the shared directory."""
    sh = shared_of(plan)
    out: dict[str, Any] = {"server": sh.server, "path": sh.path, "keep": sh.keep}
    if sh.server == "host":
        folder = host_folder(env, sh)
        if not folder.is_dir():
            return None
        out["host"] = str(folder)
        out.update(_usage(folder))
        return out
    export = export_dir(env, sh)
    out.update(
        node=sh.node,
        export=f"{sh.address}:{sh.export}",
        backing=str(export),
        size_mib=sh.size_mib,
    )
    if export.is_dir():
        out.update(_usage(export))
    out["mounts"] = {
        n.name: nfs_mount.health(env.node_dir(n.name) / "shared") or "ok"
        for n in plan.nodes
        if env.node_dir(n.name).is_dir()
    }
    return out


def _usage(path: Path) -> dict[str, int]:
    st = os.statvfs(path)
    return {
        "size_bytes": st.f_blocks * st.f_frsize,
        "used_bytes": (st.f_blocks - st.f_bfree) * st.f_frsize,
    }

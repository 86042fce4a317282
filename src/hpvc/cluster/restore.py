"""``hpvc restore``: a checkpoint's cluster running again, from where it was (docs/checkpoint.md).

Before any host change, in one line each (exit 2): the checkpoint is read
and every file checked (size, sha256: ``hpvc.cluster.checkpoint_format``);
its hpvc version and architecture must be this one's; its backend must
checkpoint; its image, by name, must still point at the digest each node was
made from and be in this host's store; the cluster's name (``--name`` gives
another) and its subnet must be free here; the cluster must fit (CPUs, NUMA
nodes, hugepages, memory: the planner's own refusal).

Then the cluster is planned anew for this host (CPUs, NUMA nodes and
hugepage pools where they are free now), keeping what the guests carry
inside them: the same node names, addresses and MACs (another name would
give other MACs: they are taken from the checkpoint), and the same guest
topology (vCPUs, memory, guest NUMA cells: refused if this host cannot give
it). ``up``'s own steps book it and make the cluster-wide host changes (the
bridge, pools, hosts file), the backend starts every node from its saved
state, frozen (``Backend.restore_nodes``), and all are thawed at once.

A failure from there on (QEMU exits while loading, CRIU fails) undoes
everything restore made, through the same journals ``down`` replays, and is
reported as a run-time error (exit 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpvc.backends import registry
from hpvc.backends.base import Backend, ClusterEnv, no_checkpoint
from hpvc.cluster import checkpoint_format as cf
from hpvc.cluster import images
from hpvc.cluster import lifecycle as lc
from hpvc.cluster.teardown import teardown, waiting
from hpvc.coordinator import after_change
from hpvc.errors import HpvcError, InputError, require_root
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.model import PlannedNode, Reservations, plan_from_json
from hpvc.progress import Progress, quiet
from hpvc.spec import Spec, parse_spec
from hpvc.store import ClusterRecord, Store
from hpvc.topology.model import Topology


def restore(
    src: Path, name: str | None = None, store: Store | None = None, progress: Progress = quiet
) -> ClusterRecord:
    """Bring the checkpoint in ``src`` back as cluster ``name`` (default: its own)."""
    src = src.absolute()
    m = cf.read_manifest(src)
    progress(f"checking {len(m.nodes)} node(s)' files ({m.size() >> 20} MiB, sha256)")
    cf.verify(src, m)
    require_root("hpvc restore")
    backend = _backend(m)
    doc = {**m.spec, "name": name or m.cluster}
    origin = str(src / cf.MANIFEST)
    spec = parse_spec(doc, origin, "site")
    backend.preflight(spec)
    _check_images(m, spec)
    backend.build_image(spec, progress)  # cached: the nodes' base disks, kernel
    store = store or Store()
    with store.cluster_lock(spec.name, "hpvc restore", waiting(spec.name, progress)):
        rec = _restore_locked(m, src, backend, spec, doc, origin, store, progress)
    after_change(store, progress)  # storage bandwidth shared out anew (docs/io.md)
    return rec


def _backend(m: cf.Manifest) -> Backend:
    names = sorted({n.backend for n in m.nodes})
    if len(names) != 1 or names[0] not in registry.BACKENDS:
        raise InputError(f"checkpoint of {m.cluster}", f"backend {', '.join(names)} is not one"
                         " this hpvc runs", "restore it with the hpvc that took it")  # fmt: skip
    backend = registry.get(names[0])
    if not backend.capabilities.checkpoint:
        raise no_checkpoint(backend.name)
    return backend


def _check_images(
    m: cf.Manifest, spec: Spec, digest_of: Callable[[str], str] = images.digest_of
) -> None:
    """Each node's image digest is what the spec's image name points to here."""
    now = digest_of(spec.image)
    for n in m.nodes:
        if not now:
            raise InputError(
                f"image {spec.image!r}",
                "is not in this host's image store",
                f"import or build it (its digest was {n.image_digest[:19]})",
            )
        if n.image_digest and n.image_digest != now:
            raise InputError(
                f"image {spec.image!r}",
                f"is {now[:19]} here, node {n.name} was saved from {n.image_digest[:19]}",
                "restore onto the image the checkpoint was taken from (same digest)",
            )


def _same_places(m: cf.Manifest) -> lc.Planner:
    """Plan for this host, with the saved names, addresses and MACs, and refuse a
    guest topology other than the saved one."""
    old = {n.name: n for n in plan_from_json(m.plan).nodes}

    def planner(spec: Spec, host: str, topo: Topology, res: Reservations) -> Plan:
        plan = plan_cluster(spec, [(host, topo)], res)
        if {n.name for n in plan.nodes} != {n.name for n in m.nodes}:
            raise InputError(f"checkpoint of {m.cluster}", "its spec plans other nodes than "
                             "it saved", "take a new checkpoint")  # fmt: skip
        nodes = []
        for n in plan.nodes:
            entry = m.node(n.name)
            was = old.get(n.name)
            if was is not None and _guest_shape(was) != _guest_shape(n):
                raise InputError(
                    f"node {n.name}",
                    f"this host gives it {_guest_shape(n)}, it was saved with {_guest_shape(was)}",
                    "restore on a host with the same NUMA layout, or take a new checkpoint",
                )
            nodes.append(replace(n, ip=entry.ip, mac=entry.mac))
        return replace(plan, nodes=tuple(nodes))

    return planner


def _guest_shape(n: PlannedNode) -> str:
    cells = len(n.numa) or 1
    return f"{len(n.vcpus)} vCPU(s), {n.memory_mib} MiB, {cells} guest NUMA node(s)"


def _restore_locked(
    m: cf.Manifest,
    src: Path,
    backend: Backend,
    spec: Spec,
    doc: dict[str, Any],
    origin: str,
    store: Store,
    progress: Progress,
) -> ClusterRecord:
    # The name taken, the subnet taken, too little room: refused here, nothing made.
    rec, plan = lc._book(store, spec, doc, origin, _same_places(m), backend, True)

    def resuming() -> None:
        progress(f"resuming {len(plan.nodes)} node(s) at once")

    try:
        _load_and_thaw(store, rec, plan, backend, src, None, progress, f"hpvc down {spec.name}",
                       resuming)  # fmt: skip
    except Exception as e:
        if isinstance(e, HpvcError) and not isinstance(e, InputError):
            raise
        raise HpvcError(f"restore {spec.name}", str(e) or type(e).__name__) from e
    return rec


def _load_and_thaw(
    store: Store,
    rec: ClusterRecord,
    plan: Plan,
    backend: Backend,
    src: Path,
    hosts: str | None,
    progress: Progress,
    undo_fix: str,
    before_thaw: Callable[[], None] = lambda: None,
) -> None:
    """The booked cluster's nodes loaded from ``src`` and thawed all at once;
    on any failure (Ctrl-C included) everything of it is taken down again,
    and an undo that fails too is one error naming ``undo_fix``."""
    names = [n.name for n in plan.nodes]
    env = ClusterEnv(store, rec, backend.new_state())
    try:
        lc._prepare(env, backend, plan, hosts, progress)
        env.save()
        backend.restore_nodes(env, plan, names, src / cf.NODES, progress)
        before_thaw()
        backend.thaw(env, plan, names)
        rec.status = "running"
        env.save()
    except BaseException as e:
        progress(f"restore {lc.stopped_by(e)}; undoing")
        errors = teardown(store, rec.name)
        if errors:
            raise HpvcError(f"restore {rec.name}", f"{e}; and undo failed: {errors[0]}",
                            undo_fix) from e  # fmt: skip
        raise


def restore_part(
    src: Path,
    m: cf.Manifest,
    spec: Spec,
    doc: dict[str, Any],
    origin: str,
    planner: lc.Planner,
    store: Store,
    progress: Progress = quiet,
    *,
    before_thaw: Callable[[], None] = lambda: None,
    setup: Callable[[ClusterRecord], None] = lambda rec: None,
    hosts: str | None = None,
) -> ClusterRecord:
    """A part of a cluster across hosts (a Slurm job's share) restored from ``src``
    under the caller's ``spec``, ``planner`` (which keeps the saved addresses and
    MACs) and record settings (``setup``: overlay, binds, user, as ``up_spec``
    sets them); ``before_thaw`` runs once every node is loaded, still frozen (the
    job's other hosts restoring theirs: hpvc.slurm.checkpoint_share). Checks
    and undo as ``restore``'s."""
    cf.verify(src, m)
    require_root("hpvc restore")
    backend = _backend(m)
    backend.preflight(spec)
    _check_images(m, spec)
    backend.build_image(spec, progress)
    with store.cluster_lock(spec.name, "hpvc restore", waiting(spec.name, progress)):
        rec, plan = lc._book(store, spec, doc, origin, planner, backend, False)
        setup(rec)
        _load_and_thaw(store, rec, plan, backend, src, hosts, progress, "hpvc node down",
                       before_thaw)  # fmt: skip
    after_change(store, progress)
    return rec

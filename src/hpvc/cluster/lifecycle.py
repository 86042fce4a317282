"""up, scale and down of a cluster on this host, whatever its nodes are.

``up`` plans under the state lock (so two commands never book the same CPU),
writes the record, then changes the host step by step, each change journaled
before it is made: what every cluster needs here (hugepage pools, the bridge,
the hosts file), the rest through its backend (``hpvc.backends.base``). Any
failure undoes everything; a crash leaves journals that ``down`` replays, with
no backend code. ``HPVC_FAIL_AT`` (tests only, ``hpvc.faults``) injects a
failure after a named step.

Long because up and scale share their booking, rollback and record keeping
(pages, holdings, image digests) here; teardown and subnets live apart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpvc.backends import registry
from hpvc.backends.base import Backend, ClusterEnv
from hpvc.cluster import images, pages
from hpvc.cluster.status import open_env as open_env
from hpvc.cluster.subnets import claim_subnet
from hpvc.cluster.teardown import down as down
from hpvc.cluster.teardown import teardown as teardown
from hpvc.cluster.teardown import teardown_locked as teardown_locked
from hpvc.cluster.teardown import waiting as _waiting
from hpvc.coordinator import after_change
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.faults import inject
from hpvc.host import hugepages, net, vxlan
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.model import Reservations
from hpvc.plan.overlay import Overlay
from hpvc.plan.reservations import Holding, holdings_of
from hpvc.progress import Progress, quiet
from hpvc.render import files as render_files
from hpvc.spec import Spec, parse_spec, read_spec
from hpvc.store import ClusterRecord, Store, full
from hpvc.topology import read_topology
from hpvc.topology.model import Topology


def preflight(spec: Spec, origin: str = "<spec>") -> Backend:
    """Refuse, before any host change, what cannot work here; the spec's backend
    (a spec from ``origin`` naming none of this hpvc's is refused there)."""
    backend = registry.for_spec(spec, origin)  # the spec's own mistakes first
    if os.geteuid() != 0:
        raise MissingDependency(
            "hpvc up", "needs root (cgroups, namespaces, mounts)", "run as root"
        )
    backend.preflight(spec)
    return backend


def hostname() -> str:
    return socket.gethostname() or "localhost"


def _prepare(
    env: ClusterEnv, backend: Backend, plan: Plan, hosts: str | None, progress: Progress
) -> None:
    """Cluster-wide host changes: hugepages, the bridge, shared files; then the backend's."""
    j = env.journal()
    _grow_pages(env, plan, progress)
    overlay = Overlay.from_json(env.rec.overlay) if env.rec.overlay else None
    address = overlay.bridge_address if overlay is not None else plan.network.gateway
    net.ensure_bridge(j, plan.network.bridge, address, plan.network.prefixlen, plan.network.mtu)
    inject("bridge")
    if overlay is not None and overlay.remotes:
        progress(f"network across hosts: VXLAN {overlay.vni} to {', '.join(overlay.peers())}")
        vxlan.hold_port(env.store.vxlan_port_journal(), overlay.port)  # kept: see ops
        vxlan.join(j, env.name, plan.network.bridge, overlay)
    (env.dir / "mpi").mkdir(parents=True, exist_ok=True)
    (env.dir / "hosts").write_text(hosts if hosts is not None else render_files.hosts(plan))
    backend.prepare(env, plan, progress)


def _grow_pages(env: ClusterEnv, plan: Plan, progress: Progress) -> None:
    j = env.journal()
    mounts = env.rec.hugetlbfs
    for g in plan.hosts[0].hugepages:
        if g.grow:
            progress(f"hugepages: node {g.host_node} +{g.grow} x {g.size_kib} KiB")
            hugepages.grow_pool(j, g.host_node, g.size_kib, g.grow)
        if str(g.size_kib) not in mounts:
            path = env.dir / "hugepages" / f"{g.size_kib}kB"
            hugepages.ensure_hugetlbfs(j, path, g.size_kib)
            mounts[str(g.size_kib)] = str(path)
    inject("hugepages")


# How ``up`` plans: (spec, this host's name and topology, what other clusters
# hold) -> the plan. Slurm shares plan a subset of the nodes (hpvc.slurm).
Planner = Callable[[Spec, str, Topology, Reservations], Plan]


def _plan_all(spec: Spec, host: str, topo: Topology, res: Reservations) -> Plan:
    return plan_cluster(spec, [(host, topo)], res)


def up(spec_path: str, store: Store | None = None, progress: Progress = quiet) -> ClusterRecord:
    """Plan, then bring every node up; on any failure leave nothing behind."""
    spec, doc = read_spec(spec_path)
    return up_spec(spec, doc, str(Path(spec_path).resolve()), store, progress)


def up_spec(
    spec: Spec,
    doc: dict[str, Any],
    spec_path: str,
    store: Store | None = None,
    progress: Progress = quiet,
    planner: Planner = _plan_all,
    *,
    hosts: str | None = None,
    binds: tuple[str, ...] = (),
    overlay: Overlay | None = None,
    tenant: bool = False,
    exclusive_subnet: bool = True,
    console_mib: int | None = None,  # each node's console log cap (None: the site's max_console)
    user: dict[str, Any] | None = None,  # a Slurm share's job user (ClusterRecord.user)
) -> ClusterRecord:
    """``up`` of an already loaded spec. Slurm shares plan part of a cluster
    (``planner``), give every node the whole cluster's /etc/hosts (``hosts``),
    the site's shared directories (``binds``), join this host's part to the
    cluster's other hosts (``overlay``, VXLAN), and are run for an ordinary
    user (``tenant``: the backend hardens what a user can reach of the nodes,
    e.g. container roots mounted nosuid,nodev; kept in the record, so a later
    scale does the same). ``hpvc up`` is root's own cluster: not a tenant.
    ``exclusive_subnet``: refuse a subnet that overlaps another cluster here
    or a host route (a spec naming none gets a free one); Slurm shares, whose
    subnets hpvc.slurm cuts and checks itself, pass False."""
    backend = preflight(spec, spec_path)
    store = store or Store()
    with store.cluster_lock(spec.name, "hpvc up", _waiting(spec.name, progress)):
        return _up_locked(backend, spec, doc, spec_path, store, progress, planner,
                          hosts=hosts, binds=binds, overlay=overlay, tenant=tenant,
                          exclusive_subnet=exclusive_subnet, console_mib=console_mib,
                          user=user)  # fmt: skip


def _up_locked(
    backend: Backend,
    spec: Spec,
    doc: dict[str, Any],
    spec_path: str,
    store: Store,
    progress: Progress,
    planner: Planner,
    *,
    hosts: str | None,
    binds: tuple[str, ...],
    overlay: Overlay | None,
    tenant: bool,
    exclusive_subnet: bool = True,
    console_mib: int | None = None,
    user: dict[str, Any] | None = None,
) -> ClusterRecord:
    t0 = time.perf_counter()
    phases: dict[str, float] = {}
    backend.build_image(spec, progress)
    phases["image"] = time.perf_counter() - t0
    rec, plan = _book(store, spec, doc, spec_path, planner, backend, exclusive_subnet)
    phases["plan"] = time.perf_counter() - t0 - sum(phases.values())
    rec.phases = phases
    rec.overlay = overlay.to_json() if overlay is not None else None
    rec.binds = list(binds)
    rec.tenant = tenant
    rec.console_mib = console_mib
    rec.user = user
    # A killed `up` still rolls back (only in this process: see _terminated).
    previous = signal.signal(signal.SIGTERM, _terminated(os.getpid()))
    env = ClusterEnv(store, rec, backend.new_state())
    try:
        _prepare(env, backend, plan, hosts, progress)
        phases["host"] = time.perf_counter() - t0 - sum(phases.values())
        env.save()  # what was prepared (holder PID, accelerator) survives a crash
        split = backend.start(env, plan, [n.name for n in plan.nodes], progress)
        # A backend that splits its start (VMs: start, boot, configure) says how.
        phases.update(split or {"nodes": time.perf_counter() - t0 - sum(phases.values())})
        if plan.spark is not None:
            start_services(backend, env, plan, [n.name for n in plan.nodes], progress)
            phases["services"] = time.perf_counter() - t0 - sum(phases.values())
        rec.status = "running"
        rec.up_seconds = time.perf_counter() - t0
        env.save()
    except BaseException as e:
        progress(f"{stopped_by(e)}; undoing")
        errors = teardown(store, spec.name)
        if errors:
            raise HpvcError(
                f"up {spec.name}", f"{e}; and undo failed: {errors[0]}", f"hpvc down {spec.name}"
            ) from e
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    after_change(store, progress)  # storage bandwidth shared out anew (docs/io.md)
    return rec


def stopped_by(e: BaseException) -> str:
    """What stopped an ``up``, as the user should read it."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(e, SystemExit):
        code = e.code if isinstance(e.code, int) else 0
        return f"interrupted (signal {code - 128})" if code > 128 else "interrupted"
    return f"failed ({e})"


def _terminated(owner: int) -> Callable[[int, object], None]:
    """SIGTERM handler raising SystemExit (so ``up`` undoes its work), in ``owner`` only.

    Libraries fork helpers (netlink in other namespaces); a forked child that
    inherited the handler must just exit, never unwind into our rollback.
    """

    def handler(signum: int, _frame: object) -> None:
        if os.getpid() != owner:
            os._exit(128 + signum)
        raise SystemExit(128 + signum)

    return handler


def _book(
    store: Store,
    spec: Spec,
    doc: dict[str, Any],
    spec_path: str,
    planner: Planner,
    backend: Backend,
    exclusive_subnet: bool = True,
) -> tuple[ClusterRecord, Plan]:
    with store.lock():
        if store.load(spec.name) is not None:
            raise InputError(
                f"cluster {spec.name!r}", "already exists", f"hpvc down {spec.name}, or rename it"
            )
        if exclusive_subnet:
            spec, doc = claim_subnet(store, spec, doc)
        host = hostname()
        topo = pages.unheld(store, read_topology("/"), host, spec.name)
        plan = planner(spec, host, topo, store.reservations(exclude=spec.name))
        now = time.time()
        rec = ClusterRecord(
            name=spec.name,
            spec=doc,
            spec_path=spec_path,
            plan=plan.to_json(),
            status="creating",
            created=now,
            updated=now,
            holdings=holdings_of(plan, {host: topo.cpu_package()}),
            backend=backend.name,
            pages=pages.to_record(pages.held_by_plan(plan, host)),
        )
        images.record(rec, [n.name for n in plan.nodes])  # which image, by digest
        store.save(rec)
    return rec, plan


def scale(
    name: str, changes: dict[str, int], store: Store | None = None, progress: Progress = quiet
) -> ClusterRecord:
    """Set node counts per role on a running cluster; add or remove nodes."""
    store = store or Store()
    with store.cluster_lock(name, "hpvc scale", _waiting(name, progress)):
        return _scale_locked(name, changes, store, progress)


def _scale_locked(
    name: str, changes: dict[str, int], store: Store, progress: Progress
) -> ClusterRecord:
    with store.lock():
        rec = store.get(name)
        if rec.status != "running":
            raise InputError(f"cluster {name!r}", f"is {rec.status}", "wait, or hpvc down it")
        spec = parse_spec(_rescaled(rec.spec, changes), rec.spec_path, "site")  # site's caps
        old = rec.the_plan()
        host = hostname()
        topo = pages.unheld(store, read_topology("/"), host, name, own=rec)
        plan = plan_cluster(spec, [(host, topo)], store.reservations(exclude=name), existing=old)
        now_held = pages.held_by_plan(plan, host)
        was_held = pages.held(rec, host)
        rec.pages = pages.to_record(pages.merged(was_held, now_held))
        rec.status = "scaling"
        # Until it is done the cluster holds both the old and the new CPUs, so a
        # concurrent `up` cannot take what the new nodes are about to get.
        new_holdings = holdings_of(plan, {host: topo.cpu_package()})
        rec.holdings = {
            h: _union(rec.holdings.get(h), new_holdings.get(h))
            for h in set(rec.holdings) | set(new_holdings)
        }
        images.record(rec, sorted({n.name for n in plan.nodes} - {n.name for n in old.nodes}))
        _disk_full_is_one_line(name, store, store.save, rec)  # nothing changed yet
    backend, env = open_env(store, rec)
    try:
        _apply_scale(env, backend, old, plan, progress)
        pages.shrink(env.journal(), was_held, now_held)  # a scale down returns what it grew
    except BaseException as e:
        added = [n.name for n in plan.nodes if n.name not in {o.name for o in old.nodes}]
        for n in added:  # take back the nodes this scale added, keep the rest
            env.node_journal(n).undo_all(progress)
        rec.status = "failed"
        with contextlib.suppress(OSError):  # the first error is the one to report
            env.save()
        if full(e):
            raise _disk_full(name, store, "failed") from e
        raise
    rec.spec = _rescaled(rec.spec, changes)
    rec.plan = plan.to_json()
    rec.holdings = holdings_of(plan, {host: topo.cpu_package()})
    rec.pages = pages.to_record(now_held)
    images.record(rec, [])  # the nodes this scale removed forgotten
    rec.status = "running"
    _disk_full_is_one_line(name, store, env.save)
    return rec


def _disk_full_is_one_line(name: str, store: Store, save: Callable[..., None], *args: Any) -> None:
    """A record write that meets a full state disk (its reserve spent, see
    ``hpvc.store``) fails ``scale`` with one line; the record then
    still says what it said before (``running``, or ``scaling``: interrupted)."""
    try:
        save(*args)
    except OSError as e:
        if not full(e):
            raise
        raise _disk_full(name, store, "not saved") from e


def _disk_full(name: str, store: Store, what: str) -> HpvcError:
    return HpvcError(
        f"scale {name}",
        f"the state disk is full ({store.root}); the cluster's record is {what}",
        f"free space there, or hpvc down {name}",
    )


def _union(a: Holding | None, b: Holding | None) -> Holding:
    out = Holding()
    for h in (a, b):
        if h is not None:
            for k, v in asdict(h).items():
                setattr(out, k, sorted(set(getattr(out, k)) | set(v)))
    return out


def _rescaled(spec: dict[str, Any], changes: dict[str, int]) -> dict[str, Any]:
    groups = [dict(g) for g in spec["nodes"]]
    for role, count in changes.items():
        mine = [g for g in groups if g["role"] == role]
        if not mine:
            roles = ", ".join(dict.fromkeys(str(g["role"]) for g in groups))
            raise InputError(
                f"scale {role}={count}",
                f"the spec has no {role!r} nodes",
                f"scale one of its roles: {roles}",
            )
        if count < 0:
            raise InputError(
                f"scale {role}={count}", "a count cannot be negative", f"give {role}=0 or more"
            )
        others = sum(int(g["count"]) for g in mine[:-1])
        if count < others:
            raise InputError(
                f"scale {role}={count}",
                f"the first groups of {role} hold {others} nodes (only the last one scales)",
                f"give {role}={others} or more",
            )
        mine[-1]["count"] = count - others
    return {**spec, "nodes": groups}


def _apply_scale(
    env: ClusterEnv, backend: Backend, old: Plan, plan: Plan, progress: Progress
) -> None:
    before = {n.name for n in old.nodes}
    after = {n.name for n in plan.nodes}
    gone = sorted(before - after)
    if gone:
        backend.stop(env, old, gone, progress)
    _grow_pages(env, plan, progress)
    new = [n.name for n in plan.nodes if n.name not in before]
    backend.start(env, plan, new, progress)
    backend.refresh(env, old, plan, progress)
    backend.repin(env, old, plan)
    start_services(backend, env, plan, new, progress)


def start_services(
    backend: Backend, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress
) -> None:
    """What the cluster serves itself from inside its nodes (Spark's daemons),
    on the nodes ``names`` that just started."""
    if plan.spark is not None and names:
        from hpvc.cluster import spark  # only Spark clusters pay its import

        spark.start(backend, env, plan, names, progress)

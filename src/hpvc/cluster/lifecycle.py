"""up, scale and down of container clusters on this host.

``up`` plans under the state lock (so two commands never book the same CPU),
writes the record, then changes the host step by step, each change journaled
before it is made. Any failure undoes everything; a crash leaves journals that
``down`` replays. ``HPVC_FAIL_AT`` (tests only) injects a failure after a named
step: ``<step>`` raises, ``crash:<step>`` kills the process outright.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hpvc.backends import container as ct
from hpvc.backends import vm_libvirt, vm_qemu
from hpvc.cluster import vm
from hpvc.cluster.state import ClusterRecord, Store
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host import cgroups, hugepages, net
from hpvc.image import resolve_image
from hpvc.image.guest import GuestArtifacts, build_guest
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.model import Reservations
from hpvc.plan.reservations import Holding, holdings_of
from hpvc.render import files as render_files
from hpvc.render import qemu as render_qemu
from hpvc.render.context import RenderContext
from hpvc.spec import Spec, load_spec, parse_spec
from hpvc.topology import read_topology
from hpvc.topology.model import Topology
from hpvc.units import format_cpulist

Progress = Callable[[str], None]
SHM_MIB = 1024
QEMU = "qemu-system-x86_64"
SHARED_MOUNT = "/shared"


def _quiet(_: str) -> None:
    pass


def inject(step: str) -> None:
    """Test hook: fail (or crash) right after ``step`` when HPVC_FAIL_AT names it."""
    want = os.environ.get("HPVC_FAIL_AT", "")
    if want == step:
        raise HpvcError("injected failure", f"HPVC_FAIL_AT={step}")
    if want == f"crash:{step}":
        os._exit(70)


def preflight(spec: Spec) -> None:
    """Refuse, before any host change, what cannot work here."""
    if os.geteuid() != 0:
        raise MissingDependency(
            "hpvc up", "needs root (cgroups, namespaces, mounts)", "run as root"
        )
    if spec.kind == "vm":
        if shutil.which(QEMU) is None:
            raise MissingDependency(
                "VM nodes", f"{QEMU} not found", "apt-get install qemu-system-x86"
            )
        if spec.backend == "libvirt":
            vm_libvirt.connect(vm.libvirt_uri()).close()  # libvirtd answers, or exit 2 now
    else:
        ct.runtime()


def hostname() -> str:
    return socket.gethostname() or "localhost"


@dataclass(frozen=True)
class Env:
    """Where a cluster lives on this host, rebuilt from its record by every command."""

    store: Store
    rec: ClusterRecord

    @property
    def dir(self) -> Path:
        return self.store.cluster_dir(self.rec.name)

    def ctx(self) -> RenderContext:
        x = self.rec.extra
        return RenderContext(
            base_dir=str(self.store.root),
            node_rootfs=True,
            command=ct.INIT,
            hugetlbfs=tuple((int(k), v) for k, v in x.get("hugetlbfs", {}).items()),
            shared_ns_pid=x.get("holder_pid"),
            shared_shm=x.get("shm"),
            shm_size_mib=SHM_MIB,
            binds=(
                # Open MPI's session dir: same path inside as outside (PMIx files).
                (str(self.dir / "mpi"), str(self.dir / "mpi"), False),
                # A directory every node sees, like a cluster's shared home.
                (str(self.dir / "shared"), SHARED_MOUNT, False),
                # Host directories a site shares with Slurm jobs' nodes (hpvc.slurm).
                *((p, p, False) for p in x.get("binds", [])),
            ),
            block_device=_dev(x.get("block_device")),
        )


def _dev(value: Any) -> tuple[int, int] | None:
    return (int(value[0]), int(value[1])) if value else None


def block_device(path: Path) -> tuple[int, int] | None:
    """The whole disk under ``path`` (throttles apply to disks, not partitions)."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
    if not sys_dev.exists():
        return None  # overlay, tmpfs, ...: no block device to throttle
    if (sys_dev / "partition").exists():
        parent = (sys_dev.resolve().parent / "dev").read_text().strip()
        major, minor = (int(x) for x in parent.split(":"))
    return (major, minor)


def _prepare(env: Env, plan: Plan, spec: Spec, progress: Progress) -> None:
    """Cluster-wide host changes: cgroup parent, hugepages, bridge, shared memory."""
    j = env.store.journal(env.rec.name)
    if spec.kind == "vm":
        _prepare_vm(env, plan, progress)
        return
    cgroups.ensure_hugetlb_v1(env.store.host_journal())
    cpus = sorted({c for n in plan.nodes for c in n.cpuset})
    mems = sorted({c.host_node for n in plan.nodes for c in n.numa})
    cgroups.ensure_cluster_cgroup(
        j,
        env.rec.name,
        cpus=format_cpulist(cpus),
        mems=format_cpulist(mems),
        exclusive=spec.tuning.partition == "hpc",
    )
    inject("cgroup")
    _grow_pages(env, plan, progress)
    net.ensure_bridge(
        j, plan.network.bridge, plan.network.gateway, plan.network.prefixlen, plan.network.mtu
    )
    inject("bridge")
    (env.dir / "mpi").mkdir(parents=True, exist_ok=True)
    (env.dir / "shared").mkdir(parents=True, exist_ok=True)
    (env.dir / "hosts").write_text(render_files.hosts(plan))
    if spec.tuning.locality == "shm":
        ct.mount_tmpfs(j, env.dir / "shm", SHM_MIB)
        env.rec.extra["shm"] = str(env.dir / "shm")
        env.rec.extra["holder_pid"] = ct.start_holder(j, env.dir / "holder.pid")
    dev = block_device(env.store.root)
    env.rec.extra["block_device"] = dev
    if dev is not None and any(n.io and n.io.weight for n in plan.nodes):
        # Weights need the bfq scheduler; the device is host-wide, so is the undo.
        cgroups.ensure_bfq(env.store.host_journal(), cgroups.device_name(dev))


def _prepare_vm(env: Env, plan: Plan, progress: Progress) -> None:
    """VM clusters: hugepage pools and hugetlbfs, the bridge, the cluster's ssh key."""
    j = env.store.journal(env.rec.name)
    _grow_pages(env, plan, progress)
    net.ensure_bridge(
        j, plan.network.bridge, plan.network.gateway, plan.network.prefixlen, plan.network.mtu
    )
    inject("bridge")
    (env.dir / "mpi").mkdir(parents=True, exist_ok=True)
    vm.ssh_key(env.dir)
    choice = vm_qemu.accelerator()
    env.rec.extra["accel"] = choice.name
    env.rec.extra["backend"] = env.rec.spec.get("backend") or "qemu"
    if env.rec.extra["backend"] == "libvirt":
        env.rec.extra["libvirt_uri"] = vm.libvirt_uri()
    if choice.warning:
        progress(choice.warning)
        env.rec.extra["accel_warning"] = choice.warning


def _start_vms(
    env: Env, plan: Plan, names: list[str], guest: GuestArtifacts, progress: Progress
) -> None:
    """Start the VMs (they boot in parallel), wait for all, configure /etc/hosts and ARP."""
    ctx = vm.vm_context(
        env.store, guest, env.rec.extra.get("hugetlbfs", {}), env.rec.extra.get("accel", "tcg")
    )
    # Locality for VMs: co-resident guests share an ivshmem region (a PCI BAR).
    locality = parse_spec(env.rec.spec, env.rec.spec_path).tuning.locality
    shm = vm.ivshmem_for(env.store, plan, env.store.journal(env.rec.name), locality)
    if shm is not None:
        ctx = replace(ctx, ivshmem=shm)
        env.rec.extra["ivshmem"] = list(shm)
    pids = env.rec.extra.setdefault("pids", {})
    phases = env.rec.extra.setdefault("phases", {})
    t0 = time.perf_counter()
    for name in names:
        progress(f"node {name}: starting QEMU")
        pids[name] = vm.start_node(
            env.store, plan, plan.node(name), guest, ctx, env.rec.extra.get("backend", "qemu")
        )
        inject(f"node:{name}")
    t1 = time.perf_counter()
    progress(f"waiting for {len(names)} guest(s) to boot ({ctx.accel})")
    waited = vm.wait_all(env.store, plan, {n: pids[n] for n in names}, ctx, vm.READY_TIMEOUT_S)
    t2 = time.perf_counter()
    env.rec.extra.setdefault("boot_seconds", {}).update(waited)
    vm.configure(env.store, plan, [n.name for n in plan.nodes])  # all: new names everywhere
    # start: disks, taps, QEMU, pinning; boot: to every hpvc-ready line;
    # configure: /etc/hosts and ARP over ssh in every guest.
    phases.update(start=t1 - t0, boot=t2 - t1, configure=time.perf_counter() - t2)


def _grow_pages(env: Env, plan: Plan, progress: Progress) -> None:
    j = env.store.journal(env.rec.name)
    mounts = env.rec.extra.setdefault("hugetlbfs", {})
    for g in plan.hosts[0].hugepages:
        if g.grow:
            progress(f"hugepages: node {g.host_node} +{g.grow} x {g.size_kib} KiB")
            hugepages.grow_pool(j, g.host_node, g.size_kib, g.grow)
        if str(g.size_kib) not in mounts:
            path = env.dir / "hugepages" / f"{g.size_kib}kB"
            hugepages.ensure_hugetlbfs(j, path, g.size_kib)
            mounts[str(g.size_kib)] = str(path)
    inject("hugepages")


def _start_node(env: Env, plan: Plan, node_name: str, rootfs: Path) -> None:
    node = plan.node(node_name)
    j = env.store.node_journal(env.rec.name, node.name)
    node_dir = env.store.node_dir(env.rec.name, node.name)
    j.record("tree", path=str(node_dir))
    ct.mount_overlay(j, rootfs, node_dir)
    ct.wire_node(j, plan, node)
    ct.start_container(j, plan, node, env.ctx(), node_dir)
    if node.io is not None:  # bfq weight (crun cannot), and a check of the throttles
        cgroups.apply_node_extras(
            env.rec.name, node.name, io=node.io, device=env.ctx().block_device
        )
    inject(f"node:{node.name}")


# How ``up`` plans: (spec, this host's name and topology, what other clusters
# hold) -> the plan. Slurm shares plan a subset of the nodes (hpvc.slurm).
Planner = Callable[[Spec, str, Topology, Reservations], Plan]


def _plan_all(spec: Spec, host: str, topo: Topology, res: Reservations) -> Plan:
    return plan_cluster(spec, [(host, topo)], res)


def up(spec_path: str, store: Store | None = None, progress: Progress = _quiet) -> ClusterRecord:
    """Plan, then bring every node up; on any failure leave nothing behind."""
    spec = load_spec(spec_path)
    doc = tomllib.loads(Path(spec_path).read_text())  # as written: scale edits counts
    return up_spec(spec, doc, str(Path(spec_path).resolve()), store, progress)


def up_spec(
    spec: Spec,
    doc: dict[str, Any],
    spec_path: str,
    store: Store | None = None,
    progress: Progress = _quiet,
    planner: Planner = _plan_all,
    after_prepare: Callable[[Env, Plan], None] | None = None,
) -> ClusterRecord:
    """``up`` of an already loaded spec; ``planner`` and ``after_prepare`` let
    callers (Slurm shares) plan part of a cluster and add files before nodes start."""
    preflight(spec)
    image = resolve_image(spec.image)
    t0 = time.perf_counter()
    phases: dict[str, float] = {}
    guest = build_guest(image, progress=progress) if spec.kind == "vm" else None
    phases["image"] = time.perf_counter() - t0
    store = store or Store()
    rec, plan = _book(store, spec, doc, spec_path, planner)
    phases["plan"] = time.perf_counter() - t0 - sum(phases.values())
    rec.extra["phases"] = phases
    # A killed `up` still rolls back (only in this process: see _terminated).
    previous = signal.signal(signal.SIGTERM, _terminated(os.getpid()))
    env = Env(store, rec)
    try:
        _prepare(env, plan, spec, progress)
        if after_prepare is not None:
            after_prepare(env, plan)
        phases["host"] = time.perf_counter() - t0 - sum(phases.values())
        if guest is not None:
            _start_vms(env, plan, [n.name for n in plan.nodes], guest, progress)
        for n in plan.nodes if guest is None else ():
            progress(f"node {n.name}")
            _start_node(env, plan, n.name, image.rootfs)
        if guest is None:
            phases["nodes"] = time.perf_counter() - t0 - sum(phases.values())
        rec.status = "running"
        rec.extra["up_seconds"] = time.perf_counter() - t0
        store.save(rec)
    except BaseException as e:
        progress(f"failed ({e}); undoing")
        errors = teardown(store, spec.name)
        if errors:
            raise HpvcError(
                f"up {spec.name}", f"{e}; and undo failed: {errors[0]}", f"hpvc down {spec.name}"
            ) from e
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return rec


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
    store: Store, spec: Spec, doc: dict[str, Any], spec_path: str, planner: Planner
) -> tuple[ClusterRecord, Plan]:
    with store.lock():
        if store.load(spec.name) is not None:
            raise InputError(
                f"cluster {spec.name!r}", "already exists", f"hpvc down {spec.name}, or rename it"
            )
        host, topo = hostname(), read_topology("/")
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
        )
        store.save(rec)
    return rec, plan


def teardown(store: Store, name: str, progress: Progress = _quiet) -> list[str]:
    """Undo every node's journal, then the cluster's; remove the state if clean."""
    base = store.cluster_dir(name)
    errors: list[str] = []
    nodes = base / "nodes"
    for d in sorted(nodes.iterdir()) if nodes.is_dir() else []:
        errors += store.node_journal(name, d.name).undo_all(progress)
    errors += store.journal(name).undo_all(progress)
    if not errors:
        store.remove(name)
        with store.lock():
            if not store.names():  # the last cluster: host-wide changes go too
                errors += store.host_journal().undo_all(progress)
    return errors


def down(name: str, store: Store | None = None, progress: Progress = _quiet) -> None:
    store = store or Store()
    rec = store.get(name)
    rec.status = "deleting"
    store.save(rec)
    errors = teardown(store, name, progress)
    if errors:
        raise HpvcError(
            f"down {name}", f"{len(errors)} step(s) failed, first: {errors[0]}", "run down again"
        )


def scale(
    name: str, changes: dict[str, int], store: Store | None = None, progress: Progress = _quiet
) -> ClusterRecord:
    """Set node counts per role on a running cluster; add or remove nodes."""
    store = store or Store()
    with store.lock():
        rec = store.get(name)
        if rec.status != "running":
            raise InputError(f"cluster {name!r}", f"is {rec.status}", "wait, or hpvc down it")
        spec = parse_spec(_rescaled(rec.spec, changes), rec.spec_path)
        old = rec.the_plan()
        host, topo = hostname(), read_topology("/")
        plan = plan_cluster(spec, [(host, topo)], store.reservations(exclude=name), existing=old)
        rec.status = "scaling"
        # Until it is done the cluster holds both the old and the new CPUs, so a
        # concurrent `up` cannot take what the new nodes are about to get.
        new_holdings = holdings_of(plan, {host: topo.cpu_package()})
        rec.holdings = {
            h: _union(rec.holdings.get(h), new_holdings.get(h))
            for h in set(rec.holdings) | set(new_holdings)
        }
        store.save(rec)
    env = Env(store, rec)
    try:
        _apply_scale(env, old, plan, progress)
    except BaseException:
        for n in plan.nodes:  # take back the nodes this scale added, keep the rest
            if n.name not in {o.name for o in old.nodes}:
                store.node_journal(name, n.name).undo_all(progress)
        rec.status = "failed"
        store.save(rec)
        raise
    rec.spec = _rescaled(rec.spec, changes)
    rec.plan = plan.to_json()
    rec.holdings = holdings_of(plan, {host: topo.cpu_package()})
    rec.status = "running"
    store.save(rec)
    return rec


def _union(a: Holding | None, b: Holding | None) -> Holding:
    out = Holding()
    for h in (a, b):
        if h is not None:
            for k, v in asdict(h).items():
                setattr(out, k, sorted(set(getattr(out, k)) | set(v)))
    return out


def _repin_vms(env: Env, old: Plan, plan: Plan) -> None:
    """Running VMs whose floating set or emulator CPUs changed get them applied live.

    (Direct-QEMU backend; under libvirt the running domains keep their pinning.)
    """
    if env.rec.extra.get("backend") == "libvirt":
        return
    pids = env.rec.extra.get("pids", {})
    for n in plan.nodes:
        was = old.node(n.name) if n.name in {o.name for o in old.nodes} else None
        if was is None or (was.cpuset, was.emulator_cpus) == (n.cpuset, n.emulator_cpus):
            continue
        qmp = env.store.root / "run" / plan.cluster / n.name / "qmp.sock"
        vm_qemu.apply_pinning(qmp, pids[n.name], render_qemu.qemu_pinning(n))


def _rescaled(spec: dict[str, Any], changes: dict[str, int]) -> dict[str, Any]:
    groups = [dict(g) for g in spec["nodes"]]
    for role, count in changes.items():
        mine = [g for g in groups if g["role"] == role]
        if not mine:
            raise InputError(f"scale {role}={count}", f"the spec has no {role!r} nodes", "")
        if count < 0:
            raise InputError(f"scale {role}={count}", "a count cannot be negative", "")
        others = sum(int(g["count"]) for g in mine[:-1])
        if count < others:
            raise InputError(
                f"scale {role}={count}", f"the first groups of {role} hold {others} nodes", ""
            )
        mine[-1]["count"] = count - others
    return {**spec, "nodes": groups}


def _apply_scale(env: Env, old: Plan, plan: Plan, progress: Progress) -> None:
    before = {n.name for n in old.nodes}
    after = {n.name for n in plan.nodes}
    for gone in sorted(before - after):
        progress(f"remove {gone}")
        env.store.node_journal(env.rec.name, gone).undo_all(progress)
        env.rec.extra.get("pids", {}).pop(gone, None)
    _grow_pages(env, plan, progress)
    image = resolve_image(plan.image)
    if plan.kind == "vm":
        new = [n.name for n in plan.nodes if n.name not in before]
        _start_vms(env, plan, new, build_guest(image, progress=progress), progress)
        _repin_vms(env, old, plan)
        return
    ct.write_in_place(env.dir / "hosts", render_files.hosts(plan))
    for n in plan.nodes:
        if n.name not in before:
            progress(f"add {n.name}")
            _start_node(env, plan, n.name, image.rootfs)
    entries = render_files.arp_entries(plan)
    for n in plan.nodes:
        if n.name in before:
            net.set_static_neighbors(f"hpvc-{plan.cluster}-{n.name}", entries)
            if n.cpuset != old.node(n.name).cpuset:
                ct.update_cpus(ct.container_id(plan.cluster, n.name), format_cpulist(n.cpuset))

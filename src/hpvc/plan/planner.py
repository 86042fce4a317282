"""plan_cluster(): the pure placement function, (spec, hosts, reservations) -> Plan.

No file, no /sys, no subprocess: everything comes in as data. Hosts are filled
first-fit in the order given (so a cluster stays on as few hosts as possible
and its nodes can share memory), nodes largest first (first-fit decreasing),
all 1:1-pinned nodes before floating ones so the floating ones know which CPUs
stay free.
"""

from __future__ import annotations

import gc
import ipaddress
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

from hpvc.errors import DoesNotFit, InputError
from hpvc.plan import services
from hpvc.plan.addresses import node_ip, node_mac
from hpvc.plan.hoststate import HostState, TopoFacts, host_state, topo_facts
from hpvc.plan.model import (
    HostHugepages,
    HostPlan,
    HostReservation,
    HugepageNeed,
    IOPlan,
    NumaCell,
    Plan,
    PlannedNode,
    Reservations,
    VcpuPin,
)
from hpvc.plan.network import plan_network
from hpvc.plan.place import Placement, Rules, Want, place_dedicated, place_shared, seed
from hpvc.plan.shortage import does_not_fit
from hpvc.spec.model import NodeGroup, Spec
from hpvc.topology.inventory import Fabric
from hpvc.topology.model import Topology


def expand(spec: Spec) -> list[tuple[Want, NodeGroup]]:
    """Every virtual node of the spec, named <role><n>, in spec order."""
    counters: dict[str, int] = {}
    out: list[tuple[Want, NodeGroup]] = []
    for g in spec.nodes:
        dedicated = spec.pinning_of(g) == "dedicated"
        huge_mib = spec.hugepage_mib(g)
        first = counters.get(g.role, 0)
        counters[g.role] = first + g.count
        for n in range(first, first + g.count):
            want = Want(
                index=len(out),
                name=f"{g.role}{n}",
                role=g.role,
                vcpus=g.vcpus,
                memory_mib=g.memory,
                dedicated=dedicated,
                huge_mib=huge_mib,
            )
            out.append((want, g))
    return out


def plan_cluster(
    spec: Spec,
    hosts: Sequence[tuple[str, Topology]],
    reservations: Reservations | None = None,
    existing: Plan | None = None,
    only: Collection[str] | None = None,
    fabric: Mapping[str, Fabric] | None = None,
) -> Plan:
    """Place every node of ``spec`` on ``hosts``; raise DoesNotFit if it cannot.

    ``existing`` is the plan of the running cluster when it is being scaled:
    its nodes that the spec still asks for keep their place, name and
    addresses; only the others are placed. ``reservations`` must then hold the
    other clusters only. Host hugepage counts cover every node, ``grow`` only
    the new ones.

    ``only`` names the nodes to place, a share of the cluster (Slurm gives each
    allocated host its share): they keep the names and addresses they have in
    the whole cluster, so shares planned on different hosts fit together.

    ``fabric`` gives hosts' fabric addresses (the inventory's): a cluster placed
    on more than one host, all of them in it, gets a network across them
    (``hpvc.plan.network``: VNI, VTEPs, node MTU from the fabric's).
    """
    with _no_cycle_collection():
        return _plan_cluster(spec, hosts, reservations, existing, only, fabric)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Pause Python's cycle collector while planning (docs/planning.md "Speed").

    A plan of 100,000 nodes is millions of small objects and no reference
    cycle; the collector's full passes over them, more of them the bigger the
    plan, made the planner's time grow faster than the node count (21 to
    37 us a node from 1,000 to 100,000 nodes; 21 us throughout without them).
    Reference counting still frees everything; the collector runs again after.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _plan_cluster(
    spec: Spec,
    hosts: Sequence[tuple[str, Topology]],
    reservations: Reservations | None,
    existing: Plan | None,
    only: Collection[str] | None,
    fabric: Mapping[str, Fabric] | None,
) -> Plan:
    if not hosts:
        raise InputError("no hosts to plan on", "the host list is empty", "give --hosts FILE")
    names = [n for n, _ in hosts]
    if len(set(names)) != len(names):
        raise InputError("host inventory", "host names repeat", "give every host its own name")
    res = reservations or Reservations()
    rules = Rules(
        vm=spec.kind == "vm",
        hpc=spec.tuning.partition == "hpc",
        mirror=spec.tuning.numa == "mirror",
        page_kib=spec.tuning.hugepage_kib,
    )
    # One lookup table for the reservations and one TopoFacts per distinct
    # topology object: per host, not per host times reservations (issue 33).
    held: dict[str, HostReservation] = {}
    for hr in res.hosts:
        held.setdefault(hr.host, hr)  # the first, as Reservations.for_host
    facts: dict[int, TopoFacts] = {}
    states = []
    for host, topo in hosts:
        f = facts.get(id(topo))
        if f is None:
            f = facts[id(topo)] = topo_facts(topo)
        mine = held.get(host) or res.for_host(host)
        states.append(host_state(host, topo, rules.hpc, mine, f))
    by_name = {h.name: h for h in states}
    wants = expand(spec)
    if only is not None:
        unknown = sorted(set(only) - {w.name for w, _ in wants})
        if unknown or existing is not None:
            raise InputError("plan of a share", f"unknown nodes {unknown}", "")
        wants = [(w, g) for w, g in wants if w.name in only]
    kept = _kept(existing, wants, by_name)
    for node in kept.values():
        seed(by_name[node.host], node, rules)
    new = [w for w, _ in wants if w.name not in kept]
    placed = _place_all(states, new, rules)
    kept = {k: _refloat(n, by_name[n.host], rules) for k, n in kept.items()}
    # A share: every node has the address of its place in the whole spec.
    index = _address_indices(spec, kept, new) if only is None else {w.name: w.index for w in new}
    net = spec.network.network  # a new IPv4Network each time it is read
    memo = _Alike()
    nodes = tuple(
        kept[w.name]
        if w.name in kept
        else _planned(
            spec,
            net,
            w,
            g,
            placed[w.index],
            by_name[placed[w.index].host],
            rules,
            index[w.name],
            memo,
        )
        for w, g in wants
    )
    on_host: dict[str, list[str]] = {}
    for n in nodes:
        on_host.setdefault(n.host, []).append(n.name)
    used = [h for h in states if h.name in on_host]
    network, net_notes = plan_network(
        spec, [h.name for h in used], fabric or {}, [n.ip for n in nodes]
    )
    return Plan(
        cluster=spec.name,
        kind=spec.kind,
        image=spec.image,
        network=network,
        nodes=nodes,
        hosts=tuple(_host_plan(h, rules, tuple(on_host[h.name])) for h in used),
        notes=tuple(sorted({note for _, t in hosts for note in t.notes})) + net_notes,
        shared=services.shared_plan(spec, nodes),
        spark=services.spark_plan(spec, nodes),
    )


def _kept(
    existing: Plan | None, wants: list[tuple[Want, NodeGroup]], hosts: dict[str, HostState]
) -> dict[str, PlannedNode]:
    """Nodes of the running plan that the spec still asks for, on known hosts."""
    if existing is None:
        return {}
    wanted = {w.name for w, _ in wants}
    return {n.name: n for n in existing.nodes if n.name in wanted and n.host in hosts}


def _refloat(node: PlannedNode, h: HostState, rules: Rules) -> PlannedNode:
    """Running nodes give up CPUs that new nodes pinned: a floating node's set,
    a VM's emulator CPUs (both can be changed live)."""
    if node.pinning == "shared":
        cpus = tuple(c for c in node.cpuset if c not in h.dedicated)
        if not cpus:
            raise DoesNotFit(
                f"the new nodes would pin every CPU {node.name} (pinning shared) runs on",
                "add fewer nodes, or give the floating group CPUs of its own",
            )
        emulator = cpus if node.kind == "vm" else node.emulator_cpus
        return replace(node, cpuset=cpus, emulator_cpus=emulator)
    if not rules.vm:
        return node
    emulator = tuple(c for c in node.emulator_cpus if c not in h.dedicated)
    if not emulator:
        pins = tuple(v.pcpu for v in node.vcpus)
        cells = tuple((c.host_node, c.memory_mib) for c in node.numa)
        cell_of = tuple(v.guest_node for v in node.vcpus)
        emulator = _emulator_cpus(h, Placement(h.name, pins, cell_of, cells, node.cpuset), rules)
    return replace(node, emulator_cpus=emulator)


def _address_indices(spec: Spec, kept: dict[str, PlannedNode], new: list[Want]) -> dict[str, int]:
    """Address index of each new node: the lowest ones no kept node uses."""
    base = int(spec.network.network.network_address) + 2
    used = {int(ipaddress.IPv4Address(n.ip)) - base for n in kept.values()}
    out: dict[str, int] = {}
    i = 0
    for w in sorted(new, key=lambda w: w.index):
        while i in used:
            i += 1
        out[w.name] = i
        i += 1
    return out


def _place_all(states: list[HostState], wants: list[Want], rules: Rules) -> dict[int, Placement]:
    """First-fit decreasing over hosts; dedicated nodes before shared ones."""
    order = sorted(
        wants, key=lambda w: (not w.dedicated, -w.vcpus, -w.memory_mib, -w.huge_mib, w.index)
    )
    placed: dict[int, Placement] = {}
    # Hosts that already refused a node of some shape refuse it again (resources
    # only shrink), so each shape resumes where the previous node of it stopped.
    resume: dict[tuple[bool, int, int, int], int] = {}
    for w in order:
        shape = (w.dedicated, w.vcpus, w.memory_mib, w.huge_mib)
        i = resume.get(shape, 0)
        while i < len(states):
            h = states[i]
            p = place_dedicated(h, w, rules) if w.dedicated else place_shared(h, w, rules)
            if p is not None:
                placed[w.index] = p
                break
            i += 1
        if i == len(states):
            raise does_not_fit(w, states, rules, wants)
        resume[shape] = i
    return placed


class _Alike:
    """The immutable parts of planned nodes that many nodes have alike (the same
    pins and cells on hosts of one kind, one group's I/O limits), each made once
    per plan: building them for each of 100,000 nodes was much of the planner's
    time (issue 33). Equal values either way; plans are compared by value."""

    def __init__(self) -> None:
        self.vcpus: dict[tuple[tuple[int | None, ...], tuple[int, ...]], tuple[VcpuPin, ...]] = {}
        self.cells: dict[tuple[tuple[tuple[int, int], ...], tuple[int, ...]], tuple[NumaCell, ...]]
        self.cells = {}
        self.pages: dict[tuple[int, int], HugepageNeed] = {}
        self.io: dict[int, IOPlan | None] = {}


def _planned(
    spec: Spec,
    net: ipaddress.IPv4Network,
    w: Want,
    g: NodeGroup,
    p: Placement,
    h: HostState,
    rules: Rules,
    addr: int,
    memo: _Alike | None = None,
) -> PlannedNode:
    memo = memo or _Alike()
    vcpu_cell = p.vcpu_cell
    cells = memo.cells.get((p.cells, vcpu_cell))
    if cells is None:
        in_cell: list[list[int]] = [[] for _ in p.cells]
        for v, c in enumerate(vcpu_cell):
            if 0 <= c < len(in_cell):
                in_cell[c].append(v)
        cells = memo.cells[(p.cells, vcpu_cell)] = tuple(
            NumaCell(guest_node=i, host_node=host_node, memory_mib=mib, vcpus=tuple(in_cell[i]))
            for i, (host_node, mib) in enumerate(p.cells)
        )
    vcpus = memo.vcpus.get((p.pins, vcpu_cell))
    if vcpus is None:
        vcpus = memo.vcpus[(p.pins, vcpu_cell)] = tuple(
            VcpuPin(vcpu=i, pcpu=pcpu, guest_node=vcpu_cell[i]) for i, pcpu in enumerate(p.pins)
        )
    # The pages of the node's hugepage memory (a container's normal memory is the rest).
    pages = None
    if rules.page_kib and w.huge_mib:
        pages = memo.pages.get((rules.page_kib, w.huge_mib))
        if pages is None:
            pages = memo.pages[(rules.page_kib, w.huge_mib)] = HugepageNeed(
                size_kib=rules.page_kib, count=w.huge_mib * 1024 // rules.page_kib
            )
    if id(g) in memo.io:
        io = memo.io[id(g)]
    else:
        io = memo.io[id(g)] = IOPlan(**g.io.model_dump()) if g.io is not None else None
    return PlannedNode(
        name=w.name,
        role=w.role,
        kind=spec.kind,
        host=p.host,
        partition=spec.tuning.partition,
        pinning="dedicated" if w.dedicated else "shared",
        vcpus=vcpus,
        cpuset=p.cpuset,
        emulator_cpus=_emulator_cpus(h, p, rules) if rules.vm else (),
        numa=cells,
        memory_mib=w.memory_mib,
        hugepages=pages,
        mac=node_mac(spec.name, net, addr),
        ip=node_ip(net, addr),
        io=io,
        disk_mib=g.disk if spec.kind == "container" else None,  # a VM's: docs/vms.md
    )


def _emulator_cpus(h: HostState, p: Placement, rules: Rules) -> tuple[int, ...]:
    """CPUs for a VM's emulator threads: never one a vCPU is pinned to.

    Floating VMs keep their emulator with their vCPUs. Pinned ones get the
    unpinned CPUs of their home socket, else of the sockets the cluster may
    use, else any unpinned CPU outside other clusters' hpc sockets.
    """
    if None in p.pins:
        return p.cpuset
    home = h.cpu_package[p.cpuset[0]]
    # Called only after every node is placed (so h.dedicated and h.reserved no
    # longer change): one answer per home socket serves all nodes of a host.
    known = h.emulator_by_home.get(home)
    if known is not None:
        return known
    spare_by_pkg: dict[int, list[int]] = {}
    for n in h.nodes:
        spare_by_pkg.setdefault(n.package, []).extend(c for c in n.all_cpus if c not in h.dedicated)
    own = h.reserved if rules.hpc else h.usable_packages
    for pkgs in ({home}, own, set(spare_by_pkg) - h.others_hpc):
        cpus = sorted(c for pkg in pkgs for c in spare_by_pkg.get(pkg, ()))
        if cpus:
            h.emulator_by_home[home] = tuple(cpus)
            return h.emulator_by_home[home]
    raise DoesNotFit(
        f"host {h.name!r} has no CPU left for emulator threads that no vCPU is pinned to",
        'leave one CPU unpinned: fewer vCPUs, or pinning = "shared" for one group',
    )


def _host_plan(h: HostState, rules: Rules, names: tuple[str, ...]) -> HostPlan:
    pages = []
    for key in sorted(set(h.pages_needed) | set(h.pages_seeded)):
        node_id, size_kib = key
        pool = h.topo.node(node_id).pool(size_kib)
        free = pool.free if pool else 0
        new, old = h.pages_needed.get(key, 0), h.pages_seeded.get(key, 0)
        # Free pages first serve the running nodes, then the new ones.
        grow = new - min(new, max(0, free - old))
        pages.append(HostHugepages(node_id, size_kib, new + old, free, grow))
    return HostPlan(
        name=h.name,
        hpc_packages=tuple(sorted(h.reserved)) if rules.hpc else (),
        hugepages=tuple(pages),
        nodes=names,
    )

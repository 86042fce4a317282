"""How a Slurm job's virtual cluster is split over its hosts (pure): which
virtual nodes each host runs, the shares' names, which node each task runs
in, the topology as the job sees it, and how the shares on different hosts
join one network."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import replace

import hostlist  # type: ignore[import-untyped]

from hpvc.errors import DoesNotFit, InputError
from hpvc.plan.addresses import node_ip, node_mac
from hpvc.plan.model import Plan, Reservations
from hpvc.plan.overlay import Overlay, Vtep, host_address, node_mtu, vni_for
from hpvc.plan.planner import expand, plan_cluster
from hpvc.slurm.names import parse_share_name as parse_share_name
from hpvc.slurm.names import share_name as share_name
from hpvc.spec import Spec
from hpvc.topology.model import Core, NumaNode, Package, Topology

# ---- splitting the cluster over the job's hosts ---------------------------


def share_planner(
    part: Spec, bridge: str, share: list[str], cpus: set[int] | None, overlay: Overlay | None
) -> Callable[[Spec, str, Topology, Reservations], Plan]:
    """How a share is planned on a host (``up``'s planner): its nodes only, on the
    job's CPUs there, on the job's bridge (``hpvc node up`` and its restore)."""
    mtu = overlay.mtu if overlay is not None else None

    def planner(_: Spec, host: str, topo: Topology, res: Reservations) -> Plan:
        mine = restrict(topo, cpus) if cpus is not None else topo
        plan = plan_cluster(part, [(host, mine)], res, only=set(share))
        network = replace(plan.network, bridge=bridge, mtu=mtu or plan.network.mtu)
        return replace(plan, network=network)

    return planner


def split(spec: Spec, hosts: int) -> list[list[str]]:
    """Virtual node names per host: spec order, blocks as even as possible."""
    names = [w.name for w, _ in expand(spec)]
    if hosts > len(names):
        raise DoesNotFit(
            f"the job has {hosts} hosts but the spec {len(names)} virtual node(s)",
            f"ask for at most {len(names)} node(s) (-N {len(names)}) or add nodes to the spec",
        )
    base, extra = divmod(len(names), hosts)
    out: list[list[str]] = []
    start = 0
    for i in range(hosts):
        size = base + (1 if i < extra else 0)
        out.append(names[start : start + size])
        start += size
    return out


def task_pool(share: Sequence[str], roles: dict[str, str]) -> list[str]:
    """The nodes local tasks run in, in order: local task ``t`` runs in
    ``pool[t % len(pool)]`` (the plugin does the modulo). The share's compute
    nodes, or all its nodes if it has none."""
    return [n for n in share if roles[n] == "compute"] or list(share)


def restrict(topo: Topology, cpus: set[int]) -> Topology:
    """The topology as the job sees it: only the CPUs Slurm gave it."""
    keep = set(topo.online_cpus) & cpus
    if not keep:
        raise InputError(
            "job CPUs", f"none of {sorted(cpus)} is online here", "check the Slurm node's CPUs"
        )
    packages = tuple(
        Package(
            id=p.id,
            numa_nodes=p.numa_nodes,
            cores=tuple(
                Core(id=c.id, cpus=tuple(x for x in c.cpus if x in keep))
                for c in p.cores
                if any(x in keep for x in c.cpus)
            ),
        )
        for p in topo.packages
    )
    nodes = tuple(
        NumaNode(
            id=n.id,
            cpus=tuple(x for x in n.cpus if x in keep),
            memory_mib=n.memory_mib,
            free_mib=n.free_mib,
            hugepages=n.hugepages,
        )
        for n in topo.numa_nodes
    )
    return Topology(
        packages=tuple(p for p in packages if p.cores),
        numa_nodes=nodes,
        online_cpus=tuple(sorted(keep)),
        notes=topo.notes,
    )


def job_hosts(nodelist: str) -> list[str]:
    """The job's hosts in Slurm's order, from its node list (``n[1-3],gpu07``)."""
    return [str(h) for h in hostlist.expand_hostlist(nodelist)] if nodelist else []


def share_overlay(
    spec: Spec, job: int, index: int, hosts: Sequence[str], addresses: Sequence[str], mtu: int
) -> Overlay:
    """How host ``index`` of a job joins the job's cluster network: the job's VNI,
    every other host's fabric address with the (name, ip, mac) of its share's
    nodes, and the node MTU the fabric's ``mtu`` leaves. The gateway address
    lives on the first host only; the others' bridges get addresses from the
    top of the subnet, which no node may reach."""
    shares = split(spec, len(hosts))
    net = spec.network.network
    where = {w.name: w.index for w, _ in expand(spec)}
    remotes = tuple(
        Vtep(
            host=hosts[i],
            address=addresses[i],
            nodes=tuple(
                (n, node_ip(net, where[n]), node_mac(share_name(job, i), net, where[n]))
                for n in shares[i]
            ),
        )
        for i in range(len(hosts))
        if i != index
    )
    lowest = min(
        (ipaddress.IPv4Address(host_address(net, i)) for i in range(1, len(hosts))), default=None
    )
    last = ipaddress.IPv4Address(node_ip(net, max(where.values())))
    if lowest is not None and last >= lowest:
        raise InputError(
            f"network.subnet = {net}",
            f"too small for {len(where)} nodes and the addresses of {len(hosts)} hosts",
            "give the spec a larger subnet",
        )
    return Overlay(
        vni=vni_for(f"slurm-job-{job}"),
        local=addresses[index],
        remotes=remotes,
        mtu=node_mtu(mtu, spec.network.mtu),
        bridge_address=host_address(net, index),
        key_id=f"slurm-job-{job}",  # every host of the job: one VM agent key
    )


def hosts_text(spec: Spec, job: int) -> str:
    """/etc/hosts for every node of the whole cluster, not only this share's."""
    lines = ["127.0.0.1\tlocalhost", f"# hpvc cluster {spec.name} of Slurm job {job}"]
    lines += [f"{node_ip(spec.network.network, w.index)}\t{w.name}" for w, _ in expand(spec)]
    return "\n".join(lines) + "\n"

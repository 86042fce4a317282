"""The planner's invariants, checked on any plan (used by property tests)."""

from __future__ import annotations

from collections import Counter

from hpvc.plan.model import Plan, Reservations
from hpvc.plan.place import node_huge_mib
from hpvc.topology.model import Topology


def check_plan(
    plan: Plan, hosts: dict[str, Topology], res: Reservations | None = None, scaled: bool = False
) -> None:
    """``scaled``: the plan kept running nodes, so pools grow only for the new ones."""
    res = res or Reservations()
    _check_cpus(plan, hosts, res)
    _check_memory(plan, hosts, scaled)
    _check_partitions(plan, hosts, res)
    _check_addresses(plan)


def _check_cpus(plan: Plan, hosts: dict[str, Topology], res: Reservations) -> None:
    for host, topo in hosts.items():
        r = res.for_host(host)
        online = set(topo.online_cpus)
        cpu_node = topo.cpu_node()
        nodes = [n for n in plan.nodes if n.host == host]
        pinned = [v.pcpu for n in nodes if n.pinning == "dedicated" for v in n.vcpus]
        dup = [c for c, k in Counter(pinned).items() if k > 1]
        assert not dup, f"host CPUs {dup} pinned twice on {host}"
        pinned_set = {c for c in pinned if c is not None}
        assert pinned_set <= online, "pinned to an offline or unknown CPU"
        assert not pinned_set & (r.dedicated_cpus | r.shared_cpus), "pinned over another cluster"
        for n in nodes:
            assert len(n.vcpus) == len({v.vcpu for v in n.vcpus})
            assert set(n.cpuset) <= online
            assert not set(n.emulator_cpus) & pinned_set, f"{n.name}: emulator on a pinned CPU"
            assert not set(n.emulator_cpus) & r.dedicated_cpus
            if n.kind == "vm":
                assert n.emulator_cpus, f"{n.name}: VM without emulator CPUs"
            if n.pinning == "dedicated":
                assert all(v.pcpu is not None for v in n.vcpus)
                assert sorted(v.pcpu for v in n.vcpus if v.pcpu is not None) == list(n.cpuset)
            else:
                assert all(v.pcpu is None for v in n.vcpus)
                assert not set(n.cpuset) & pinned_set, f"{n.name}: floats over pinned CPUs"
                assert not set(n.cpuset) & r.dedicated_cpus
            cells = {c.guest_node: c for c in n.numa}
            for v in n.vcpus:
                assert v.guest_node in cells, f"{n.name}: vCPU {v.vcpu} in a missing cell"
                if v.pcpu is not None and len(n.numa) > 1:
                    host_node = cells[v.guest_node].host_node
                    assert cpu_node[v.pcpu] == host_node, (
                        f"{n.name}: vCPU {v.vcpu} on CPU {v.pcpu} of node {cpu_node[v.pcpu]},"
                        f" its memory cell is on node {host_node}"
                    )
            for c in n.numa:
                assert list(c.vcpus) == [v.vcpu for v in n.vcpus if v.guest_node == c.guest_node]


def _check_memory(plan: Plan, hosts: dict[str, Topology], scaled: bool) -> None:
    need: Counter[tuple[str, int, int]] = Counter()
    for n in plan.nodes:
        assert sum(c.memory_mib for c in n.numa) == n.memory_mib, f"{n.name}: cells != memory"
        assert len({c.host_node for c in n.numa}) == len(n.numa), "two cells on one host node"
        if n.hugepages:
            page_mib = n.hugepages.size_kib // 1024
            huge = n.hugepages.count * page_mib
            # A VM's guest RAM is all hugepages; a container keeps normal memory too.
            if n.kind == "vm":
                assert huge == n.memory_mib, f"{n.name}: guest RAM not all hugepages"
            else:
                assert 0 < huge < n.memory_mib, f"{n.name}: no normal memory left"
            shares = node_huge_mib(n)
            assert sum(shares) == huge, f"{n.name}: cells' hugepages != the node's"
            for c, mib in zip(n.numa, shares, strict=True):
                assert c.memory_mib % page_mib == 0, f"{n.name}: cell not whole pages"
                assert mib % page_mib == 0 and 0 <= mib <= c.memory_mib, f"{n.name}: {mib}"
                need[(n.host, c.host_node, n.hugepages.size_kib)] += mib // page_mib
    listed = {(h.name, g.host_node, g.size_kib): g for h in plan.hosts for g in h.hugepages}
    assert set(listed) == set(need), "host hugepage list differs from the nodes' needs"
    for key, count in need.items():
        host, node_id, size = key
        node = hosts[host].node(node_id)
        pool = node.pool(size)
        assert pool is not None
        g = listed[key]
        assert g.count == count and g.free == pool.free
        if scaled:
            assert 0 <= g.grow <= count
        else:
            assert g.grow == max(0, count - pool.free)
        growable = node.free_mib // (size // 1024)
        assert count <= pool.free + growable, f"{key}: {count} pages, only {pool.free}+{growable}"


def _check_partitions(plan: Plan, hosts: dict[str, Topology], res: Reservations) -> None:
    for h in plan.hosts:
        topo = hosts[h.name]
        pkg = topo.cpu_package()
        r = res.for_host(h.name)
        used = {pkg[c] for n in plan.nodes if n.host == h.name for c in n.cpuset}
        if plan.nodes[0].partition == "hpc":
            assert used <= set(h.hpc_packages), "hpc node outside the cluster's sockets"
            taken = r.hpc_packages | r.commodity_packages
            taken |= {pkg[c] for c in r.dedicated_cpus | r.shared_cpus if c in pkg}
            assert not set(h.hpc_packages) & taken, "hpc socket shared with another cluster"
        else:
            assert not used & r.hpc_packages, "commodity node on another cluster's hpc socket"
            assert h.hpc_packages == ()


def _check_addresses(plan: Plan) -> None:
    assert len({n.ip for n in plan.nodes}) == len(plan.nodes)
    assert len({n.mac for n in plan.nodes}) == len(plan.nodes)
    assert len({n.name for n in plan.nodes}) == len(plan.nodes)
    placed = sorted(x for h in plan.hosts for x in h.nodes)
    assert placed == sorted(n.name for n in plan.nodes)

"""Planner behaviour on hand-made topologies: each rule of docs/planning.md."""

from __future__ import annotations

from typing import Any

import pytest

from hpvc.errors import DoesNotFit
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.model import HugepageNeed
from hpvc.plan.reservations import reservations_from_plans
from hpvc.spec import parse_spec
from hpvc.topology.model import Topology
from tests.unit.invariants import check_plan
from tests.unit.topogen import make_topology


def spec(nodes: list[dict[str, Any]], **top: Any) -> Any:
    tuning = {"pinning": "dedicated", "hugepages": "2M", "numa": "mirror", "partition": "hpc"}
    tuning.update(top.pop("tuning", {}))
    return parse_spec({"name": "t", "kind": "container", "tuning": tuning, "nodes": nodes, **top})


def plan_on(s: Any, *topos: Topology, res: Any = None) -> Plan:
    hosts = [(f"h{i}", t) for i, t in enumerate(topos)]
    p = plan_cluster(s, hosts, res)
    check_plan(p, dict(hosts), res)
    return p


def test_siblings_stay_together_and_one_numa_node() -> None:
    topo = make_topology(packages=2, cores_per_node=4, threads=2, pages_2m_free=4096)
    p = plan_on(spec([{"role": "compute", "vcpus": 4, "memory": "2GiB"}]), topo)
    n = p.nodes[0]
    assert len(n.numa) == 1
    cores = {c.cpus for pkg in topo.packages for c in pkg.cores}
    touched = [c for c in cores if set(c) & set(n.cpuset)]
    assert len(touched) == 2 and all(set(c) <= set(n.cpuset) for c in touched)


def test_odd_vcpus_reuse_a_split_core_before_breaking_another() -> None:
    topo = make_topology(packages=1, cores_per_node=4, threads=2)
    p = plan_on(spec([{"role": "compute", "count": 2, "vcpus": 3, "memory": "1GiB"}]), topo)
    a, b = (set(n.cpuset) for n in p.nodes)
    split = [c for c in topo.packages[0].cores if set(c.cpus) & a and set(c.cpus) & b]
    assert len(split) == 1  # 3+3 on 4 two-thread cores: exactly one core is shared


def test_large_node_spans_nodes_of_one_socket_first() -> None:
    topo = make_topology(packages=2, nodes_per_package=2, cores_per_node=2, threads=1)
    p = plan_on(spec([{"role": "compute", "vcpus": 4, "memory": "4GiB"}]), topo)
    n = p.nodes[0]
    assert [c.host_node for c in n.numa] == [0, 1]  # both nodes of socket 0
    assert [c.memory_mib for c in n.numa] == [2048, 2048]
    assert [v.guest_node for v in n.vcpus] == [0, 0, 1, 1]


def test_memory_split_follows_vcpus_in_whole_pages() -> None:
    topo = make_topology(packages=1, nodes_per_package=2, cores_per_node=2, threads=1)
    p = plan_on(
        spec([{"role": "compute", "vcpus": 3, "memory": "3GiB"}], tuning={"hugepages": "1G"}),
        topo,
    )
    assert sorted(c.memory_mib for c in p.nodes[0].numa) == [1024, 2048]


def test_numa_none_gives_one_cell_on_the_home_node() -> None:
    topo = make_topology(packages=1, nodes_per_package=2, cores_per_node=2, threads=1)
    p = plan_on(
        spec([{"role": "compute", "vcpus": 3, "memory": "2GiB"}], tuning={"numa": "none"}), topo
    )
    n = p.nodes[0]
    assert len(n.numa) == 1 and n.numa[0].memory_mib == 2048
    assert {v.guest_node for v in n.vcpus} == {0}


def test_does_not_fit_says_what_is_short() -> None:
    topo = make_topology(packages=2, cores_per_node=2, threads=2)  # 8 CPUs
    with pytest.raises(DoesNotFit) as e:
        plan_on(spec([{"role": "compute", "vcpus": 12, "memory": "1GiB"}]), topo)
    assert e.value.exit_code == 2
    assert "compute0 needs 12 dedicated CPUs on one host, host 'h0' has 8 free" in e.value.why


def test_memory_shortage_is_named() -> None:
    topo = make_topology(packages=1, memory_mib=4096, free_mib=1024)
    with pytest.raises(DoesNotFit) as e:
        plan_on(spec([{"role": "compute", "vcpus": 1, "memory": "2GiB"}], kind="vm"), topo)
    assert "needs 2GiB of 2M hugepages" in e.value.why and "at most 1GiB" in e.value.why
    with pytest.raises(DoesNotFit) as e:
        plan_on(spec([{"role": "compute", "vcpus": 1, "memory": "2GiB"}]), topo)
    assert "needs 2GiB of memory on" in e.value.why and "at most 1GiB" in e.value.why
    half = {"role": "compute", "vcpus": 1, "memory": "2GiB", "hugepage_memory": "1GiB"}
    with pytest.raises(DoesNotFit) as e:
        plan_on(spec([half]), topo)
    assert "needs 2GiB of memory (1GiB of it 2M hugepages)" in e.value.why


def test_missing_1g_pool_is_named() -> None:
    topo = make_topology(packages=1, with_1g=False)
    one_g = {"hugepages": "1G"}
    with pytest.raises(DoesNotFit, match="no host has a 1G hugepage pool"):
        plan_on(spec([{"role": "compute", "memory": "1GiB"}], tuning=one_g, kind="vm"), topo)
    # A container node without hugepage memory needs no pool at all.
    p = plan_on(spec([{"role": "compute", "memory": "1GiB"}], tuning=one_g), topo)
    assert p.nodes[0].hugepages is None and p.hosts[0].hugepages == ()


def test_hugepage_pool_growth_per_node() -> None:
    topo = make_topology(packages=2, cores_per_node=2, threads=1, pages_2m_free=10)
    group = {"role": "compute", "count": 2, "vcpus": 2, "memory": "1536MiB"}
    p = plan_on(spec([{**group, "hugepage_memory": "1GiB"}]), topo)
    need = {(g.host_node, g.size_kib): (g.count, g.free, g.grow) for g in p.hosts[0].hugepages}
    assert need == {(0, 2048): (512, 10, 502), (1, 2048): (512, 10, 502)}
    assert [n.hugepages for n in p.nodes] == [HugepageNeed(2048, 512)] * 2


def test_container_normal_and_hugepage_memory_both_count() -> None:
    """Issue 25 item 4: a container node's memory is normal memory plus its
    hugepage_memory, never each of them in full; the planner counts both."""
    group = {"role": "compute", "vcpus": 1, "memory": "2GiB", "hugepage_memory": "1GiB"}
    # 1 GiB of pool pages free, 512 MiB of free memory: the normal GiB does not fit.
    short = make_topology(packages=1, memory_mib=4096, free_mib=512, pages_2m_free=512)
    with pytest.raises(DoesNotFit, match="needs 2GiB of memory"):
        plan_on(spec([group]), short)
    roomy = make_topology(packages=1, memory_mib=4096, free_mib=1024, pages_2m_free=512)
    p = plan_on(spec([group]), roomy)
    (n,) = p.nodes
    assert (n.memory_mib, n.hugepage_mib, n.normal_mib) == (2048, 1024, 1024)
    (g,) = p.hosts[0].hugepages
    assert (g.count, g.free, g.grow) == (512, 512, 0)
    # A second such node: the pool is taken, and the free memory too.
    with pytest.raises(DoesNotFit):
        plan_on(spec([{**group, "count": 2}]), roomy)


def test_hpc_sockets_are_exclusive_between_clusters() -> None:
    topo = make_topology(packages=2, cores_per_node=4, threads=1)
    hosts = {"h0": topo}
    a = plan_on(spec([{"role": "compute", "vcpus": 2, "memory": "1GiB"}]), topo)
    assert a.hosts[0].hpc_packages == (0,)
    res = reservations_from_plans([a], hosts)
    # A commodity cluster may only use socket 1, even though socket 0 has 2 free CPUs.
    com = spec(
        [{"role": "compute", "vcpus": 2, "memory": "1GiB"}], tuning={"partition": "commodity"}
    )
    b = plan_on(com, topo, res=res)
    assert set(b.nodes[0].cpuset) <= set(topo.packages[1].cpus)
    # Socket 1 now carries commodity work: a second hpc cluster has no whole socket left.
    res2 = reservations_from_plans([a, b], hosts)
    with pytest.raises(DoesNotFit, match="partition hpc"):
        plan_on(spec([{"role": "compute", "vcpus": 1, "memory": "1GiB"}]), topo, res=res2)


def test_vm_emulator_threads_stay_off_pinned_cpus() -> None:
    topo = make_topology(packages=1, cores_per_node=4, threads=1)
    p = plan_on(spec([{"role": "compute", "vcpus": 3, "memory": "1GiB"}], kind="vm"), topo)
    n = p.nodes[0]
    assert set(n.emulator_cpus) == set(topo.online_cpus) - set(n.cpuset)
    with pytest.raises(DoesNotFit, match="plus one for emulator threads"):
        plan_on(spec([{"role": "compute", "vcpus": 4, "memory": "1GiB"}], kind="vm"), topo)


def test_shared_nodes_float_over_unpinned_cpus_only() -> None:
    topo = make_topology(packages=1, cores_per_node=4, threads=1)
    s = spec(
        [
            {"role": "head", "vcpus": 2, "memory": "1GiB", "pinning": "shared"},
            {"role": "compute", "count": 3, "vcpus": 1, "memory": "1GiB"},
        ]
    )
    p = plan_on(s, topo)
    head = p.node("head0")
    pinned = {c for n in p.nodes if n.pinning == "dedicated" for c in n.cpuset}
    assert head.cpuset and not set(head.cpuset) & pinned
    assert all(v.pcpu is None for v in head.vcpus)


def test_hosts_fill_first_fit_and_locality_map() -> None:
    topo = make_topology(packages=1, cores_per_node=4, threads=1)
    s = spec(
        [{"role": "compute", "count": 6, "vcpus": 2, "memory": "1GiB"}],
        tuning={"partition": "commodity"},
    )
    p = plan_on(s, topo, topo, topo)
    assert p.locality() == {
        "h0": ["compute0", "compute1"],
        "h1": ["compute2", "compute3"],
        "h2": ["compute4", "compute5"],
    }


def test_names_addresses_and_bridge() -> None:
    topo = make_topology()
    s = spec(
        [
            {"role": "head", "vcpus": 1, "memory": "1GiB"},
            {"role": "compute", "count": 2, "vcpus": 1, "memory": "1GiB"},
        ],
        network={"subnet": "10.88.0.0/24", "mtu": 9000},
    )
    p = plan_on(s, topo)
    assert [(n.name, n.ip) for n in p.nodes] == [
        ("head0", "10.88.0.2"),
        ("compute0", "10.88.0.3"),
        ("compute1", "10.88.0.4"),
    ]
    assert p.network.gateway == "10.88.0.1" and p.network.bridge == "hpvc-t"
    assert all(int(n.mac.split(":")[0], 16) & 0b11 == 0b10 for n in p.nodes)  # local unicast


def test_plan_json_has_the_documented_keys() -> None:
    p = plan_on(
        spec([{"role": "compute", "vcpus": 2, "memory": "1GiB"}], kind="vm"), make_topology()
    )
    j = p.to_json()
    assert {"cluster", "nodes", "hosts"} <= set(j)
    node_keys = {"name", "role", "kind", "host", "partition", "vcpus", "emulator_cpus", "numa"}
    node_keys |= {"memory_mib", "hugepages", "mac", "ip"}
    assert node_keys <= set(j["nodes"][0])
    assert set(j["nodes"][0]["vcpus"][0]) == {"vcpu", "pcpu", "guest_node"}
    assert {"guest_node", "host_node", "memory_mib"} <= set(j["nodes"][0]["numa"][0])
    assert set(j["nodes"][0]["hugepages"]) == {"size_kib", "count"}
    assert {"name", "hugepages"} <= set(j["hosts"][0])
    assert {"host_node", "size_kib", "count"} <= set(j["hosts"][0]["hugepages"][0])


def test_scaling_keeps_running_nodes_and_adds_new_ones() -> None:
    topo = make_topology(packages=2, cores_per_node=4, threads=1, pages_2m_free=100)
    huge = {"memory": "1536MiB", "hugepage_memory": "1GiB"}
    base = [
        {"role": "head", "vcpus": 1, "pinning": "shared", **huge},
        {"role": "compute", "count": 2, "vcpus": 2, **huge},
    ]
    first = plan_on(spec(base), topo)
    grown = [base[0], {**base[1], "count": 3}]
    second = plan_cluster(spec(grown), [("h0", topo)], existing=first)
    check_plan(second, {"h0": topo}, scaled=True)
    for n in first.nodes:  # running nodes keep cells and addresses, pinned ones CPUs
        kept = second.node(n.name)
        assert (kept.ip, kept.mac, kept.numa) == (n.ip, n.mac, n.numa)
        if n.pinning == "dedicated":
            assert kept == n
    new = second.node("compute2")
    head = second.node("head0")  # the floating head gave up the CPUs compute2 took
    assert set(head.cpuset) == set(first.node("head0").cpuset) - set(new.cpuset)
    assert new.ip == "10.88.0.5" and not set(new.cpuset) & set(first.node("compute0").cpuset)
    # Pool: 100 free pages. The running nodes (3 GiB = 1536 pages) already use
    # them all, so the new 512 pages all have to be grown.
    g = {h.host_node: h for h in second.hosts[0].hugepages}
    assert sum(h.count for h in g.values()) == 2048 and sum(h.grow for h in g.values()) == 512
    shrunk = [base[0], {**base[1], "count": 1}]
    third = plan_cluster(spec(shrunk), [("h0", topo)], existing=second)
    assert [n.name for n in third.nodes] == ["head0", "compute0"]
    assert third.node("compute0") == first.node("compute0")


def test_plan_json_round_trip() -> None:
    from hpvc.plan.model import plan_from_json

    s = spec(
        [
            {"role": "head", "vcpus": 2, "memory": "1GiB", "pinning": "shared"},
            {"role": "compute", "count": 2, "vcpus": 3, "memory": "2GiB", "io": {"weight": 10}},
        ],
        kind="vm",
    )
    p = plan_on(s, make_topology(packages=2, nodes_per_package=2, cores_per_node=2))
    assert plan_from_json(p.to_json()) == p


def test_pages_held_follow_the_hugepage_memory_and_older_plans_still_load() -> None:
    """The pool grows by a container node's hugepage memory only, split over its
    cells; a plan of an older hpvc (all of a container's memory in pages) loads,
    holds what it held, and keeps its whole memory as its limit."""
    from hpvc.backends.crun.backend import cluster_memory
    from hpvc.cluster.pages import held_by_plan
    from hpvc.plan.model import plan_from_json

    topo = make_topology(packages=2, cores_per_node=3, threads=1)
    group = {"role": "compute", "vcpus": 4, "memory": "3GiB", "hugepage_memory": "1GiB"}
    p = plan_on(spec([group, {"role": "head", "memory": "512MiB", "pinning": "shared"}]), topo)
    node = p.node("compute0")
    assert [(c.host_node, c.memory_mib) for c in node.numa] == [(0, 2304), (1, 768)]
    # 1 GiB of pages split like the cells' memory: 3/4 and 1/4.
    assert held_by_plan(p, "h0") == {(0, 2048): 384, (1, 2048): 128}
    assert cluster_memory(p) == (2048 + 512, {2048: 1024})
    again = plan_from_json(p.to_json())
    assert again == p and again.node("compute0").normal_mib == 2048

    old = p.to_json()
    for n in old["nodes"]:  # as an hpvc before hugepage_memory planned them
        n["hugepages"] = {"size_kib": 2048, "count": n["memory_mib"] // 2}
    before = plan_from_json(old)
    head = before.node("head0").numa[0].host_node
    held = {(0, 2048): 1152, (1, 2048): 384}
    held[head, 2048] += 256
    assert held_by_plan(before, "h0") == held
    assert [n.normal_mib for n in before.nodes] == [3072, 512]
    assert cluster_memory(before) == (3584, {2048: 3584})

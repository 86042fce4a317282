"""Synthetic host topologies for planner tests (and a hypothesis strategy)."""

from __future__ import annotations

from hypothesis import strategies as st

from hpvc.topology.model import Core, HugePool, NumaNode, Package, Topology


def make_topology(
    packages: int = 2,
    nodes_per_package: int = 1,
    cores_per_node: int = 4,
    threads: int = 2,
    memory_mib: int = 16384,
    free_mib: int | None = None,
    pages_2m_free: int = 0,
    with_1g: bool = True,
    pages_1g_free: int = 0,
    node_stride: int = 1,
    interleaved: bool = True,
    offline: frozenset[int] = frozenset(),
) -> Topology:
    """A uniform machine. ``interleaved``: sibling threads numbered far apart (Intel style)."""
    total_cores = packages * nodes_per_package * cores_per_node
    pkgs: list[Package] = []
    numa: list[NumaNode] = []
    core_index = 0
    for p in range(packages):
        cores: list[Core] = []
        node_ids: list[int] = []
        for k in range(nodes_per_package):
            node_id = (p * nodes_per_package + k) * node_stride
            node_cpus: list[int] = []
            for c in range(cores_per_node):
                if interleaved:
                    cpus = [core_index + t * total_cores for t in range(threads)]
                else:
                    cpus = [core_index * threads + t for t in range(threads)]
                cpus = [x for x in cpus if x not in offline]
                if cpus:
                    cores.append(Core(id=k * cores_per_node + c, cpus=tuple(cpus)))
                node_cpus.extend(cpus)
                core_index += 1
            pools = [HugePool(2048, pages_2m_free, pages_2m_free)]
            if with_1g:
                pools.append(HugePool(1048576, pages_1g_free, pages_1g_free))
            numa.append(
                NumaNode(
                    id=node_id,
                    cpus=tuple(sorted(node_cpus)),
                    memory_mib=memory_mib,
                    free_mib=memory_mib if free_mib is None else free_mib,
                    hugepages=tuple(pools),
                )
            )
            node_ids.append(node_id)
        pkgs.append(Package(id=p, numa_nodes=tuple(node_ids), cores=tuple(cores)))
    online = tuple(sorted(c for n in numa for c in n.cpus))
    return Topology(packages=tuple(pkgs), numa_nodes=tuple(numa), online_cpus=online)


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    packages = draw(st.integers(1, 4))
    npp = draw(st.integers(1, 2))
    cores = draw(st.integers(1, 6))
    threads = draw(st.integers(1, 2))
    total = packages * npp * cores * threads
    offline = draw(st.frozensets(st.integers(0, total - 1), max_size=2))
    memory = draw(st.sampled_from([4096, 8192, 32768]))
    return make_topology(
        packages=packages,
        nodes_per_package=npp,
        cores_per_node=cores,
        threads=threads,
        memory_mib=memory,
        free_mib=draw(st.integers(memory // 4, memory)),
        pages_2m_free=draw(st.integers(0, 1024)),
        with_1g=draw(st.booleans()),
        pages_1g_free=draw(st.integers(0, 2)),
        node_stride=draw(st.sampled_from([1, 3])),
        interleaved=draw(st.booleans()),
        offline=offline,
    )


@st.composite
def specs(draw: st.DrawFn) -> dict[str, object]:
    groups = []
    for role in draw(
        st.lists(st.sampled_from(["head", "compute", "storage"]), min_size=1, max_size=3)
    ):
        g: dict[str, object] = {
            "role": role,
            "count": draw(st.integers(0, 4)),
            "vcpus": draw(st.integers(1, 8)),
            "memory": f"{draw(st.integers(1, 6))}GiB",
        }
        if draw(st.booleans()):
            g["pinning"] = draw(st.sampled_from(["dedicated", "shared"]))
        groups.append(g)
    if all(g["count"] == 0 for g in groups):
        groups[0]["count"] = 1
    kind = draw(st.sampled_from(["container", "vm"]))
    hugepages = draw(st.sampled_from(["none", "2M", "1G"]))
    if kind == "container" and hugepages != "none":
        for g in groups:  # some of a container node's memory in hugepages (whole GiB)
            gib = int(str(g["memory"]).removesuffix("GiB"))
            if gib > 1 and draw(st.booleans()):
                g["hugepage_memory"] = f"{draw(st.integers(1, gib - 1))}GiB"
    return {
        "name": draw(st.sampled_from(["a", "b", "hpc-x"])),
        "kind": kind,
        "tuning": {
            "pinning": draw(st.sampled_from(["dedicated", "shared"])),
            "hugepages": hugepages,
            "numa": draw(st.sampled_from(["mirror", "none"])),
            "partition": draw(st.sampled_from(["hpc", "commodity"])),
        },
        "nodes": groups,
    }

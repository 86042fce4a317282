"""``hpvc status``: a cluster's nodes, states, addresses and limits, read back now.

Kept apart from hpvc.cluster.ops and hpvc.cluster.lifecycle so that a status
loads only what it reads (issue 33 item 4: every command within Python's own
start + 0.06 s): the record, the plan's classes, the cluster's backend, the
cgroup and procfs readers and netlink for the nodes' links. Not the spec's
schema (pydantic), the planner, the renderers or what ``up`` and ``run``
need; the network across hosts (VXLAN) and Spark are imported only by the
clusters that have them. What it reads is the kernel's, never what the
record hopes (docs/architecture.md: a backend's ``node_status`` and
``summary`` read back from the runtime and the kernel): node processes
from the runtime, pools from the kernel, and whether the ``up``/``scale``/
``down`` a record says is under way still runs (its holder of the cluster's
lock).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpvc.backends import registry
from hpvc.backends.base import Backend, ClusterEnv
from hpvc.cluster.listing import under_way
from hpvc.errors import HpvcError
from hpvc.host import hugepages
from hpvc.store import ClusterRecord, Store

if TYPE_CHECKING:
    from hpvc.plan import Plan, PlannedNode


def open_env(store: Store, rec: ClusterRecord) -> tuple[Backend, ClusterEnv]:
    """A cluster's backend and the typed view of its state on this host."""
    backend = registry.get(rec.backend or _legacy_backend(rec))
    return backend, ClusterEnv(store, rec, backend.load_state(rec.backend_state))


def _legacy_backend(rec: ClusterRecord) -> str:
    """Records written before backends were named: the backend their spec asks for."""
    from hpvc.spec import parse_spec  # the schema: only such old records pay for it

    return registry.name_for(parse_spec(rec.spec, rec.spec_path))


def open_cluster(name: str, store: Store | None) -> tuple[Backend, ClusterEnv, Plan]:
    """A cluster's backend, its typed state on this host and its plan."""
    store = store or Store()
    backend, env = open_env(store, store.get(name))
    return backend, env, env.rec.the_plan()


def _node_status(
    backend: Backend, env: ClusterEnv, plan: Plan, node: PlannedNode
) -> dict[str, Any]:
    return {
        "name": node.name,
        "role": node.role,
        "host": node.host,
        "planned": {"cpus": list(node.cpuset), "memory_mib": node.memory_mib, "ip": node.ip},
        **backend.node_status(env, plan, node),
    }


def _pools(plan: Plan) -> list[dict[str, Any]]:
    """The host pools the plan draws on, as the kernel counts them now."""
    out = []
    for h in plan.hosts:
        for g in h.hugepages:
            try:
                total, free = hugepages.pool_state(g.host_node, g.size_kib)
            except (OSError, HpvcError):
                total = free = -1
            out.append(
                {
                    "host": h.name,
                    "host_node": g.host_node,
                    "size_kib": g.size_kib,
                    "planned": g.count,
                    "total": total,
                    "free": free,
                    "in_use": total - free if total >= 0 else None,
                }
            )
    return out


def _across_hosts(name: str, overlay: dict[str, Any] | None) -> dict[str, Any] | None:
    """The cluster network across hosts: as planned, and as the kernel has it."""
    if not overlay or not overlay.get("remotes"):
        return None
    from hpvc.host import vxlan  # only clusters across hosts pay its import

    try:
        kernel = vxlan.read_back(name, int(overlay["vni"]))
    except (OSError, HpvcError) as e:
        kernel = {"error": str(e)}
    return {
        "vni": overlay["vni"],
        "local": overlay["local"],
        "hosts": [r["address"] for r in overlay["remotes"]],
        "kernel": kernel,
    }


def _shared_dir(env: ClusterEnv) -> dict[str, Any] | None:
    """The directory every node sees at /shared, where the backend made one (a
    backend that shares none, VMs, says ``"shared_dir": None`` in its summary)."""
    host = env.dir / "shared"
    return {"server": "host", "path": "/shared", "host": str(host)} if host.is_dir() else None


def _spark(plan: Plan) -> dict[str, Any]:
    """A Spark cluster's master and live workers (read from the master itself)."""
    if plan.spark is None:
        return {}
    from hpvc.cluster import spark  # only Spark clusters pay its import

    return {"spark": spark.status(plan)}


def status(name: str, store: Store | None = None) -> dict[str, Any]:
    """Nodes, states, addresses and limits as the kernel reports them now."""
    store = store or Store()
    backend, env, plan = open_cluster(name, store)
    rec = env.rec
    return {
        "cluster": name,
        "status": rec.status,
        **under_way(store, rec),
        "kind": plan.kind,
        "image": plan.image,
        "image_digests": rec.image_digests(),  # digest -> its nodes (hpvc.cluster.images)
        "bridge": plan.network.bridge,
        "subnet": plan.network.subnet,
        "mtu": plan.network.mtu,
        "locality": rec.spec.get("tuning", {}).get("locality", "shm"),
        "up_seconds": rec.up_seconds,
        "phases": rec.phases,
        "shared_dir": _shared_dir(env),
        "hugepages": _pools(plan),
        "accelerator": None,
        "accelerator_warning": None,
        **backend.summary(env),
        "across_hosts": _across_hosts(rec.name, rec.overlay),
        **_spark(plan),
        "nodes": [_node_status(backend, env, plan, n) for n in plan.nodes],
    }

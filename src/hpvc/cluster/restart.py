"""Bring nodes of a running cluster back: ``hpvc restart`` (issue 17, point 7).

A node whose container init or QEMU died stays dead until someone restarts it:
the rest of the cluster runs on. ``restart`` takes the cluster's lock (as
``up``, ``scale`` and ``down`` do), undoes what is left of each chosen node
(its journal: the dead container or domain, its netns and veth or tap, its
root or disk, its folder; ``Backend.stop``), then starts it again through the
backend from the record's plan (``Backend.start``, as ``scale`` starts a new
node). So the node keeps its name, address, MAC, CPU pinning, NUMA binding,
hugepages and limits; it boots from the image again, so what it had written
to its own root or disk is gone (``/shared`` and the cluster's files stay).

What the cluster shares (bridge, hosts file, cgroup parent, namespace holder
and /dev/shm, ivshmem region, VXLAN, hugepage pools) is in the cluster's
journal and is left alone. The other nodes need no refresh: the restarted node
has the same MAC and address, so their /etc/hosts and static ARP entries
still fit, and the backend gives the restarted node both (containers through
the bind-mounted hosts file and ``wire_node``, VMs from their kernel command
line at boot).

Which nodes: the ones named; with none, every node that does not run. A named
node that runs is left as it is (and said so) unless ``force``. If a node
cannot start, every node this restart was bringing back is left stopped (its
host changes undone, so a second ``restart`` starts clean) and the error says
why; nodes that were not chosen are never touched, and the record stays
``running`` throughout (the lock, not the status, says a restart is under way).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hpvc.backends.base import Backend, ClusterEnv
from hpvc.cluster import images
from hpvc.cluster.lifecycle import open_env, start_services, stopped_by
from hpvc.cluster.teardown import waiting
from hpvc.coordinator import after_change
from hpvc.errors import HpvcError, InputError
from hpvc.plan import Plan
from hpvc.progress import Progress, quiet
from hpvc.store import Store


@dataclass(frozen=True)
class NodeRestart:
    """What ``restart`` did with one node."""

    node: str
    was: str  # its state before: running, stopped, created, missing
    restarted: bool  # False: it ran and was left as it is (no ``force``)
    state: str  # its state afterwards, read back from the runtime

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def restart(
    name: str,
    nodes: list[str] | None = None,
    store: Store | None = None,
    progress: Progress = quiet,
    *,
    force: bool = False,
) -> list[NodeRestart]:
    """Restart the named nodes of a running cluster (none named: every node that
    does not run); a node that runs only with ``force``. One entry per node
    considered, in the plan's order."""
    store = store or Store()
    with store.cluster_lock(name, "hpvc restart", waiting(name, progress)):
        return _restart_locked(name, list(nodes or []), store, progress, force)


def _check_names(plan: Plan, name: str, nodes: list[str]) -> None:
    known = [n.name for n in plan.nodes]
    unknown = [n for n in nodes if n not in known]
    if unknown:
        raise InputError(
            f"node {unknown[0]!r}", f"not in cluster {name!r}", f"one of: {', '.join(known)}"
        )


def _restart_locked(
    name: str, nodes: list[str], store: Store, progress: Progress, force: bool
) -> list[NodeRestart]:
    rec = store.get(name)
    if rec.status != "running":
        fix = f"only a running cluster's nodes restart; see hpvc status {name}"
        raise InputError(f"cluster {name!r}", f"is {rec.status}", fix)
    plan = rec.the_plan()
    _check_names(plan, name, nodes)
    backend, env = open_env(store, rec)
    considered = [n.name for n in plan.nodes if not nodes or n.name in nodes]
    was = {n: backend.node_state(env, plan, plan.node(n)) for n in considered}
    chosen = [n for n in considered if was[n] != "running" or (force and nodes)]
    for n in considered if nodes else []:  # (unnamed, the running nodes go unsaid)
        if n not in chosen:
            progress(f"node {n} runs: left as it is (--force restarts it)")
    if chosen:
        _bring_back(env, backend, plan, chosen, was, progress)
    return [
        NodeRestart(n, was[n], n in chosen, backend.node_state(env, plan, plan.node(n)))
        for n in considered
    ]


def _bring_back(
    env: ClusterEnv,
    backend: Backend,
    plan: Plan,
    names: list[str],
    was: dict[str, str],
    progress: Progress,
) -> None:
    """Undo what is left of ``names``, start them again; on failure leave them stopped."""
    for n in names:
        progress(f"node {n} is {was[n]}: restarting")
    backend.stop(env, plan, names, quiet)  # what is left of them (no line per undo)
    images.record(env.rec, names)  # they start from what the image's name points to now
    env.save()  # the dead nodes' PIDs are gone from the backend's state
    try:
        backend.start(env, plan, names, progress)  # its phases go: the record keeps up's
        dead = {n: backend.node_state(env, plan, plan.node(n)) for n in names}
        dead = {n: s for n, s in dead.items() if s != "running"}
        if dead:
            listed = ", ".join(f"{n} ({s})" for n, s in dead.items())
            raise HpvcError(f"restart {env.name}", f"started, but not running: {listed}")
        start_services(backend, env, plan, names, progress)
    except BaseException as e:
        progress(f"restart {stopped_by(e)}; undoing {', '.join(names)}")
        try:
            backend.stop(env, plan, names, quiet)
        except HpvcError as undo:
            raise HpvcError(
                f"restart {env.name}", f"{e}; and undo failed: {undo.why}", f"hpvc down {env.name}"
            ) from e
        finally:
            env.save()
        raise
    env.save()
    after_change(env.store, progress)  # a restarted NFS server gets its storage limits back

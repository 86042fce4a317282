"""The clusters on this host and whether a command on one is under way.

Kept apart from ``hpvc.cluster.ops`` (which opens backends and reads the
kernel) so ``hpvc ls`` reads records and locks only and starts at once
(issue 16).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpvc.host import procfs
from hpvc.locks import holder
from hpvc.store import ClusterRecord, Store

# A record in one of these says a command is under way; when nobody holds the
# cluster's lock, that command was killed before it finished.
UNDER_WAY = {"creating": "coming up", "scaling": "scaling", "deleting": "going down"}


def under_way(store: Store, rec: ClusterRecord) -> dict[str, Any]:
    """Whether the up, scale or down that ``rec`` says is under way still runs:
    ``interrupted`` (nobody holds the cluster's lock: it was killed), ``held_by``
    (who holds it: ``PID 123 (hpvc up)``) and a ``note`` for people."""
    held_by = holder(store.cluster_lock_path(rec.name))
    doing = UNDER_WAY.get(rec.status)
    if doing is None:
        return {"interrupted": False, "held_by": held_by, "note": None}
    if held_by is not None:
        return {"interrupted": False, "held_by": held_by, "note": f"{doing} ({held_by})"}
    return {
        "interrupted": True,
        "held_by": None,
        "note": f"interrupted \N{EM DASH} run hpvc down {rec.name}",
    }


def stopped_nodes(rec: ClusterRecord, crun_root: Path = procfs.CRUN_ROOT) -> list[str]:
    """The nodes of a running cluster whose process is gone, as ``hpvc status``
    finds them, from the record's PIDs and crun's state files (no commands run)."""
    if rec.status != "running":
        return []
    pids = rec.backend_state.get("pids") or {}  # a VM backend's QEMUs
    cluster = rec.plan["cluster"]

    def alive(node: str) -> bool:
        pid = pids.get(node)
        if pid and procfs.running(pid):
            return True
        return procfs.container_init(f"hpvc-{cluster}-{node}", crun_root) is not None

    return [name for name in _node_names(rec) if not alive(name)]


# The record's plan is read as its JSON, not as hpvc.plan.model's classes
# (plan_from_json): importing those costs `hpvc ls` ~10 ms (issue 33 item 4).
def _node_names(rec: ClusterRecord) -> list[str]:
    return [str(n["name"]) for n in rec.plan["nodes"]]


def list_status(rec: ClusterRecord, stopped: list[str]) -> str:
    """The record's status, or ``stopped``/``degraded`` when nodes died under it."""
    if not stopped:
        return rec.status
    return "stopped" if len(stopped) == len(_node_names(rec)) else "degraded"


def list_clusters(store: Store | None = None) -> list[dict[str, Any]]:
    """One row per cluster on this host, from the records (no kernel reads)."""
    store = store or Store()
    out = []
    for name in store.names():
        rec = store.load(name)
        if rec is None:
            continue
        plan = rec.plan
        stopped = stopped_nodes(rec)
        out.append(
            {
                "name": name,
                "status": list_status(rec, stopped),
                "stopped_nodes": stopped,
                "interrupted": under_way(store, rec)["interrupted"],
                "kind": plan["kind"],
                "nodes": len(plan["nodes"]),
                "vcpus": sum(len(n["vcpus"]) for n in plan["nodes"]),
                "subnet": plan["network"]["subnet"],
                "image": rec.image_name(),
                "image_digests": rec.image_digests(),  # digest -> its nodes
                "created": rec.created,
            }
        )
    return out

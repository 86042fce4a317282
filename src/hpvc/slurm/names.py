"""The cluster name of a Slurm job's share on a host (``j<job>-<index>``),
and the shares on this host.

Apart from hpvc.slurm.shares so ``hpvc node ls`` finds the shares from the
records alone, without loading the planner (issue 16).
"""

from __future__ import annotations

from typing import Any

from hpvc.store import Store


def share_name(job: int, index: int) -> str:
    return f"j{job}-{index}"


def parse_share_name(name: str) -> tuple[int, int] | None:
    """(job, index) of a share's cluster name, None for any other cluster."""
    job, sep, index = name[1:].partition("-")
    if name[:1] != "j" or not sep or not (job.isdigit() and index.isdigit()):
        return None
    return int(job), int(index)


def listing(store: Store | None = None) -> list[dict[str, Any]]:
    """Shares of Slurm jobs on this host."""
    store = store or Store()
    out = []
    for n in store.names():
        parsed = parse_share_name(n)
        rec = store.load(n) if parsed else None
        if parsed is None or rec is None:
            continue
        plan = rec.the_plan()
        out.append(
            {
                "job": parsed[0],
                "share": parsed[1],
                "cluster": n,
                "status": rec.status,
                "nodes": [x.name for x in plan.nodes],
                "subnet": plan.network.subnet,
                "image": rec.image_name(),
                "image_digests": rec.image_digests(),  # digest -> its nodes
                **_services(store, rec),  # NFS and Spark (hpvc.cluster.share_view)
            }
        )
    return out


def _services(store: Store, rec: Any) -> dict[str, Any]:
    if not (rec.plan.get("spark") or (rec.plan.get("shared") or {}).get("server") == "nfs"):
        return {}
    from hpvc.cluster import share_view  # only shares with NFS or Spark pay its import

    return share_view.services(store, rec)

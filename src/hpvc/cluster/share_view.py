"""What ``hpvc node ls`` shows of a Slurm share's services (docs/slurm.md,
"Spark and NFS under Slurm"): which node serves the job's shared directory
over NFS and whether it serves here, whether each of this host's nodes has
its mount answering, and which of this share's nodes run the Spark master and
workers. Read from the share's record and the kernel (a mount asked in a
child, bounded: ``hpvc.host.nfs_mount.health``), never from the master: a
worker's liveness is ``hpvc status`` on the master's host.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpvc.store import ClusterRecord, Store


def services(store: Store, rec: ClusterRecord) -> dict[str, Any]:
    """``nfs``, ``mounts`` and ``spark`` of a share whose plan has them (else {})."""
    plan = rec.plan
    nodes = [str(n["name"]) for n in plan.get("nodes", [])]
    out: dict[str, Any] = {}
    shared = plan.get("shared") or {}
    if shared.get("server") == "nfs":
        from hpvc.host import nfs_mount  # only shares with NFS pay its import

        out["nfs"] = {
            "server": shared.get("node"),
            "address": shared.get("address"),
            "export": shared.get("export"),
            "serves_here": shared.get("node") in nodes,
        }
        out["mounts"] = {n: _mount(nfs_mount.health, store.node_dir(rec.name, n)) for n in nodes}
    spark = plan.get("spark")
    if spark:
        workers = {str(w["node"]) for w in spark.get("workers", [])}
        out["spark"] = {
            "master": f"spark://{spark['address']}:{spark['port']}",
            "master_here": spark.get("master") in nodes,
            "workers": [n for n in nodes if n in workers],
        }
    return out


IN_GUEST = "in its guest (hpvc status)"


def _mount(health: Callable[[Path], str | None], node_dir: Path) -> str:
    """A node's mount as the host sees it: "ok", or why not. A node with no
    mount point on the host (a VM guest mounts the export itself, with its own
    client) is read by ``hpvc status``, over ssh into the guest."""
    # From the parent's listing, never a stat of the mount point: a stat of a
    # mount whose server died waits in this process for as long as the client
    # does (CI, 2026-11-27: `hpvc node ls` hung past 60 s after the serving
    # host was killed); health() asks in a child that is killed after 2 s.
    try:
        there = "shared" in os.listdir(node_dir)
    except FileNotFoundError:
        there = False
    except OSError:  # the node's folder unreadable: let health() say what it sees
        there = True
    if not there:
        return IN_GUEST
    return health(node_dir / "shared") or "ok"


def text(row: dict[str, Any]) -> str:
    """The services of a ``node ls`` row in words ("" when it has none)."""
    parts = []
    nfs = row.get("nfs")
    if nfs:
        where = "served here" if nfs["serves_here"] else "mounted"
        mounts = row.get("mounts", {})
        bad = {n: why for n, why in mounts.items() if why not in ("ok", IN_GUEST)}
        state = ", ".join(f"{n}: {why}" for n, why in bad.items()) or "every mount answers"
        if not bad and mounts and set(mounts.values()) == {IN_GUEST}:
            state = "mounted in the guests: hpvc status reads them"
        parts.append(f"NFS {nfs['address']}:{nfs['export']} from {nfs['server']} ({where};"
                     f" {state})")  # fmt: skip
    spark = row.get("spark")
    if spark:
        roles = (["master"] if spark["master_here"] else []) + [
            f"worker {w}" for w in spark["workers"]
        ]
        parts.append(f"Spark {spark['master']}: {', '.join(roles) or 'no daemon here'}")
    return "; ".join(parts)

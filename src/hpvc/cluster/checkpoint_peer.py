"""pcocc's way of checkpointing a VM cluster, measured by ``hpvc bench checkpoint``.

pcocc (CEA's ``pcocc ckpt``) saves the VMs of a cluster one after the other
with QEMU's migration to a file: each VM is paused for its own save only,
the others run meanwhile, with no global barrier and no draining of the
network (issue 28). hpvc's ``checkpoint`` (``hpvc.cluster.checkpoint``)
freezes every node before saving any. To compare the two on the same guests,
this module does pcocc's order with the same backend steps: for each node in
turn ``freeze([node])``, ``save``, ``thaw([node])``.

It is a benchmark's peer, not a user command: it writes the nodes' states
into a scratch folder for their size and times, with no manifest, so
``hpvc restore`` refuses the folder (a cut taken at different instants is
what hpvc's checkpoint exists to avoid). A failure thaws the node it was on
and re-raises; the folder is the caller's to remove.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hpvc.backends.base import no_checkpoint
from hpvc.cluster.status import open_env
from hpvc.cluster.teardown import waiting
from hpvc.errors import InputError, require_root
from hpvc.paths import private_dir
from hpvc.progress import Progress, quiet
from hpvc.store import Store


def folder_size(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def one_by_one(
    name: str, dest: Path, store: Store | None = None, progress: Progress = quiet
) -> dict[str, Any]:
    """Save every node of the running cluster ``name`` into ``dest/<node>/``, one
    node paused at a time. Returns ``total_s`` (first pause to last resume),
    ``windows`` ([start, end] seconds from the first pause, per node in order),
    ``paused_s`` per node and ``size`` (bytes written)."""
    require_root("checkpoint, pcocc's method")
    store = store or Store()
    with store.cluster_lock(name, "bench checkpoint (pcocc's method)", waiting(name, progress)):
        rec = store.get(name)
        if rec.status != "running":
            raise InputError(f"cluster {name!r}", f"is {rec.status}", f"hpvc status {name}")
        backend, env = open_env(store, rec)
        if not backend.capabilities.checkpoint:
            raise no_checkpoint(backend.name)
        plan = rec.the_plan()
        private_dir(dest)
        windows: list[list[float]] = []
        paused: dict[str, float] = {}
        t_first = time.perf_counter()
        for node in (n.name for n in plan.nodes):
            node_dir = private_dir(dest / node)
            t0 = time.perf_counter()
            backend.freeze(env, plan, [node])
            try:
                backend.save(env, plan, node, node_dir, progress)
            finally:
                backend.thaw(env, plan, [node])
            t1 = time.perf_counter()
            windows.append([t0 - t_first, t1 - t_first])
            paused[node] = t1 - t0
        total = time.perf_counter() - t_first
    return {"total_s": total, "windows": windows, "paused_s": paused, "size": folder_size(dest)}

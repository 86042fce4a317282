"""``hpvc gc``: sweep what hpvc left on this host with no cluster record to undo it.

The clusters in this state directory are kept, with every interface name
their plans give; anything else hpvc named (``hpvc.host.orphans``) goes.
Orphans are judged against one state directory: every hpvc on a host should
share it (the default), or give ``prefix`` to sweep only clusters whose names
start with it.
"""

from __future__ import annotations

import subprocess

from hpvc.host import net, orphans
from hpvc.progress import Progress, quiet
from hpvc.render.context import tap_name
from hpvc.store import Store


def keep(store: Store) -> orphans.Keep:
    """The clusters of ``store`` and the interface names their plans use."""
    clusters: set[str] = set()
    links: set[str] = set()
    # Every cluster has its record before its first host change (booked under
    # the lock gc holds), so a folder without one is a cluster whose state was lost.
    for name in store.names():
        rec = store.load(name)
        if rec is None:
            continue
        clusters.add(name)
        plan = rec.the_plan()
        links.add(plan.network.bridge)
        for n in plan.nodes:
            links.add(tap_name(name, n.name))
            links.add(net.short_ifname("hc", name, n.name))
    return orphans.Keep(frozenset(clusters), frozenset(links), store.root)


def sweep(
    store: Store | None = None,
    prefix: str = "",
    dry_run: bool = False,
    progress: Progress = quiet,
) -> tuple[list[orphans.Orphan], list[str]]:
    """Find (and unless ``dry_run`` remove) orphans; return them and the errors."""
    store = store or Store()
    with store.lock():  # no `up` books a cluster while we decide what is not one
        found = orphans.find(keep(store), prefix)
        errors: list[str] = []
        for o in [] if dry_run else found:
            progress(f"remove {o.kind} {o.name}")
            try:
                orphans.remove(o)
            except (OSError, subprocess.CalledProcessError) as e:
                errors.append(f"{o.kind} {o.name}: {e}")
    return found, errors

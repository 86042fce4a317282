"""``hpvc gc``: sweep what hpvc left on this host with no cluster record to undo it.

The clusters in this state directory are kept, with every interface name
their plans give; anything else hpvc named goes: what each backend's nodes
leave, as the backend finds it (``Backend.orphans``: containers, QEMU
processes, libvirt domains, ...), then what any cluster leaves
(``hpvc.host.orphans``: namespaces, links, cgroups, mounts), then the
image store's interrupted imports (``import.tmp-<pid>`` folders no running
import owns, ``hpvc.image.Store.interrupted_imports``; not with ``prefix``,
which names clusters). Orphans are
judged against one state directory: every hpvc on a host should share it
(the default), or give ``prefix`` to sweep only clusters whose names start
with it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from hpvc.backends import registry
from hpvc.errors import HpvcError
from hpvc.host import net, orphans
from hpvc.image import Store as ImageStore
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
            # A VM node that was live-migrated alternates between two taps.
            links.add(tap_name(name, f"{n.name}~migrating"))  # qemu/migrate.MIGRATING
            links.add(net.short_ifname("hc", name, n.name))
    return orphans.Keep(frozenset(clusters), frozenset(links), store.root)


def sweep(
    store: Store | None = None,
    prefix: str = "",
    dry_run: bool = False,
    progress: Progress = quiet,
    images: ImageStore | None = None,
) -> tuple[list[orphans.Orphan], list[str]]:
    """Find (and unless ``dry_run`` remove) orphans; return them and the errors."""
    store = store or Store()
    imports: list[orphans.Orphan] = []
    errors: list[str] = []
    if not prefix:  # not a cluster's: swept only when gc is not told which clusters
        imports, errors = _interrupted_imports(images or ImageStore(), dry_run)
    with store.lock():  # no `up` books a cluster while we decide what is not one
        kept = keep(store)
        found: list[tuple[orphans.Orphan, Callable[[orphans.Orphan], None]]] = []
        for backend in registry.every():
            found += [(o, backend.remove_orphan) for o in backend.orphans(kept, prefix)]
        found += [(o, orphans.remove) for o in orphans.find(kept, prefix)]
        for o, remove in [] if dry_run else found:
            progress(f"remove {o.kind} {o.name}")
            try:
                remove(o)
            except (OSError, subprocess.CalledProcessError, HpvcError) as e:
                errors.append(f"{o.kind} {o.name}: {e}")
    return [o for o, _ in found] + imports, errors


def _interrupted_imports(
    images: ImageStore, dry_run: bool
) -> tuple[list[orphans.Orphan], list[str]]:
    """The image store's folders of imports that no longer run, removed unless ``dry_run``."""
    try:
        found = images.interrupted_imports(remove=not dry_run)
    except (OSError, HpvcError) as e:
        return [], [f"interrupted import in {images.digests_dir}: {e}"]
    return [orphans.Orphan("import", str(p), "interrupted image import") for p in found], []

"""The state directory's layout is spelled once (hpvc.paths): the store, the
renderers' default paths and gc's view of a path all agree on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.paths import Layout
from hpvc.render.context import RenderContext
from hpvc.store import Store

ROOT = Path("/srv/hpvc-state")


def test_the_store_and_the_renderers_put_a_cluster_in_the_same_places() -> None:
    store, ctx = Store(ROOT), RenderContext(base_dir=str(ROOT))
    assert ctx.cluster_dir("c1") == str(store.cluster_dir("c1")) == "/srv/hpvc-state/clusters/c1"
    assert ctx.node_dir("c1", "head0") == str(store.node_dir("c1", "head0"))
    assert ctx.node_run_dir("c1", "head0") == str(store.layout.node_run_dir("c1", "head0"))
    assert store.node_journal("c1", "head0").path == store.node_dir("c1", "head0") / "journal.jsonl"
    assert store.journal("c1").path.parent == store.cluster_dir("c1")
    assert store.cluster_lock_path("c1") == ROOT / "locks" / "c1.lock"


@pytest.mark.parametrize(
    ("path", "cluster"),
    [
        ("/srv/hpvc-state/clusters/a-b/nodes/head0/rootfs", "a-b"),
        ("/srv/hpvc-state/clusters/c1/shm", "c1"),
        ("/srv/hpvc-state/clusters/c1", "c1"),
        ("/srv/hpvc-state/clusters", None),
        ("/srv/hpvc-state/run/c1/head0", None),
        ("/srv/hpvc-state-2/clusters/c1", None),  # another state directory
    ],
)
def test_the_cluster_a_path_belongs_to(path: str, cluster: str | None) -> None:
    assert Layout(ROOT).cluster_of(path) == cluster

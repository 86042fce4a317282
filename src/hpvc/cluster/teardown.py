"""Taking a cluster's host changes back, in the order they depend on each other.

What a cluster made is in its journals (``hpvc.store``): one per
node, one for the cluster, one for host-wide changes shared by every
cluster here. Each was made on top of the ones before it: a node's domain or
container runs from its folder, on the cluster's bridge, in its cgroup; the
cluster's changes on the host-wide ones. So:

- within a journal, undoing stops at the first step that fails and keeps it
  with every older step (``Journal.undo_all``): the node's folder, which holds
  a VM's disk, is never removed while the domain that was not stopped runs;
- nodes do not depend on each other: every node's journal is undone (side
  by side, ``hpvc.concurrent``), even after another one stopped;
- the cluster's journal, its record and state folder, and the host-wide
  journal wait until no node journal is left; the record stays, so a later
  ``hpvc down`` retries exactly what is left and finishes.

``down`` is the command around it: the record is marked ``deleting``, the
journals undone, and while a step is left it fails (exit 1) with ``down
NAME: not finished: <the failed steps (why)>; N older step(s) kept``.
Nothing else here writes to the state directory (journals shrink in place),
so a full state disk does not stop a teardown.
"""

from __future__ import annotations

from collections.abc import Callable

from hpvc.concurrent import each
from hpvc.coordinator import after_change
from hpvc.errors import HpvcError
from hpvc.progress import Progress, quiet
from hpvc.store import ClusterRecord, Store, full

SHOWN = 3  # failed steps named in a "not finished" line; the rest are counted


def _node_names(store: Store, name: str) -> list[str]:
    nodes = store.layout.nodes(name)
    return sorted(d.name for d in nodes.iterdir()) if nodes.is_dir() else []


def teardown(store: Store, name: str, progress: Progress = quiet) -> list[str]:
    """Undo every node's journal, then (when none is left) the cluster's; remove
    the state when that is clean. Returns the steps that failed, one line per
    stopped journal (``"<what> (<why>)"``); empty when the cluster is gone."""
    errors: list[str] = []

    def undo_node(node: str) -> None:
        errors.extend(store.node_journal(name, node).undo_all(progress))

    each(_node_names(store, name), undo_node)  # side by side: nodes are independent
    if errors or any(store.node_journal(name, n).path.exists() for n in _node_names(store, name)):
        return errors or ["a node's journal came back while undoing (another command?)"]
    errors += store.journal(name).undo_all(progress)
    if errors:
        return errors
    store.remove(name)
    after_change(store, progress)  # its storage bandwidth goes to the others (docs/io.md)
    with store.lock():
        if not store.names():  # the last cluster: host-wide changes go too
            errors += store.host_journal().undo_all(progress)
    return errors


def steps_left(store: Store, name: str) -> int:
    """How many journaled changes of the cluster are still to be undone."""
    journals = [store.node_journal(name, n) for n in _node_names(store, name)]
    return sum(len(j.entries()) for j in [*journals, store.journal(name)])


def not_finished(store: Store, name: str, errors: list[str]) -> str:
    """What is left, for ``down NAME: not finished: ...``: the failed steps, and
    how many more wait for them."""
    shown = "; ".join(errors[:SHOWN])
    if len(errors) > SHOWN:
        shown += f"; {len(errors) - SHOWN} more failed"
    waiting = steps_left(store, name) - len(errors)
    if waiting > 0:
        shown += f"; {waiting} older step(s) kept until then"
    return shown


def waiting(name: str, progress: Progress) -> Callable[[str], None]:
    """What a command says while another holds the cluster's lock."""
    return lambda holder: progress(f"cluster {name} is busy: waiting for {holder} to finish")


def down(
    name: str,
    store: Store | None = None,
    progress: Progress = quiet,
    on_wait: Progress | None = None,
) -> None:
    """Take a cluster down; waits for an up, scale or down of it that is under way
    (``on_wait``, default ``progress``, is told whom it waits for)."""
    store = store or Store()
    with store.cluster_lock(name, "hpvc down", waiting(name, on_wait or progress)):
        _down_locked(store, name, progress)


def teardown_locked(store: Store, name: str, progress: Progress = quiet) -> list[str]:
    """``teardown`` under the cluster's lock (callers that hold no other)."""
    with store.cluster_lock(name, "teardown", waiting(name, progress)):
        return teardown(store, name, progress)


def _down_locked(store: Store, name: str, progress: Progress) -> None:
    """Mark the record ``deleting`` (so no ``scale`` starts on what is half
    gone), undo; while a step is left the record stays and ``down`` fails
    saying what is left. The mark is the one write: skipped on a retry, and
    on a full disk whose reserve is spent too it waits until the teardown
    has freed space."""
    rec = store.get(name)
    marked = rec.status == "deleting"
    if not marked:
        rec.status = "deleting"
        marked = _save_if_room(store, rec, progress)
    errors = teardown(store, name, progress)
    if not errors:
        return
    if not marked and store.load(name) is not None:
        _save_if_room(store, rec, progress)
    raise HpvcError(
        f"down {name}",
        f"not finished: {not_finished(store, name, errors)}",
        f"run hpvc down {name} again once that is fixed",
    )


def _save_if_room(store: Store, rec: ClusterRecord, progress: Progress) -> bool:
    try:
        store.save(rec)
    except OSError as e:
        if not full(e):
            raise
        progress(f"state disk full: {rec.name} not marked {rec.status} yet")
        return False
    return True

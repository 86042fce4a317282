"""The multi-user storage bandwidth coordinator (docs/io.md).

``site`` (the site file), ``alloc`` (weighted max-min fairness, pure),
``state`` (who is on which disk), ``coordinator`` (rebalance, ``hpvc io
set``, the server's cgroup), ``status`` (``hpvc io status``). This package's
top imports nothing: ``after_change`` is the hook ``hpvc.cluster.lifecycle``
calls when a cluster comes or goes, and costs nothing where no site file is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpvc.progress import Progress, quiet

if TYPE_CHECKING:
    from hpvc.store import Store


def after_change(store: Store, progress: Progress = quiet) -> None:
    """Rebalance after a cluster came or went. Never raises: the cluster's own
    command must not fail on a bad site file; the reason is said in one line."""
    from hpvc.coordinator import coordinator
    from hpvc.errors import HpvcError

    try:
        if coordinator.needed(store):
            coordinator.rebalance(store)
    except HpvcError as e:
        progress(f"storage coordinator: {e.line()}; throttles unchanged")
    except OSError as e:
        progress(f"storage coordinator: {e}; throttles unchanged")

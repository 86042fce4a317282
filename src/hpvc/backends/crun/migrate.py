"""Container nodes do not live-migrate (issue 27): ``hpvc migrate`` asks here and refuses.

A live migration moves a running node's memory while it runs; for a
container that is CRIU's pre-dump and page server. Debian's crun 1.8 is built
without CRIU (``crun --version`` has no ``+CRIU``), so hpvc would have to drive
CRIU itself, as its checkpoint of container nodes does (docs/checkpoint.md):
a container can be checkpointed and restored whole, stopped in between, but
not moved while it runs. docs/containers.md "Moving a container node".
Found by ``hpvc.cluster.migrate.mover`` by the backend's registry name.
"""

from __future__ import annotations

from typing import Any

WHY = (
    "container nodes cannot be live-migrated (Debian's crun is built without CRIU);"
    " a container cluster can be checkpointed and restored instead, stopped meanwhile"
)


def refusal(backend: Any, env: Any, plan: Any, node: Any) -> str | None:
    """Always the one line: nothing of a container moves live."""
    return WHY


def migrate_node(*_: Any) -> Any:
    raise AssertionError("refusal() refuses every container node first")

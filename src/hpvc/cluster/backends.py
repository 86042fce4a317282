"""What callers above the cluster layer (slurm/, cli/) may ask of the backends.

They never import ``hpvc.backends`` (architecture rule 2): this module puts
their questions to the registry, or to the backend of a spec or a cluster, and
hands back the answers as plain data.
"""

from __future__ import annotations

from hpvc.backends import registry


def load_all() -> None:
    """Import every backend this hpvc has (a warm ``hpvc serve`` then imports none
    when a command runs)."""
    registry.import_all()

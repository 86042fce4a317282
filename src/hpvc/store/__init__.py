"""hpvc's records on one host: each cluster's record, its journals, the state lock.

Below every layer that acts (``backends/``, ``coordinator/``, ``cluster/``):
each of them reads and writes cluster records through ``Store``, and the store
itself only uses ``host/journal.py`` and the plan's data types
(docs/architecture.md, "The rooms").
"""

from hpvc.store.records import DEFAULT_STATE_DIR, ClusterRecord, Store, full, state_dir

__all__ = ["DEFAULT_STATE_DIR", "ClusterRecord", "Store", "full", "state_dir"]

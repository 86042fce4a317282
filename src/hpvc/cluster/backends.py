"""What callers above the cluster layer (slurm/, cli/) may ask of the backends.

They never import ``hpvc.backends`` (architecture rule 2): this module puts
their questions to the registry, or to the backend of a spec or a cluster, and
hands back the answers as plain data.
"""

from __future__ import annotations

from hpvc.backends import registry
from hpvc.backends.base import TaskEntry
from hpvc.cluster.lifecycle import open_env
from hpvc.spec import Spec
from hpvc.store import Store


def load_all() -> None:
    """Import every backend this hpvc has (a warm ``hpvc serve`` then imports none
    when a command runs)."""
    registry.import_all()


def task_entry(spec: Spec, mpi: str, origin: str = "<spec>") -> TaskEntry:
    """How a Slurm step's tasks (``srun --mpi=<mpi>``) will run in the nodes of
    ``spec``; refused (InputError, nothing changed) where they cannot."""
    return registry.for_spec(spec, origin).task_entry(mpi)


def cluster_task_entry(store: Store, name: str, mpi: str) -> TaskEntry:
    """How a Slurm step's tasks run in the nodes of the running cluster ``name``."""
    backend, _ = open_env(store, store.get(name))
    return backend.task_entry(mpi)


def services_across_hosts(spec: Spec, origin: str = "<spec>") -> None:
    """A Slurm job's NFS shared directory and Spark, split over hosts: refused
    (InputError, nothing changed) where the spec's nodes cannot serve them
    yet (docs/slurm.md, "Spark and NFS under Slurm")."""
    from hpvc.backends import shared

    shared.across_hosts(spec, origin)

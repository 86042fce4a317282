"""How a Slurm step's tasks run in VM nodes: relayed to the guest's agent.

A VM has no namespaces on the host for a task to enter: the task connects to
the agent hpvc-init starts in the guest, on the node's cluster address
(native/agent), and relays its argv, environment, stdio and signals to it
(docs/slurm.md). Slurm's PMI server stays on the host, out of the guests'
reach: a step that asks for it is refused before anything changes, and MPI
starts with mpirun inside the guests instead.
"""

from __future__ import annotations

from hpvc.backends.base import TaskEntry
from hpvc.errors import InputError

# The cluster's agent key, in its folder (``hpvc.backends.vm.guest.agent_key``):
# the task relay reads it as root and proves to the agent it holds it.
AGENT_KEY = "agent.key"

# What a task in a VM node gets besides Slurm's variables: Open MPI's mpirun,
# run in a guest, starts its daemons on the other guests through their agents
# (hpvc-rsh, not ssh: no keys to hand out) over the cluster network, never
# through Slurm (the guests have no srun), and as root (the guest is the job's).
TASK_ENV = (
    "OMPI_MCA_plm=rsh",
    "OMPI_MCA_plm_rsh_agent=/usr/local/sbin/hpvc-rsh",
    "OMPI_MCA_ras=^slurm",
    "OMPI_MCA_btl_tcp_if_include=eth0",
    "OMPI_MCA_oob_tcp_if_include=eth0",
    "OMPI_ALLOW_RUN_AS_ROOT=1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
)


def task_entry(mpi: str) -> TaskEntry:
    """Relayed tasks, with ``TASK_ENV``; Slurm's PMI (``pmi2``, ``pmix``, ...) refused."""
    if mpi.startswith("pmi"):
        raise InputError(
            f"--mpi={mpi} with VM nodes",
            "Slurm's PMI server is on the host, out of the guests' reach",
            "srun --mpi=none, and start MPI with mpirun inside the guests (docs/slurm.md)",
        )
    return TaskEntry(relay=True, env=TASK_ENV, key=AGENT_KEY)

"""How a Slurm step's tasks run in VM nodes: relayed to the guest's agent.

A VM has no namespaces on the host for a task to enter: the task connects to
the agent hpvc-init starts in the guest, on the node's cluster address
(native/agent), and relays its argv, environment, stdio and signals to it
(docs/slurm.md). Slurm's PMIx server and PMI-2 stream stay on the host: the
relay carries them to the task beside its stdio (native/agent/chan.c), so
``srun --mpi=pmix`` and ``--mpi=pmi2`` start MPI ranks in the guests; any other
Slurm MPI plugin is refused before anything changes.
"""

from __future__ import annotations

from hpvc.backends.agentkey import AGENT_KEY
from hpvc.backends.base import TaskEntry
from hpvc.errors import InputError

# The cluster's agent key, in its folder (``hpvc.backends.agentkey``): the task
# relay reads it as root and proves to the agent it holds it.

# What a task in a VM node gets besides Slurm's variables: Open MPI's mpirun,
# run in a guest, starts its daemons on the other guests through their agents
# (hpvc-rsh, not ssh: no keys to hand out) over the cluster network, never
# through Slurm (the guests have no srun), and as root (the guest is the job's).
RSH = "/usr/local/sbin/hpvc-rsh"  # hpvc.image.guest_disk.RSH_TOOL_PATH
TASK_ENV = (
    "OMPI_MCA_plm=rsh",
    f"OMPI_MCA_plm_rsh_agent={RSH}",
    "OMPI_MCA_ras=^slurm",
    "OMPI_MCA_btl_tcp_if_include=eth0",
    "OMPI_MCA_oob_tcp_if_include=eth0",
    "OMPI_ALLOW_RUN_AS_ROOT=1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
)


# Slurm MPI plugins whose server the relay carries into the guest (chan.c).
CARRIED_MPI = ("pmix", "pmix_v4", "pmi2")

# With PMIx: the server's shared-memory store is in the host's spool, which no
# guest sees: the client asks over its connection instead; and only the native
# security module is carried (the relay vouches for the task as the user).
PMIX_ENV = ("PMIX_MCA_gds=hash", "PMIX_MCA_psec=native")


def task_entry(mpi: str) -> TaskEntry:
    """Relayed tasks, with ``TASK_ENV`` (and ``PMIX_ENV`` under PMIx); Slurm
    MPI plugins other than ``CARRIED_MPI`` (and none) refused."""
    if mpi not in ("", "none", *CARRIED_MPI):
        raise InputError(
            f"--mpi={mpi} with VM nodes",
            "only Slurm's pmix and pmi2 reach tasks in guests",
            "srun --mpi=pmix (or pmi2, or none and mpirun inside the guests; docs/slurm.md)",
        )
    env = (*TASK_ENV, *PMIX_ENV) if mpi.startswith("pmix") else TASK_ENV
    return TaskEntry(relay=True, env=env, key=AGENT_KEY)

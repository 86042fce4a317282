"""What keeps container nodes from a cut, checked before any node is frozen.

Each check refuses in one line (exit 2) and changes nothing but what
``nodeprocs.gather`` does (it moves what a Slurm step left running in the
background into its node's cgroups, docs/checkpoint.md "Under Slurm"):

- a process the node's freeze would not stop (a running Slurm step's tasks);
- a process attached from outside, in no tree of the nodes' inits (an ``hpvc
  exec`` or ``hpvc run`` whose client still runs: its program's stdio is the
  host's). Such a refusal (``shmcut.Attached``) is waited out for a moment
  first: ``hpvc jobs --wait`` and ``hpvc status`` run short commands in the
  nodes, and a cut that met one of them would fail for nothing;
- a process of another user where this hpvc lacks CAP_SYS_RESOURCE;
- with nodes sharing namespaces, what ``shmcut.refuse`` refuses.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from hpvc.backends.crun import shmcut
from hpvc.errors import HpvcError, InputError
from hpvc.host import cgroups, freezer, nodeprocs, procfs
from hpvc.plan import Plan

if TYPE_CHECKING:
    from hpvc.backends.base import ClusterEnv

ATTACHED_WAIT_S = 3.0  # an exec's client a moment from its end (a look of hpvc jobs)
POLL_S = 0.1


def unstoppable(env: ClusterEnv, plan: Plan, name: str, init: int, kind: type[HpvcError]) -> None:
    """Refuse a node whose PID namespace holds processes its freeze would not
    stop: a running Slurm step's tasks (``hpvc.host.nodeprocs``); with nodes
    of their own, an attached exec's client too (``shmcut.Attached`` before
    the freeze, ``kind`` after it)."""
    members = freezer.members(cgroups.node_path(plan.cluster, name))
    attached: list[int] = []
    if shmcut.holder(env) is not None:  # a shared namespace: the tree (shmcut takes the rest)
        left = sorted(p for p in nodeprocs.tree(init) - members if procfs.running(p))
    else:
        left = nodeprocs.outside(init, members)
        # In the freezer cgroup but in no tree of the init's: an exec's client (crun
        # exec entered the namespace from outside; hpvc run's ranks are such), whose
        # program's stdio is the host's: CRIU fails on it after the freeze.
        attached = nodeprocs.outside(init, nodeprocs.tree(init) | set(left))
    if attached and not left:
        raise (shmcut.Attached if kind is InputError else kind)(
            f"checkpoint of {env.name}",
            f"node {name} runs processes in no tree of its init's: {nodeprocs.describe(attached)}"
            " (an hpvc exec or hpvc run still attached)",
            "cut when those have ended; start long work in the background (setsid prog &),"
            " an MPI job with hpvc run --detach (docs/checkpoint.md)",
        )
    if left:
        raise kind(
            f"checkpoint of {env.name}",
            f"node {name} runs processes its freeze would not stop: {nodeprocs.describe(left)}"
            " (a running Slurm step's tasks stay in Slurm's freezer cgroup)",
            "cut when the job's steps in the node have ended; work left running in the"
            " background (setsid prog &) is taken (docs/checkpoint.md, Under Slurm)",
        )


def rlimits_readable(env: ClusterEnv, name: str, init: int) -> None:
    """CRIU reads every dumped process's resource limits with ``prlimit``, which
    needs CAP_SYS_RESOURCE for a process of another user: refuse before the
    freeze where this hpvc lacks it (a container sandbox may drop it; this
    machine's root has it not), instead of CRIU failing mid-cut with
    ``Can't get rlimit 0: Operation not permitted``."""
    if nodeprocs.has_capability(nodeprocs.CAP_SYS_RESOURCE):
        return
    left = nodeprocs.others(init, os.getuid(), os.getgid())
    if left:
        uids = sorted(nodeprocs.user_of(p) for p in left)
        raise InputError(
            f"checkpoint of {env.name}",
            f"node {name} runs processes of uid {', '.join(map(str, sorted(set(uids))))}"
            f" ({nodeprocs.describe(left)}) and this hpvc lacks CAP_SYS_RESOURCE, without"
            " which CRIU cannot read their resource limits",
            "checkpoint as root with all capabilities (docs/checkpoint.md, Containers)",
        )


def _once(env: ClusterEnv, plan: Plan, inits: dict[str, int]) -> None:
    for name, init in inits.items():
        nodeprocs.gather(init)
        unstoppable(env, plan, name, init, InputError)
        rlimits_readable(env, name, init)
    shmcut.refuse(env, inits)  # nodes sharing namespaces


def refuse(
    env: ClusterEnv, plan: Plan, inits: dict[str, int], wait_s: float = ATTACHED_WAIT_S
) -> None:
    """Every check above; an attached process is given ``wait_s`` to end."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return _once(env, plan, inits)
        except shmcut.Attached:
            if time.monotonic() >= deadline:
                raise
        time.sleep(POLL_S)

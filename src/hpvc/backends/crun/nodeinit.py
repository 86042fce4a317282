"""Commands under a container node's own init, for nodes sharing a PID namespace.

Nodes with ``locality = "shm"`` join their cluster's PID namespace, whose init
is the namespace holder (``container.start_holder``). ``crun exec`` starts a
command from outside, so what the command leaves running in the background
would be re-parented to the holder, in no node's process tree, and a node
could not be checkpointed whole (CRIU dumps trees: docs/checkpoint.md "Nodes
sharing namespaces"). Such nodes' init is ``hpvc-nodeinit serve``
(native/nodeinit, static, bound read-only into the node at ``IN_NODE``), a
child subreaper that starts every command itself: ``crun exec`` runs the
client, ``hpvc-nodeinit run -- ARGV``, which hands the init its argv,
environment, directory and stdio (the caller's own descriptors) and exits
as the command does. Whatever a command leaves running stays below its
node's init (docs/containers.md "Commands under the node's init").

A cluster started before this existed keeps its ``sh`` init and plain
``crun exec`` (``CrunState.node_init`` False). Since 2026-11-28 every node of
a new container cluster has this init, ``locality = "none"`` included.

Root's own clusters (not a Slurm tenant's, not across hosts) also get an
hpvc-agent in each node (``serve --agent``: native/agent's server, forked by
the init, in the node's tree), and the same binary bound at ``RSH_IN_NODE``
is hpvc-rsh: so ``mpirun`` run inside one node starts its daemons in the
others as in VM guests, with no sshd in the image, and a job so started is
the nodes' own and is checkpointed with them (docs/containers.md "MPI
started inside the nodes"). The agent runs commands as root for whoever
proves they hold the cluster's key (``hpvc.backends.agentkey``), bound at
``KEY_IN_NODE`` for root alone; a tenant is not root in its nodes, so its
clusters get no agent.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from hpvc.backends.crun.container import INIT
from hpvc.errors import MissingDependency
from hpvc.paths import native_binary

BINARY = "hpvc-nodeinit"
# Where a node sees it: /dev is the node's own tmpfs, so nothing of the image
# (nor its writable layer) is touched, and no image can hide it.
IN_NODE = "/dev/hpvc-nodeinit"
COMMAND = (IN_NODE, "serve")
AGENT_COMMAND = (*COMMAND, "--agent")  # with the node's hpvc-agent (native/nodeinit/agent.c)
RSH_IN_NODE = "/dev/hpvc-rsh"  # the same binary: hpvc-rsh when called so
KEY_IN_NODE = "/dev/hpvc-agent-key"  # the cluster's agent.key (native/agent/agent.h)

# What mpirun (Open MPI) and mpiexec (MPICH's hydra) run inside a node with an
# agent find in their environment: the other nodes are reached through it.
AGENT_ENV = (
    f"OMPI_MCA_plm_rsh_agent={RSH_IN_NODE}",
    "HYDRA_LAUNCHER=rsh",
    f"HYDRA_LAUNCHER_EXEC={RSH_IN_NODE}",
)


def binary() -> Path:
    """The built ``hpvc-nodeinit`` (``paths.native_binary``: this checkout's,
    else the site install's, else the installed one)."""
    found = native_binary("nodeinit", BINARY)
    if found is not None:
        return found
    raise MissingDependency(
        "container nodes", f"{BINARY} is not built", "make setup (or make -C native/nodeinit)"
    )


def preflight() -> None:
    """Refuse (MissingDependency) container nodes where their init is not built."""
    binary()


@dataclass(frozen=True)
class NodeInit:
    """What a node's OCI config gets for its init."""

    command: tuple[str, ...]
    binds: tuple[tuple[str, str, bool], ...] = ()  # (host path, path in the node, read-only)
    env: tuple[str, ...] = ()


def wanted(tenant: bool, across_hosts: bool) -> bool:
    """Whether a new cluster's nodes get an agent: root's own, on this host only
    (a tenant is not root in its nodes; across hosts the key would have to be
    the site's, as VM jobs' is: not done for containers)."""
    return not tenant and not across_hosts


def node_init(enabled: bool, key: Path | None) -> NodeInit:
    """The init of a cluster's nodes: ``sh`` (a cluster from before, ``enabled``
    False), else this binary, and with the cluster's agent ``key`` the agent,
    the same binary bound as hpvc-rsh and the key (``AGENT_ENV`` set)."""
    if not enabled:
        return NodeInit(INIT)
    init = str(binary())
    if key is None:
        return NodeInit(COMMAND, ((init, IN_NODE, True),))
    binds = ((init, IN_NODE, True), (init, RSH_IN_NODE, True), (str(key), KEY_IN_NODE, True))
    return NodeInit(AGENT_COMMAND, binds, AGENT_ENV)


def client(argv: list[str]) -> list[str]:
    """What ``crun exec`` runs in such a node to run ``argv`` under its init."""
    return [IN_NODE, "run", "--", *argv]


def client_words() -> str:
    """The client's words for a POSIX sh script, before the command's."""
    return " ".join(shlex.quote(w) for w in client([]))

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
``crun exec`` (``CrunState.node_init`` False).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hpvc.errors import MissingDependency
from hpvc.paths import native_binary

BINARY = "hpvc-nodeinit"
# Where a node sees it: /dev is the node's own tmpfs, so nothing of the image
# (nor its writable layer) is touched, and no image can hide it.
IN_NODE = "/dev/hpvc-nodeinit"
COMMAND = (IN_NODE, "serve")


def binary() -> Path:
    """The built ``hpvc-nodeinit`` (``paths.native_binary``: this checkout's,
    else the site install's, else the installed one)."""
    found = native_binary("nodeinit", BINARY)
    if found is not None:
        return found
    raise MissingDependency(
        'container nodes sharing memory (locality = "shm")',
        f"{BINARY} is not built",
        "make setup (or make -C native/nodeinit)",
    )


def preflight(locality: str) -> None:
    """Refuse (MissingDependency) nodes sharing memory where the init is not built."""
    if locality == "shm":
        binary()


def client(argv: list[str]) -> list[str]:
    """What ``crun exec`` runs in such a node to run ``argv`` under its init."""
    return [IN_NODE, "run", "--", *argv]


def client_words() -> str:
    """The client's words for a POSIX sh script, before the command's."""
    return " ".join(shlex.quote(w) for w in client([]))

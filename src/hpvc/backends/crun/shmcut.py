"""Checkpoint of container nodes sharing their cluster's namespaces (``locality = "shm"``).

Such nodes join one PID and one IPC namespace, whose init is the cluster's
namespace holder, and share one host tmpfs as /dev/shm (docs/checkpoint.md
"Nodes sharing namespaces"). CRIU cannot dump that PID namespace whole (the
nodes' hostnames are nested UTS namespaces, which CRIU 4.2 refuses), so each
node is dumped as its own tree, from its init, with the PID namespace named
external (``--external pid[INODE]``); the restore re-creates the holder (the
cluster's ``prepare``) and CRIU puts every node's tasks back into its PID
namespace with their saved PIDs (``--inherit-fd``) and into its IPC namespace
(``--join-ns ipc``). That takes every node whole because each node's init is
``hpvc-nodeinit`` (``hpvc.backends.crun.nodeinit``): every command of the node
starts under it and what a command leaves running stays below it.

The shared /dev/shm is saved once (``shm.tar``, with the first node, while
every node is frozen) and unpacked before any node comes back: CRIU reopens
and maps its files by name, so nodes that mapped one file share it again.

Refused in one line before anything is frozen (``refuse``):

- a cluster started before ``hpvc-nodeinit`` (its jobs may sit under the holder);
- processes of the shared PID namespace in no node's tree: an ``hpvc exec``
  still attached (its client, started by ``crun exec`` from outside), a
  running Slurm step's tasks or what they left;
- SysV IPC objects in the shared IPC namespace (per-node dumps would carry
  them once per node, and a joined namespace gets none of them back);
- a deleted /dev/shm file mapped in more than one node (CRIU would give each
  node its own copy: the nodes would no longer share it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from hpvc.errors import HpvcError, InputError
from hpvc.host import nodeprocs, procfs, sharedns

if TYPE_CHECKING:
    from hpvc.backends.base import ClusterEnv

SHM_TAR = "shm.tar"  # the shared /dev/shm, with the first node
PIDS = "pidns.json"  # the highest PID in use in the shared namespace, with it
PIDNS_KEY = "hpvc-pidns"  # CRIU's name of the shared PID namespace


class Attached(InputError):
    """A refusal for processes attached from outside the nodes' trees (an exec's
    client): ``hpvc.backends.crun.cutcheck`` gives them a moment to end first."""


def holder(env: ClusterEnv) -> int | None:
    """The shared namespaces' init (None: the nodes do not share them)."""
    pid = getattr(env.state, "holder_pid", None)
    return int(pid) if pid else None


def shm_dir(env: ClusterEnv) -> Path | None:
    shm = getattr(env.state, "shm", None)
    return Path(shm) if shm else None


def refuse(env: ClusterEnv, inits: dict[str, int]) -> None:
    """Every refusal of a cut of nodes sharing namespaces, in one line (exit 2);
    none for nodes with namespaces of their own."""
    what = f"checkpoint of {env.name}"
    init = holder(env)
    if init is None:
        return  # nodes with namespaces of their own
    if not getattr(env.state, "node_init", False):
        raise InputError(
            what,
            "its nodes share one PID namespace and were started before their init was"
            " hpvc-nodeinit: a job a node runs in the background may belong to the"
            " namespace's init, in no node's process tree",
            "take the cluster down and up again with this hpvc (docs/checkpoint.md)",
        )
    if not procfs.running(init):
        raise HpvcError(what, "the cluster's namespace holder is gone", "hpvc down, then up")
    left = sharedns.strays(init, list(inits.values()))
    if left:
        raise Attached(
            what,
            f"its shared PID namespace runs processes in no node's tree:"
            f" {nodeprocs.describe(left)} (an hpvc exec still attached, or a Slurm"
            " step's tasks)",
            "cut when those have ended; start long work in the background"
            " (setsid prog &), an MPI job with hpvc run --detach (docs/checkpoint.md)",
        )
    objects = sharedns.sysv_objects(init)
    if objects:
        raise InputError(
            what,
            f"its shared IPC namespace holds SysV IPC objects ({', '.join(objects[:3])}),"
            " which are not saved for nodes sharing it",
            'remove them (ipcrm), use POSIX shared memory in /dev/shm, or locality = "none"',
        )
    both = sharedns.shared_deleted({n: nodeprocs.tree(p) for n, p in inits.items()})
    if both:
        raise InputError(
            what,
            f"a deleted file of the shared /dev/shm is mapped in several nodes: {both[0]};"
            " a restore would give each node a copy of its own",
            "keep such files linked until the job ends (docs/checkpoint.md)",
        )


def dump_ns(env: ClusterEnv) -> tuple[Path, str] | None:
    """The shared PID namespace a node's dump names external (None: its own)."""
    init = holder(env)
    return (sharedns.ns_path(init, "pid"), PIDNS_KEY) if init is not None else None


def restore_ns(env: ClusterEnv) -> tuple[Path, str, Path] | None:
    """The re-created holder's PID namespace (with its key) and IPC namespace a
    node goes back into; None for nodes with namespaces of their own."""
    init = holder(env)
    if init is None:
        return None
    return (sharedns.ns_path(init, "pid"), PIDNS_KEY, sharedns.ns_path(init, "ipc"))


def save_pids(env: ClusterEnv, dest: Path, inits: dict[str, int]) -> None:
    """The highest PID in use in the shared namespace (all nodes frozen), and the
    nodes (``inits``: node -> its init) holding a deleted /dev/shm file, beside
    ``shm.tar``."""
    init = holder(env)
    if init is None:
        return
    ghosts = [n for n, p in inits.items() if sharedns.holds_deleted_shm(nodeprocs.tree(p))]
    doc = {"highest": sharedns.highest_pid(init), "ghosts": sorted(ghosts)}
    (dest / PIDS).write_text(json.dumps(doc) + "\n")


def restore_order(src: Path, names: list[str]) -> tuple[list[str], list[str]]:
    """(nodes to restore one after the other, the rest, side by side). CRIU
    gives a deleted file a node holds a temporary name beside it while it
    restores it (``open_mpi.0000.cr.1.ghost``): in the /dev/shm the nodes
    share, two nodes holding a deleted file of one name (Open MPI makes one in
    every node) took the same temporary name side by side, and one's restore
    removed the other's (``Couldn't unlink remap``, seen in the README's flow).
    Such nodes come back one at a time."""
    path = src / PIDS
    ghosts = set(json.loads(path.read_text()).get("ghosts", [])) if path.exists() else set()
    return [n for n in names if n in ghosts], [n for n in names if n not in ghosts]


def restore_pids(env: ClusterEnv, src: Path) -> None:
    """Before any node is restored into the new namespace: its next PIDs above
    every saved one. CRIU gives each restored task its saved PID, but the short
    helpers a node's restore forks there take the next free one, which another
    node restored beside it may need (``Can't fork for 31: File exists``, seen
    with an MPI job's processes across three nodes)."""
    init = holder(env)
    if init is not None and (src / PIDS).exists():
        sharedns.set_last_pid(init, int(json.loads((src / PIDS).read_text())["highest"]))

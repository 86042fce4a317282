"""What a container cluster's checkpoint keeps once, with its first node.

Besides each node's own files (``hpvc.backends.crun.checkpoint``), three
things belong to the cluster, not to a node, and are saved while every node
is frozen and put back before any node is restored:

- ``shared.tar``: the shared directory's host folder where it lives in the
  cluster's folder (``server = "host"``, gone at ``down``), so files the job
  holds open there are found again;
- ``shm.tar``: the /dev/shm tmpfs the nodes share (``locality = "shm"``,
  ``hpvc.backends.crun.shmcut``), so their shared pages come back, and
  ``pidns.json``: the highest PID in use in their shared PID namespace;
- ``agent.key``: the key of the nodes' hpvc-agents (``hpvc.backends.agentkey``):
  the restored agents hold the saved one in memory, so hpvc-rsh in the nodes
  must read the same one (the new cluster's folder made a new key);
- ``init.json``: whether the nodes' init is hpvc-nodeinit and runs an agent.
  The new cluster's ``prepare`` says what a node started now gets, but the
  restored nodes are the saved ones: ``hpvc exec`` must reach them as they
  were made (a checkpoint from before has none: its nodes sharing
  namespaces had hpvc-nodeinit, the others ``sh``, none an agent).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from hpvc.backends import shared
from hpvc.backends.agentkey import AGENT_KEY, write_key
from hpvc.backends.crun import container as ct
from hpvc.backends.crun import shmcut
from hpvc.errors import HpvcError
from hpvc.plan import Plan
from hpvc.progress import Progress

if TYPE_CHECKING:
    from hpvc.backends.base import ClusterEnv

SHARED_TAR = "shared.tar"
INIT = "init.json"
TAR_OPTS = ["--xattrs", "--xattrs-include=*", "--acls", "--numeric-owner", "--sparse"]


def tar(argv: list[str], what: str) -> None:
    done = subprocess.run(["tar", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise HpvcError(what, lines[-1] if lines else f"tar exit {done.returncode}")


def shared_folder(env: ClusterEnv, plan: Plan) -> Path | None:
    """The host folder of the cluster's shared directory where it lives in the
    cluster's folder (``server = "host"``, gone at ``down``); None otherwise
    (``keep = true``: it outlives the cluster and is bound again as it is)."""
    sh = shared.shared_of(plan)
    return shared.host_folder(env, sh) if sh.server == "host" and not sh.keep else None


def node_pid(plan: Plan, name: str) -> int:
    """A running node's init, on the host."""
    return ct.container_pid(ct.container_id(plan.cluster, name))


def save(env: ClusterEnv, plan: Plan, dest_dir: Path, progress: Progress) -> None:
    """The cluster's files into the first node's folder of the checkpoint."""
    folder = shared_folder(env, plan)
    if folder is not None:
        progress("the shared directory")
        tar(["-C", str(folder), *TAR_OPTS, "-cf", str(dest_dir / SHARED_TAR), "."],
            "save the shared directory")  # fmt: skip
    shm = shmcut.shm_dir(env)
    if shm is not None:
        progress("the shared /dev/shm")
        tar(["-C", str(shm), *TAR_OPTS, "-cf", str(dest_dir / shmcut.SHM_TAR), "."],
            "save the shared /dev/shm")  # fmt: skip
        shmcut.save_pids(env, dest_dir, {n.name: node_pid(plan, n.name) for n in plan.nodes})
    key = env.dir / AGENT_KEY
    if getattr(env.state, "agent", False) and key.exists():
        write_key(dest_dir / AGENT_KEY, key.read_bytes())
    init = {k: bool(getattr(env.state, k, False)) for k in ("node_init", "agent")}
    (dest_dir / INIT).write_text(json.dumps(init) + "\n")


def restore(env: ClusterEnv, plan: Plan, src: Path, progress: Progress) -> None:
    """The saved cluster's files (``src``: its first node's folder) into the new
    cluster, before any node is restored (before any opens its files again)."""
    if (src / INIT).exists():
        init = json.loads((src / INIT).read_text())
    else:  # from before 2026-11-28: hpvc-nodeinit in nodes sharing namespaces only
        init = {"node_init": shmcut.holder(env) is not None, "agent": False}
    from hpvc.backends.crun.backend import CrunState  # which imports this module's user

    assert isinstance(env.state, CrunState)
    env.state.node_init, env.state.agent = bool(init["node_init"]), bool(init["agent"])
    folder = shared_folder(env, plan)
    if folder is not None and (src / SHARED_TAR).exists():
        progress("the shared directory")
        tar(["-C", str(folder), *TAR_OPTS, "-xf", str(src / SHARED_TAR)],
            "restore the shared directory")  # fmt: skip
    shm = shmcut.shm_dir(env)
    if shm is not None and (src / shmcut.SHM_TAR).exists():
        progress("the shared /dev/shm")
        tar(["-C", str(shm), *TAR_OPTS, "-xf", str(src / shmcut.SHM_TAR)],
            "restore the shared /dev/shm")  # fmt: skip
        shmcut.restore_pids(env, src)
    if getattr(env.state, "agent", False) and (src / AGENT_KEY).exists():
        write_key(env.dir / AGENT_KEY, (src / AGENT_KEY).read_bytes())

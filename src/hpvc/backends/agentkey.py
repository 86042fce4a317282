"""The cluster's agent key: what lets root reach a node's hpvc-agent.

Each node of a VM cluster, and of a root's own container cluster, runs
native/agent's server, which runs a command only for a client from a
reserved port of the cluster's subnet that proves it holds this key
(native/agent/agent.h). QEMU hands the key to its guests as a file
(fw_cfg); container nodes see it bound read-only (``hpvc.backends.crun.nodeinit``);
hpvc-rsh, the Slurm task relay and ``hpvc exec`` into an image without sshd
read it. It is a file in the cluster's folder, root's alone, never on a
command line (which every user reads).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from hpvc.errors import MissingDependency
from hpvc.store import Store

AGENT_KEY = "agent.key"  # in the cluster's folder

# In the state folder, the same file on every host of a site that runs VM jobs
# across hosts (handed out as munge's key is): what each host derives a job's
# agent key from, so that hpvc-rsh reaches the job's guests on every host.
SITE_AGENT_KEY = "agent-site.key"


def agent_key(store: Store, cluster: str, key_id: str = "") -> Path:
    """The cluster's agent key file (root's alone): 32 random bytes, made once;
    for a cluster across hosts (``key_id``: a Slurm job's), HMAC-SHA256 of the
    site's key and ``key_id``, the same on every host (docs/slurm.md)."""
    path = store.cluster_dir(cluster) / AGENT_KEY
    if key_id:
        site = store.root / SITE_AGENT_KEY
        try:
            secret = site.read_bytes()
        except OSError as e:
            secret, why = b"", e.strerror or str(e)
        else:
            why = f"{len(secret)} bytes, fewer than 16"
        if len(secret) < 16:
            raise MissingDependency(
                f"VM nodes across hosts ({key_id})",
                f"the site's agent key {site}: {why}",
                f"make it once (head -c 32 /dev/urandom > {site}; chmod 600 {site}) and copy"
                " it to every host's state folder, as munge's key (docs/slurm.md)",
            )
        key = hmac.new(secret, f"hpvc-agent-key {key_id}".encode(), hashlib.sha256).digest()
    elif path.exists():
        return path
    else:
        key = os.urandom(32)
    write_key(path, key)
    return path


def write_key(path: Path, key: bytes) -> None:
    """``key`` into ``path`` (mode 0600), replaced whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    os.replace(tmp, path)

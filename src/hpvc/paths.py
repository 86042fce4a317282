"""Where hpvc keeps its state on a host: one default, one environment override,
and the layout of that directory (spelled here only).

``$HPVC_STATE_DIR`` (default /var/lib/hpvc) holds clusters, journals and locks;
``$HPVC_IMAGE_DIR`` (default ``<state dir>/images``) the built images. Under
the state directory (``Layout``; the renderers' default paths join the same
names):

    state.lock                    flock: planning and booking CPUs is serialised
    host-journal.jsonl            host-wide changes shared by clusters (undone with the last)
    vxlan-port.jsonl              the VXLAN port's holder (kept: the port stays hpvc's)
    clusters/<name>/cluster.json  spec, plan, status, what the cluster holds
    clusters/<name>/journal.jsonl cluster-wide host changes, undone last
    clusters/<name>/nodes/<node>/journal.jsonl   one node's host changes
    locks/<name>.lock             one cluster's lock (up, scale, down)
    run/<name>/<node>/            sockets and pid files of a node (VMs)
    jobs/                         Slurm: each job's lock and its shares' join records
    shared/<name>                 a ``keep = true`` cluster's shared directory between ups
    images/                       built images (unless $HPVC_IMAGE_DIR)
    space-reserve                 1 MiB of zeros kept for records on a full disk

The state is root's: under Slurm it holds every job's nodes (their overlay
roots, shared memory, journals), so no other user may reach into it.
``private_dir`` makes each folder on the way 0700 as it creates it (mkdir's
own mode, never chmod after: there is no moment when another user could
open it).
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import hpvc
from hpvc import DEFAULT_STATE_DIR as DEFAULT_STATE_DIR

PRIVATE = 0o700  # the mode of every folder hpvc makes in its state directory

# The names of the state directory's layout (above).
STATE_LOCK = "state.lock"
HOST_JOURNAL = "host-journal.jsonl"
VXLAN_PORT_JOURNAL = "vxlan-port.jsonl"
CLUSTERS = "clusters"
RECORD = "cluster.json"
JOURNAL = "journal.jsonl"  # a cluster's, and each node's
NODES = "nodes"
LOCKS = "locks"
RUN = "run"
JOBS = "jobs"
SHARED = "shared"
IMAGES = "images"
RESERVE = "space-reserve"


def state_dir() -> Path:
    return Path(os.environ.get("HPVC_STATE_DIR") or DEFAULT_STATE_DIR)


def image_dir() -> Path:
    env = os.environ.get("HPVC_IMAGE_DIR")
    return Path(env) if env else state_dir() / IMAGES


def open_to_others(path: Path, st: os.stat_result) -> bool:
    """May others than the owner enter ``path`` by its mode? The group bits of a
    file with an access ACL are its mask, not the owning group's: who else
    may enter is then said by the ACL's entries, which only the owner (root)
    writes (``hpvc.host.qemu_access`` gives a QEMU's uid traversal so)."""
    if st.st_mode & 0o007:
        return True
    if not st.st_mode & 0o070:
        return False
    try:
        os.getxattr(path, "system.posix_acl_access", follow_symlinks=False)
    except OSError:
        return True  # no ACL: the group bits are the group's
    return False


def private_dir(path: Path, *, tighten: bool = False) -> Path:
    """``path`` as a folder only its owner (root) can enter; missing parents
    are made the same way. ``tighten``: a folder of hpvc's own that an older
    hpvc made open to others is closed too (never pass it for the state root
    itself, which may be a directory a site chose). Returns ``path``."""
    try:
        os.mkdir(path, PRIVATE)
    except FileNotFoundError:
        private_dir(path.parent)
        with contextlib.suppress(FileExistsError):  # a concurrent command made it so
            os.mkdir(path, PRIVATE)
    except FileExistsError:
        st = os.stat(path)  # follows a link, as mkdir -p would
        if tighten and open_to_others(path, st) and st.st_uid == os.geteuid():
            os.chmod(path, PRIVATE)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    return path


@dataclass(frozen=True)
class Layout:
    """The paths of one state directory (above): only path arithmetic, nothing
    is made or read here."""

    root: Path

    def state_lock(self) -> Path:
        return self.root / STATE_LOCK

    def host_journal(self) -> Path:
        return self.root / HOST_JOURNAL

    def vxlan_port_journal(self) -> Path:
        return self.root / VXLAN_PORT_JOURNAL

    def clusters(self) -> Path:
        return self.root / CLUSTERS

    def cluster_dir(self, name: str) -> Path:
        return self.clusters() / name

    def record(self, name: str) -> Path:
        return self.cluster_dir(name) / RECORD

    def journal(self, name: str) -> Path:
        return self.cluster_dir(name) / JOURNAL

    def nodes(self, name: str) -> Path:
        return self.cluster_dir(name) / NODES

    def node_dir(self, name: str, node: str) -> Path:
        return self.nodes(name) / node

    def node_journal(self, name: str, node: str) -> Path:
        return self.node_dir(name, node) / JOURNAL

    def locks(self) -> Path:
        return self.root / LOCKS

    def cluster_lock(self, name: str) -> Path:
        return self.locks() / f"{name}.lock"

    def runs(self) -> Path:
        return self.root / RUN

    def run_dir(self, name: str) -> Path:
        return self.runs() / name

    def node_run_dir(self, name: str, node: str) -> Path:
        return self.run_dir(name) / node

    def jobs(self) -> Path:
        return self.root / JOBS

    def kept_shared(self, name: str) -> Path:
        return self.root / SHARED / name

    def reserve(self) -> Path:
        return self.root / RESERVE

    def cluster_of(self, path: str | Path) -> str | None:
        """The cluster whose folder holds ``path`` (``clusters/<name>/...``); None
        for a path outside every cluster's folder."""
        try:
            rel = Path(path).relative_to(self.clusters())
        except ValueError:
            return None
        return rel.parts[0] if rel.parts else None


INSTALLED_LIB = Path("/usr/local/lib/hpvc")  # `make -C native/<folder> install`


def native_binary(folder: str, name: str) -> Path | None:
    """A C program of ``native/<folder>``: this checkout's build, else a site
    install's (``<prefix>/lib`` beside its virtualenv, scripts/slurm/install.sh),
    else ``make install``'s; None when none of them is executable."""
    repo = Path(hpvc.__file__).resolve().parents[2]
    site = Path(sys.prefix).parent / "lib" / name
    for candidate in (repo / "native" / folder / name, site, INSTALLED_LIB / name):
        if os.access(candidate, os.X_OK):
            return candidate
    return None

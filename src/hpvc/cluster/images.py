"""Which images the clusters on this host use: what ``hpvc image rm`` must keep.

A cluster names its image in its spec (``image = "NAME"``), and its record
keeps the digest each node was made from (``ClusterRecord.images``, written
by ``record`` at up and scale). That digest is in use while the record exists
(running, failed half-way or being taken down), because the nodes mount its
rootfs, even after the name was pointed elsewhere (a re-import, a rebuild).
A record from before digests were kept counts the digest its name points to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hpvc.errors import HpvcError
from hpvc.image import Store as ImageStore
from hpvc.store import ClusterRecord, Store

# Image Env entries a Slurm task takes at most (the SPANK plugin's records hold
# 64 variables per node, hpvc's own among them: native/spank/hpvc_spank.h).
MAX_TASK_ENV = 48
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def image_users(
    store: Store | None = None, images: ImageStore | None = None
) -> dict[str, list[str]]:
    """Image digest -> the clusters whose spec names an image pointing at it."""
    store = store or Store()
    images = images or ImageStore()
    users: dict[str, list[str]] = {}
    for name in store.names():
        rec = store.load(name)
        if rec is None:
            continue
        digests = set(rec.image_digests()) or {digest_of(rec.image_name(), images)}
        for digest in digests - {""}:
            users.setdefault(digest, []).append(name)
    return users


def in_use(
    store: Store | None = None, images: ImageStore | None = None
) -> Callable[[str], list[str]]:
    """``in_use(digest)`` for ``hpvc.image.remove_image``: the clusters that exist
    and use it (empty: none). The records are read at the first call, not
    before: an import that refuses first (not root) reads none."""
    users: dict[str, list[str]] | None = None

    def check(digest: str) -> list[str]:
        nonlocal users
        if users is None:
            users = image_users(store, images)
        return users.get(digest, [])

    return check


def digest_of(name: str, images: ImageStore | None = None) -> str:
    """The digest the image ``name`` points to now; "" when there is none."""
    try:
        return (images or ImageStore()).read_name(name) or ""
    except (HpvcError, OSError):  # a name hpvc would refuse, a store we cannot read
        return ""


def record(rec: ClusterRecord, nodes: Iterable[str], images: ImageStore | None = None) -> None:
    """Keep in ``rec`` the digest of its image for ``nodes`` (those being made
    now, from the image its name points to now) and forget nodes gone from its
    plan; nodes already made keep theirs."""
    nodes = list(nodes)
    digest = digest_of(rec.image_name(), images)
    planned = {n.name for n in rec.the_plan().nodes} | set(nodes)
    kept = {n: d for n, d in rec.images.items() if n in planned}
    rec.images = {**kept, **{n: digest for n in nodes if digest}}


def require_stored(name: str, images: ImageStore | None = None) -> str:
    """The digest of the image ``name`` in this host's store, or a one-line
    error saying the site has not imported it here (a Slurm host: the site
    lists the image, but only root imports it, once per host or once into a
    shared ``image_dir``)."""
    images = images or ImageStore()
    digest = digest_of(name, images)
    if not digest or not images.is_complete(digest):
        raise HpvcError(
            f"image {name!r}",
            f"the site allows it but this host's image store ({images.root}) does not have it",
            "the site builds or imports it as root on every host (hpvc image build"
            " or import), or once into an image_dir the hosts share",
        )
    return digest


@dataclass(frozen=True)
class TaskImage:
    """What a Slurm task in a container node takes from the node's image: its
    config's Env and WorkingDir ("/" when it names none, and for built images)."""

    env: tuple[str, ...] = ()
    workdir: str = "/"


def task_images(store: Store, name: str, images: ImageStore | None = None) -> dict[str, TaskImage]:
    """Node -> what its Slurm tasks take from its image, read from the digest
    the node was made from (its record), so a name pointed elsewhere since
    changes nothing for the nodes already running. An entry a task could not
    take (a newline, a name no shell has, too many) is an error naming it."""
    images = images or ImageStore()
    rec = store.get(name)
    out: dict[str, TaskImage] = {}
    seen: dict[str, TaskImage] = {}
    for node in (n.name for n in rec.the_plan().nodes):
        digest = rec.images.get(node) or digest_of(rec.image_name(), images)
        if digest not in seen:
            seen[digest] = task_image(rec.image_name(), digest, images)
        out[node] = seen[digest]
    return out


def task_image(name: str, digest: str, images: ImageStore) -> TaskImage:
    """What tasks take from the image ``name`` at ``digest`` (nothing when it is gone)."""
    try:
        image = images.load(name, digest) if digest else None
    except (OSError, ValueError, KeyError):
        image = None
    if image is None:
        return TaskImage()
    what = f"image {name!r} ({digest[:12]})"
    fix = "the site fixes the image and imports it again"
    if len(image.env) > MAX_TASK_ENV:
        raise HpvcError(
            what, f"Env has {len(image.env)} entries, a Slurm task takes {MAX_TASK_ENV}", fix
        )
    for kv in image.env:
        key, sep, value = kv.partition("=")
        if not sep or not _ENV_NAME.fullmatch(key) or "\n" in value or "\0" in value:
            raise HpvcError(what, f"Env entry {kv[:40]!r} is not NAME=VALUE on one line", fix)
    workdir = image.workdir
    if not workdir.startswith("/") or "\n" in workdir or "\0" in workdir:
        raise HpvcError(what, f"WorkingDir {workdir[:40]!r} is not an absolute path", fix)
    return TaskImage(env=image.env, workdir=workdir)

"""Which images the clusters on this host use: what ``hpvc image rm`` must keep.

A cluster names its image in its spec (``image = "NAME"``), and its record
keeps the digest each node was made from (``ClusterRecord.images``, written
by ``record`` at up and scale). That digest is in use while the record exists
(running, failed half-way or being taken down), because the nodes mount its
rootfs, even after the name was pointed elsewhere (a re-import, a rebuild).
A record from before digests were kept counts the digest its name points to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hpvc.errors import HpvcError
from hpvc.image import Store as ImageStore
from hpvc.store import ClusterRecord, Store


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
    and use it (empty: none)."""
    users = image_users(store, images)
    return lambda digest: users.get(digest, [])


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

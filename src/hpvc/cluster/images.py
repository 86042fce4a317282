"""Which images the clusters on this host use: what ``hpvc image rm`` must keep.

A cluster names its image in its spec (``image = "NAME"``); the image is in
use while a record of that cluster exists (running, failed half-way or being
taken down), because its nodes mount the rootfs that name points to.
"""

from __future__ import annotations

from collections.abc import Callable

from hpvc.errors import HpvcError
from hpvc.image import Store as ImageStore
from hpvc.store import Store


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
        image = str(rec.spec.get("image", "hpc"))
        try:
            digest = images.read_name(image)
        except HpvcError:  # a name hpvc would refuse: no image of ours
            continue
        if digest is not None:
            users.setdefault(digest, []).append(name)
    return users


def in_use(store: Store | None = None, images: ImageStore | None = None) -> Callable[[str], bool]:
    """``in_use(digest)`` for ``hpvc.image.remove_image``: a cluster that exists uses it."""
    users = image_users(store, images)
    return lambda digest: digest in users

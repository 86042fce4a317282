"""Looking images up and removing them: ``list_images``, ``resolve_image``, ``remove_image``."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from hpvc.errors import HpvcError, InputError
from hpvc.image.model import Image, check_name
from hpvc.image.store import InUse, Store

StoreArg = Store | str | Path | None


def as_store(store: StoreArg) -> Store:
    """A ``Store`` from a Store, a path, or None (the default store)."""
    return store if isinstance(store, Store) else Store(store)


def _not_found(name: str, store: Store) -> InputError:
    """No image ``name``: a recipe hpvc has (``hpc``, ``spark``) is built by its
    name; any other name is most likely a typo, so name the images there are and
    the closest one rather than offer a build that makes a new image."""
    from hpvc.image.extras import PRESETS
    from hpvc.image.model import DEFAULT_NAME

    recipes = sorted({DEFAULT_NAME, *PRESETS})
    if name in recipes:
        return InputError(f"image {name!r}", "not found", f"build it: hpvc image build {name}")
    try:
        stored = sorted(store.all_names())
    except OSError:
        stored = []
    close = difflib.get_close_matches(name, sorted({*stored, *recipes}), n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    there = ", ".join(stored) if stored else "none"
    return InputError(
        f"image {name!r}",
        f"not found (images here: {there})",
        f"{guess}see hpvc image ls; recipes to build: {', '.join(recipes)}",
    )


def list_images(store: StoreArg = None) -> list[Image]:
    """Every named image, one entry per name, sorted by name.

    A name whose digest directory is missing or unreadable (a store edited by
    hand) is skipped rather than failing the whole listing.
    """
    s = as_store(store)
    out = []
    for name, digest in s.all_names().items():
        try:
            out.append(s.load(name, digest))
        except (OSError, ValueError, KeyError):
            continue
    return out


def resolve_image(name: str, store: StoreArg = None) -> Image:
    """The image ``name`` points to; InputError when there is none."""
    s = as_store(store)
    digest = s.read_name(check_name(name))
    if digest is None or not s.is_complete(digest):
        raise _not_found(name, s)
    try:
        return s.load(name, digest)
    except (OSError, ValueError, KeyError) as e:
        raise HpvcError(
            f"image {name!r}", f"unreadable metadata: {e}", f"rebuild it: hpvc image build {name}"
        ) from None


@dataclass(frozen=True)
class Removed:
    """What ``remove_image`` did: the name is gone; the data too unless other names share it."""

    name: str
    digest: str
    deleted: bool
    kept_for: tuple[str, ...]


def remove_image(name: str, store: StoreArg = None, *, in_use: InUse = lambda d: False) -> Removed:
    """Remove ``name``; delete its rootfs when no other name points to the same digest.

    ``in_use(digest)`` (passed by the cluster layer: the clusters whose records
    hold the digest) vetoes deleting a rootfs that a node mounts: removing the
    last name of such an image is refused, naming those clusters. Removing one
    of several names of a shared digest is always allowed.
    """
    s = as_store(store)
    check_name(name)
    if not s.root.is_dir():
        raise _not_found(name, s)
    with s.lock():
        digest = s.read_name(name)
        if digest is None:
            raise _not_found(name, s)
        others = tuple(n for n in s.names_of(digest) if n != name)
        users = in_use(digest) if not others else False
        if users:
            which = "a cluster that exists"
            if not isinstance(users, bool):
                which = f"cluster{'s' if len(users) > 1 else ''} {', '.join(sorted(users))}"
            raise InputError(
                f"image {name!r} ({digest[:12]})",
                f"in use by {which}",
                "take the clusters using it down first (hpvc down)",
            )
        (s.names_dir / name).unlink()
        s.sync_names(digest)
        deleted = s.drop_if_orphan(digest, in_use)
    if deleted:
        with s.import_lock_if_free() as free:
            if free:  # else the import under way prunes when it ends
                s.prune_blobs()
    return Removed(name=name, digest=digest, deleted=deleted, kept_for=others)

"""Guest images: Debian root filesystems built by debootstrap, cached by content.

``build_image`` builds (or instantly reuses) a rootfs for a recipe (suite,
packages, mirror) and points a name at it; ``resolve_image`` gives the backends
``Image.rootfs``, the read-only lower directory of their overlayfs mounts;
``list_images`` and ``remove_image`` manage the store (see ``hpvc.image.store``
for its layout).

The names below are loaded on first use (``hpvc.lazy``): ``hpvc image ls``
reads the store without importing the builder and its OCI and tar code
(issue 33 item 4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpvc.lazy import exports

if TYPE_CHECKING:
    from hpvc.image.builder import DEFAULT_CACHE_DIR, build_image, find_debootstrap
    from hpvc.image.catalog import Removed, list_images, remove_image, resolve_image
    from hpvc.image.debootstrap import parse_progress
    from hpvc.image.model import (
        DEFAULT_MIRROR,
        DEFAULT_NAME,
        DEFAULT_PACKAGES,
        DEFAULT_SUITE,
        Image,
        ImageSpec,
    )
    from hpvc.image.store import Store, default_store

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_MIRROR",
    "DEFAULT_NAME",
    "DEFAULT_PACKAGES",
    "DEFAULT_SUITE",
    "Image",
    "ImageSpec",
    "Removed",
    "Store",
    "build_image",
    "default_store",
    "find_debootstrap",
    "list_images",
    "parse_progress",
    "remove_image",
    "resolve_image",
]

__getattr__ = exports(
    __name__,
    {
        "hpvc.image.builder": ["DEFAULT_CACHE_DIR", "build_image", "find_debootstrap"],
        "hpvc.image.catalog": ["Removed", "list_images", "remove_image", "resolve_image"],
        "hpvc.image.debootstrap": ["parse_progress"],
        "hpvc.image.model": [
            "DEFAULT_MIRROR",
            "DEFAULT_NAME",
            "DEFAULT_PACKAGES",
            "DEFAULT_SUITE",
            "Image",
            "ImageSpec",
        ],
        "hpvc.image.store": ["Store", "default_store"],
    },
)

"""Guest images: Debian root filesystems built by debootstrap, cached by content.

``build_image`` builds (or instantly reuses) a rootfs for a recipe (suite,
packages, mirror) and points a name at it; ``resolve_image`` gives the backends
``Image.rootfs``, the read-only lower directory of their overlayfs mounts;
``list_images`` and ``remove_image`` manage the store (see ``hpvc.image.store``
for its layout).
"""

from __future__ import annotations

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

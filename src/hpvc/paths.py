"""Where hpvc keeps its state on a host: one default, one environment override.

``$HPVC_STATE_DIR`` (default /var/lib/hpvc) holds clusters, journals and locks;
``$HPVC_IMAGE_DIR`` (default ``<state dir>/images``) the built images.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STATE_DIR = "/var/lib/hpvc"


def state_dir() -> Path:
    return Path(os.environ.get("HPVC_STATE_DIR") or DEFAULT_STATE_DIR)


def image_dir() -> Path:
    env = os.environ.get("HPVC_IMAGE_DIR")
    return Path(env) if env else state_dir() / "images"

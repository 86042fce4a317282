"""Where hpvc keeps its state on a host: one default, one environment override.

``$HPVC_STATE_DIR`` (default /var/lib/hpvc) holds clusters, journals and locks;
``$HPVC_IMAGE_DIR`` (default ``<state dir>/images``) the built images.

The state is root's: under Slurm it holds every job's nodes (their overlay
roots, shared memory, journals), so no other user may reach into it.
``private_dir`` makes each folder on the way 0700 as it creates it (mkdir's
own mode, never chmod after: there is no moment when another user could
open it).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from hpvc import DEFAULT_STATE_DIR as DEFAULT_STATE_DIR

PRIVATE = 0o700  # the mode of every folder hpvc makes in its state directory


def state_dir() -> Path:
    return Path(os.environ.get("HPVC_STATE_DIR") or DEFAULT_STATE_DIR)


def image_dir() -> Path:
    env = os.environ.get("HPVC_IMAGE_DIR")
    return Path(env) if env else state_dir() / "images"


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
        if tighten and st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.chmod(path, PRIVATE)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    return path

"""mount(2) itself, for the container nodes' overlay roots and shared tmpfs.

``hpvc up`` of 8 container nodes ran ``mount(8)`` 9 times (an overlay per
node, the tmpfs the nodes share as /dev/shm): 9 processes, each libmount's
start, on the 2-CPU machines where the up's nodes phase is what keeps it
from 0.5x Podman's parallel start (docs/benchmarks.md, issue 33 item 4).
The system call does the same mount, in this process. Hand-written on
ctypes (as hpvc.host.netns): the standard library has no mount(), and the
only options hpvc passes are the two flags below and the file system's own
data (overlay's dirs, tmpfs's size and mode), which go to the kernel as is.
"""

from __future__ import annotations

import ctypes
import os

from hpvc.errors import HpvcError

# mount(2)'s flags for the words hpvc passes (linux/mount.h).
FLAGS = {"nosuid": 0x2, "nodev": 0x4}
# One page: what mount(2) copies of its data argument (mount(8) would use the
# new mount API past it; hpvc's options are far shorter, refused if not).
DATA_MAX = 4095

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


def split(options: str) -> tuple[int, str]:
    """``"nosuid,nodev,size=64m"`` -> (MS_NOSUID | MS_NODEV, ``"size=64m"``)."""
    flags, data = 0, []
    for word in options.split(",") if options else []:
        if word in FLAGS:
            flags |= FLAGS[word]
        else:
            data.append(word)
    return flags, ",".join(data)


def mount(source: str, target: str, fstype: str, options: str, what: str) -> None:
    """``mount -t FSTYPE -o OPTIONS SOURCE TARGET``; a failure is ``HpvcError(what)``
    with the kernel's reason."""
    flags, data = split(options)
    raw = data.encode()
    if len(raw) > DATA_MAX:
        raise HpvcError(what, f"mount options of {len(raw)} bytes, more than mount(2) takes")
    if _libc.mount(source.encode(), target.encode(), fstype.encode(), flags, raw) != 0:
        err = ctypes.get_errno()
        raise HpvcError(what, f"mount: {target}: {os.strerror(err).lower()}")

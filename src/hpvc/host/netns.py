"""Named network namespaces, made and entered by one thread, without a fork.

pyroute2 makes a namespace (``netns.create``) and opens a netlink socket
inside one (``IPRoute(netns=...)``) by forking the whole Python process and
passing the result back: about 10 ms each here, three per container node,
and the forks of nodes started side by side (``hpvc.concurrent``) queue on
each other. The kernel keeps a network namespace per thread, so a thread can
do the same by itself: ``unshare(CLONE_NEWNET)`` and bind-mount its own
namespace to make one; ``setns`` in and back out around opening a socket,
which stays in the namespace it was opened in (measured: about 2 ms). That is
why this is hand-written beside pyroute2, which still does the netlink work.

The mount follows iproute2's ``ip netns add``: ``/run/netns`` is made a
shared mount point (bound onto itself first where it is not one), so a
namespace mounted there is seen by mount namespaces made later.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(rc: int, what: str, path: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", path)


def _setns(fd: int, path: str) -> None:
    _check(_libc.setns(fd, CLONE_NEWNET), "setns", path)


@contextmanager
def entered(path: str) -> Iterator[None]:
    """This thread in the network namespace at ``path`` for the block, then
    back in the one it was in. Sockets opened inside stay in ``path``'s."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(fd, path)
        finally:
            os.close(fd)
        try:
            yield
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:  # cannot fail for root: say so loudly
                raise RuntimeError("could not return to the host's network namespace")
    finally:
        os.close(home)


def call_in(path: str, fn: Callable[[], T]) -> T:
    """``fn()`` with this thread in the namespace at ``path``."""
    with entered(path):
        return fn()


def _share(directory: str) -> None:
    """``directory`` as a shared mount point (iproute2's /run/netns set-up)."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    if _libc.mount(b"", directory.encode(), b"none", MS_SHARED | MS_REC, None) == 0:
        return
    d = directory.encode()
    _check(_libc.mount(d, d, b"none", MS_BIND | MS_REC, None), "bind", directory)
    _check(_libc.mount(b"", d, b"none", MS_SHARED | MS_REC, None), "make shared", directory)


def create(path: str) -> None:
    """A new, empty network namespace mounted at ``path`` (which must not exist)."""
    _share(os.path.dirname(path))
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0))
    failed: list[BaseException] = []

    def make() -> None:  # on a thread of its own: it stays in the new namespace
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare", path)
            me = b"/proc/thread-self/ns/net"
            _check(_libc.mount(me, path.encode(), b"none", MS_BIND, None), "mount", path)
        except BaseException as e:
            failed.append(e)

    t = threading.Thread(target=make, name="hpvc-netns")
    t.start()
    t.join()
    if failed:
        os.unlink(path)
        raise failed[0]


def remove(path: str) -> None:
    """Unmount (lazily) and unlink a namespace made by ``create``; gone is fine."""
    _libc.umount2(path.encode(), MNT_DETACH)
    with suppress(FileNotFoundError):
        os.unlink(path)

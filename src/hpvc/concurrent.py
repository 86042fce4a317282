"""Work on several nodes side by side (issue 16: ``up`` of 8 nodes was 8 times
one node's wait on netlink, mount and crun).

``each`` runs a function per item in a small thread pool. The calls must be
independent: each node has its own journal, folder, namespace, veth and
container, so each records and undoes its own changes (architecture rule 5 holds
per node). On the first failure nothing new starts; the calls already under
way finish (their journals complete) before the error is raised, so the
caller's rollback never races a node still being made. Ctrl-C and SIGTERM
(raised in the main thread, which waits here) do the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")

# Most of a node's start is waiting (fork/exec of crun and mount, netlink):
# more threads than CPUs pays; beyond about 8 they only contend.
WORKERS = 8


def each(items: Sequence[T], fn: Callable[[T], None], workers: int = WORKERS) -> None:
    """``fn(item)`` for every item, up to ``workers`` at a time; the first
    error (in the order of ``items``) is raised once nothing runs any more."""
    if len(items) <= 1 or workers <= 1:
        for item in items:
            fn(item)
        return
    pool = ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="hpvc")
    futures: list[Future[None]] = []
    try:
        futures = [pool.submit(fn, item) for item in items]
        wait(futures, return_when=FIRST_EXCEPTION)
    finally:
        for f in futures:
            f.cancel()  # those not started yet; the running ones finish
        pool.shutdown(wait=True)
    for f in futures:
        if not f.cancelled() and f.exception() is not None:
            raise f.exception()  # type: ignore[misc]

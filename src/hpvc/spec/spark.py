"""Spark's sizing rules, pure: how much of a node a Spark worker offers its executor.

The spec checks ``spark.worker_memory`` against them, the planner sizes the
workers with them, and ``hpvc.spark`` starts the daemons with the same
numbers; they live here, at the bottom of the layers, so that neither the
spec nor the planner depends on Spark's runtime (docs/architecture.md).
"""

from __future__ import annotations

from hpvc.errors import InputError

# The master's and each worker's own JVM heap (SPARK_DAEMON_MEMORY): both only
# keep book, 256 MiB is plenty for clusters of this size.
DAEMON_MEMORY_MIB = 256
OS_RESERVE_MIN_MIB = 512  # the node's kernel, init, sshd, page-cache headroom
JVM_OVERHEAD_MIN_MIB = 384  # an executor's memory beyond its heap (metaspace, threads, NIO)
MIN_WORKER_MIB = 512


def worker_memory_mib(node_memory_mib: int) -> int:
    """The memory a worker on a node of ``node_memory_mib`` offers its executor (its heap).

    The node keeps ``max(512 MiB, 10 %)`` for the OS and 256 MiB for the worker
    daemon; of the rest, the executor JVM needs ``max(384 MiB, 10 % of its
    heap)`` beyond the heap. Rounded down to 64 MiB.

    >>> worker_memory_mib(4096)
    2944
    >>> worker_memory_mib(16384)
    13120
    """
    os_reserve = max(OS_RESERVE_MIN_MIB, node_memory_mib // 10)
    rest = node_memory_mib - os_reserve - DAEMON_MEMORY_MIB
    heap = min(rest - JVM_OVERHEAD_MIN_MIB, rest * 10 // 11)
    heap -= heap % 64
    if heap < MIN_WORKER_MIB:
        raise InputError(
            f"spark worker on a {node_memory_mib} MiB node",
            f"leaves {max(heap, 0)} MiB for the executor, under {MIN_WORKER_MIB} MiB",
            "give the nodes at least 2 GiB of memory",
        )
    return heap

"""The Spark bench's node and worker sizes for the host it runs on (issue 33).

The defaults (``runner.NODE_MIB``: compute containers of 8 GiB, VMs of 4 GiB,
a head of 2 GiB, workers of 2944 MiB) need 18 GiB for one container
cluster; a host with less stopped at once ("compute1 needs 8GiB ...; host
can give at most 7875MiB"). So the nodes shrink to what the host can give
(its free memory as the planner counts it, less ``HOST_MARGIN_MIB`` for the
host and the native side's daemons, which stay up beside the clusters): a
whole cluster, head and ``WORKERS`` computes, must fit, as the planner
places it. A compute node smaller than 4 GiB also shrinks the workers (to
what such a node offers, ``spec.spark.worker_memory_mib``), and the native
workers with them: the two sides keep the same worker shape. The data sizes
asked by default are kept to what the workers' memory together holds (a
larger sort mostly measures spilling to disk, and takes long); sizes given
on the command line are kept. Everything scaled down is said in ``notes``.
Pure: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpvc.errors import InputError
from hpvc.spec.spark import worker_memory_mib

HOST_MARGIN_MIB = 1024  # the host itself and the native side's master and workers
MIN_NODE_MIB = 2048  # a worker of 896 MiB (spec.spark: under 2 GiB leaves too little)
STEP_MIB = 256
GIB = 1 << 30


@dataclass(frozen=True)
class Shape:
    """Node and worker memory for one run, and what was scaled down and why."""

    node_mib: dict[str, int]  # per kind of node: container, vm
    head_mib: int
    worker_mib: int
    sizes: list[int]  # bytes
    notes: tuple[str, ...] = ()


def fit(
    mem_mib: int,
    kinds: set[str],
    defaults: dict[str, int],
    head_mib: int,
    workers: int,
    sizes: list[int],
    sizes_given: bool,
) -> Shape:
    """The shape for a host that can give ``mem_mib``, for clusters of ``kinds``."""
    room = mem_mib - HOST_MARGIN_MIB - head_mib
    most = room // workers // STEP_MIB * STEP_MIB
    if kinds and most < MIN_NODE_MIB:
        need = head_mib + workers * MIN_NODE_MIB + HOST_MARGIN_MIB
        raise InputError(
            "bench spark",
            f"a cluster of a {head_mib} MiB head and {workers} computes of at least"
            f" {MIN_NODE_MIB} MiB, and {HOST_MARGIN_MIB} MiB for the host, needs {need} MiB;"
            f" this host can give {mem_mib} MiB",
            "free memory on the host, or run on a larger one",
        )
    notes: list[str] = []
    node = {}
    for kind in sorted(kinds):
        node[kind] = min(defaults[kind], most)
        if node[kind] < defaults[kind]:
            notes.append(
                f"{kind} compute nodes scaled down from {defaults[kind]} to {node[kind]} MiB:"
                f" a head of {head_mib} MiB and {workers} computes must fit in the"
                f" {mem_mib} MiB this host can give, less {HOST_MARGIN_MIB} MiB for the host"
            )
    worker = worker_memory_mib(4096)
    smallest = min(node.values(), default=4096)
    if smallest < 4096:
        worker = worker_memory_mib(smallest)
        notes.append(
            f"workers scaled down from {worker_memory_mib(4096)} to {worker} MiB (what a"
            f" {smallest} MiB node offers), native workers too: the same shape on both sides"
        )
    kept = list(sizes)
    if not sizes_given:
        hold = workers * worker * (1 << 20)
        kept = [s for s in sizes if s <= hold] or [min(sizes)]
        dropped = [s for s in sizes if s not in kept]
        if dropped:
            labels = ", ".join(f"{s // GIB} GiB" for s in dropped)
            notes.append(
                f"default size(s) {labels} left out: over the {hold >> 20} MiB the"
                f" {workers} workers hold (give --sizes to run them anyway)"
            )
    return Shape(node, head_mib, worker, kept, tuple(notes))

"""MPI between co-resident VM guests over their ivshmem region, through UCX (issue 29).

The VMs of a cluster that share a host share one ivshmem region
(``hpvc.backends.vm.guest.ivshmem_for``: on the plan's first host, with two or
more of the cluster's VMs there and ``tuning.locality = "shm"``; its id in
``hpvc.host.ivshmem``). Where the guests' image carries the UCX transport over it
(``hpvc.image.ucx``: ``libuct_ivshmem.so``, transport ``ivshmem``), ``hpvc run``
and Slurm tasks in the guests choose it without the user asking: Open MPI's
``pml ucx`` (``OMPI_MCA_pml=ucx``; Open MPI 4.1 takes UCX only for the
InfiniBand-like devices ``pml_ucx_tls``/``pml_ucx_devices`` name, so both are
``any``) and MPICH's ch4:ucx (Debian's MPICH has no other device) get the
module by ``LD_PRELOAD`` (UCX 1.13 loads only the modules it was built with: a
``UCX_MODULE_DIR`` of ours is not searched for new names) and ``UCX_TLS`` =
``self,sm,ivshmem,tcp`` with ``UCX_MAX_RNDV_LANES=0`` (the rendezvous of
large messages over the same lane as the rest, never a TCP lane beside the
region's): shared
memory inside a guest, the region between co-resident guests (reachable only
when both map the same region: the transport compares the id in the region's
header), TCP over the cluster network for everything else and whenever the
region is absent or full. A cluster with no region keeps MPI's defaults
(Open MPI's TCP BTL, MPICH over UCX's defaults): nothing here is set.

What each pair of ranks should use follows from the placement (``pairs``): the
same node, shared memory; two nodes that map the region, ``ivshmem``; else
``tcp``. ``hpvc run --verbose`` prints it and sets ``UCX_LOG_LEVEL=info`` (on
stderr: ``UCX_LOG_FILE=stderr``), so that each rank's UCX says which transports
its endpoints use (``ep_cfg[N]: tag(ivshmem/... )``): the placement's word, then
UCX's own.

Decisions here are pure but for ``region_of``, which reads hpvc's region ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpvc.host import ivshmem
from hpvc.image import ucx as image_ucx
from hpvc.plan import Plan, PlannedNode

SAME_NODE = "sm"
REGION = image_ucx.TRANSPORT  # "ivshmem"
NETWORK = "tcp"
UCX_TLS = f"self,{SAME_NODE},{REGION},{NETWORK}"
# Open MPI: UCX for point-to-point whatever the devices (its defaults want mlx5/verbs)
OMPI_UCX = {
    "OMPI_MCA_pml": "ucx",
    "OMPI_MCA_pml_ucx_tls": "any",
    "OMPI_MCA_pml_ucx_devices": "any",
}
# each rank's UCX prints its endpoints' lanes, on stderr (UCX logs to stdout by default)
VERBOSE_ENV = {"UCX_LOG_LEVEL": "info", "UCX_LOG_FILE": "stderr"}


@dataclass(frozen=True)
class Choice:
    """What a job over a cluster's guests gets: its environment and what to say."""

    env: dict[str, str] = field(default_factory=dict)  # empty: MPI's own defaults
    lines: tuple[str, ...] = ()  # for --verbose

    @property
    def chosen(self) -> bool:
        return bool(self.env)

    def env_list(self) -> tuple[str, ...]:
        return tuple(f"{k}={v}" for k, v in self.env.items())


def region_of(state_root: Path, cluster: str) -> str | None:
    """The id of the ivshmem region ``cluster`` holds on this host ("3"), or None."""
    path = ivshmem.find(state_root, cluster)
    if path is None or not path.name.startswith(ivshmem.PREFIX):
        return None
    return path.name[len(ivshmem.PREFIX) :]


def sharing(plan: Plan, region: str | None) -> dict[str, str]:
    """Node -> the region it maps: every node on the plan's first host, where
    ``ivshmem_for`` puts the region (none without a region)."""
    if region is None or not plan.hosts:
        return {}
    host = plan.hosts[0].name
    return {n.name: region for n in plan.nodes if n.host == host}


def transport(a: str, b: str, regions: dict[str, str]) -> str:
    """What ranks on nodes ``a`` and ``b`` should use, by placement."""
    if a == b:
        return SAME_NODE
    ra, rb = regions.get(a), regions.get(b)
    return REGION if ra is not None and ra == rb else NETWORK


def _ranks(first: int, count: int) -> str:
    return f"rank {first}" if count == 1 else f"ranks {first}-{first + count - 1}"


def pairs(layout: list[tuple[PlannedNode, int]], regions: dict[str, str]) -> list[str]:
    """``ranks 0-1 (compute0) <-> ranks 2-3 (compute1): ivshmem``: each pair of
    nodes of the job (and each node's own ranks, where it has two or more)."""
    starts, at = [], 0
    for node, count in layout:
        starts.append((node, at, count))
        at += count
    out = []
    for i, (a, first_a, count_a) in enumerate(starts):
        if count_a > 1:
            where = f"{_ranks(first_a, count_a)} ({a.name})"
            out.append(f"{where} among themselves: {SAME_NODE}")
        for b, first_b, count_b in starts[i + 1 :]:
            t = transport(a.name, b.name, regions)
            left = f"{_ranks(first_a, count_a)} ({a.name})"
            out.append(f"{left} <-> {_ranks(first_b, count_b)} ({b.name}): {t}")
    return out


def choose(
    layout: list[tuple[PlannedNode, int]],
    regions: dict[str, str],
    verdict: image_ucx.Verdict | None,
    image: str,
    verbose: bool = False,
) -> Choice:
    """The job's UCX environment and the lines ``--verbose`` prints (``verdict``:
    the image's, needed only where the job's nodes share a region)."""
    used = {r for n, _ in layout if (r := regions.get(n.name)) is not None}
    if len([n for n, _ in layout if n.name in regions]) < 2:
        line = "no ivshmem region between the job's nodes: MPI's own transports"
        return Choice({}, (line,))
    lines = [verdict.describe(image)] if verdict is not None else []
    if verdict is None or not verdict.ok:
        lines.append(f"the guests share region {min(used)}, but cannot use it: TCP")
        return Choice({}, tuple(lines))
    env = {
        **OMPI_UCX,
        "LD_PRELOAD": image_ucx.GUEST_MODULE,
        "UCX_TLS": UCX_TLS,
        # no rendezvous lanes: the region has no zero-copy get/put, so UCX made TCP
        # the rendezvous lane of a pair it reaches over the region (the first guest
        # run: ``tag(ivshmem/ivshmem tcp/eth0)``, 69 MB of a ping-pong on eth0);
        # large messages then go as active messages over the region too
        "UCX_MAX_RNDV_LANES": "0",
        **(VERBOSE_ENV if verbose else {}),
    }
    lines += [f"UCX_TLS={UCX_TLS} (region {', '.join(sorted(used))})"]
    lines += pairs(layout, regions)
    if verbose:
        lines.append("UCX_LOG_LEVEL=info: each rank's UCX names its endpoints' transports")
    return Choice(env, tuple(lines))


def for_job(
    state_root: Path, plan: Plan, layout: list[tuple[PlannedNode, int]], verbose: bool = False
) -> Choice:
    """``choose`` for a job over ``layout``'s nodes of the running cluster ``plan``
    (the image's verdict read from its root filesystem only where it matters)."""
    regions = sharing(plan, region_of(state_root, plan.cluster))
    shared = [n for n, _ in layout if n.name in regions]
    verdict = None
    if len(shared) >= 2:
        from hpvc.image import resolve_image  # the image store only when it matters

        verdict = image_ucx.verdict(resolve_image(plan.image).rootfs)
    return choose(layout, regions, verdict, plan.image, verbose)


def job_argv(
    state_root: Path,
    plan: Plan,
    layout: list[tuple[PlannedNode, int]],
    argv: list[str],
    verbose: bool,
    progress: Callable[[str], None],
) -> list[str]:
    """``argv`` with ``for_job``'s variables in front (``env K=V ... CMD``: the one way
    into ranks that every launcher passes on as it is), said on ``progress``;
    with ``verbose``, each pair of nodes' transport too."""
    choice = for_job(state_root, plan, layout, verbose)
    if choice.chosen:
        progress(f"mpi: UCX over the guests' ivshmem region ({UCX_TLS})")
        argv = ["env", *choice.env_list(), *argv]
    for line in choice.lines if verbose else ():
        progress(f"mpi transport: {line}")
    return argv

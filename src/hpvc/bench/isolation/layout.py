"""The isolation experiment's clusters: the HPC node's and the tenant's specs per config.

``idle`` is the HPC cluster alone, placed as in ``partitioned``; ``partitioned``
pins the HPC node (whole sockets where the host has one to spare for the
tenant, else a core or a hyper-thread of its own); ``shared`` lets both float.
The tenant's spec is the same in both loaded configurations; only the HPC
cluster's tuning differs. Which partitioning a host allows is asked of the
planner by the runner (``isolation.runner.partitioning``); everything here is pure.
"""

from __future__ import annotations

from dataclasses import dataclass

NODE = "compute0"  # the one node of either cluster
HPC_MEMORY = "512MiB"
TENANT_MEMORY = "256MiB"


def spec_text(name: str, subnet: str, tuning: dict[str, str], vcpus: int, memory: str) -> str:
    """A one-node container cluster (``compute0``), no hugepages."""
    lines = [f'name = "{name}"', 'kind = "container"', 'image = "hpc"', "[network]"]
    lines += [f'subnet = "{subnet}"', "[tuning]", 'hugepages = "none"']
    lines += [f'{k} = "{v}"' for k, v in tuning.items()]
    lines += ["[[nodes]]", 'role = "compute"', "count = 1", f"vcpus = {vcpus}"]
    lines.append(f'memory = "{memory}"')
    return "\n".join(lines) + "\n"


def hpc_spec(name: str, subnet: str, pinning: str, partition: str, vcpus: int) -> str:
    tuning = {"pinning": pinning, "partition": partition, "locality": "shm"}
    return spec_text(name, subnet, tuning, vcpus, HPC_MEMORY)


def tenant_spec(name: str, subnet: str, host_cpus: int) -> str:
    """The commodity tenant: as many floating vCPUs as the host has CPUs."""
    tuning = {"pinning": "shared", "partition": "commodity", "locality": "none"}
    return spec_text(name, subnet, tuning, host_cpus, TENANT_MEMORY)


@dataclass(frozen=True)
class Partitioning:
    """How ``partitioned`` keeps the HPC node apart on this host."""

    partition: str  # the HPC cluster's: hpc (whole sockets) or commodity (a pinned core)
    vcpus: int  # the HPC node's: a whole core (hyper-thread siblings too), else one thread

    @property
    def mode(self) -> str:
        return "hpc" if self.partition == "hpc" else "dedicated"


def candidates(threads_per_core: int) -> list[Partitioning]:
    """From the strongest separation down: whole sockets, a pinned core, a pinned
    hyper-thread (a one-core host); the first that fits beside the tenant wins."""
    core = threads_per_core
    return [
        Partitioning("hpc", core),
        Partitioning("commodity", core),
        Partitioning("commodity", 1),
    ]


def describe(p: Partitioning, threads: int) -> dict[str, str]:
    if p.mode == "hpc":
        where = (
            "partition hpc: the HPC cluster holds its socket(s) whole, the tenant floats over"
            " the other sockets (seed 002's set-up)"
        )
    else:
        unit = "core" if p.vcpus == threads else "hyper-thread (its sibling stays shared)"
        where = (
            "no socket to spare for the tenant here, so no hpc partition (it would hold the"
            f" only socket and leave the tenant nothing): the HPC node is pinned to a {unit}"
            " of its own (partition commodity) and the tenant floats over the CPUs hpvc left"
            " it; caches and memory bandwidth of the socket stay shared"
        )
    return {
        "idle": "the HPC node alone (placed as in partitioned), no tenant",
        "partitioned": f"HPC node pinned (pinning dedicated); {where}; competing load",
        "shared": "HPC node and tenant both float (pinning shared, partition commodity), the"
        " tenant over every CPU the HPC node may use; the kernel shares them by cgroup weight"
        " (cpu.shares 1024 per vCPU) and CFS quota (vCPUs x period); competing load",
    }


@dataclass(frozen=True)
class Layout:
    hpc: str  # TOML of the HPC cluster
    tenant: str | None  # TOML of the commodity tenant; None: the HPC cluster alone
    load: bool


def layouts(
    p: Partitioning, host_cpus: int, names: tuple[str, str], subnets: tuple[str, str]
) -> dict[str, Layout]:
    """The clusters of each configuration; only the HPC cluster's tuning differs."""
    pinned = hpc_spec(names[0], subnets[0], "dedicated", p.partition, p.vcpus)
    floating = hpc_spec(names[0], subnets[0], "shared", "commodity", p.vcpus)
    tenant = tenant_spec(names[1], subnets[1], host_cpus)
    return {
        "idle": Layout(pinned, None, False),
        "partitioned": Layout(pinned, tenant, True),
        "shared": Layout(floating, tenant, True),
    }

"""The cluster spec schema (pydantic). Every key is documented in docs/spec.md."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from hpvc.errors import HpvcError
from hpvc.units import parse_size

MIB = 1024 * 1024
HUGEPAGE_KIB = {"none": 0, "2M": 2048, "1G": 1048576}
# Checked with fullmatch: `$` alone would let "name\n" through.
NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,14}")
IMAGE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
# A node's writable layer (docs/spec.md, `disk`): room for packages, logs and
# a job's scratch, small enough that a few nodes fit beside the images.
DISK_DEFAULT_MIB = 4096
# A container node's normal memory (memory - hugepage_memory) at least: its
# programs' stacks, heaps and page cache live there, not in hugepages.
MIN_NORMAL_MIB = 64
DISK_MIN_MIB = 64
DISK_MAX_MIB = 16 << 20


def _to_mib(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("a memory size must be a string such as '2GiB' or '512MiB'")
    if isinstance(value, int):
        raise ValueError(f"write the unit: '{value}MiB' or '{value}GiB', not a bare number")
    size = parse_size(value)
    if size % MIB:
        raise ValueError(f"{value!r} is not a whole number of MiB")
    return size // MIB


def _disk_to_mib(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("a disk size must be a string such as '4GiB' or '512MiB'")
    if isinstance(value, int) or value.strip().isdigit():
        raise ValueError(f"write the unit: '{value}GiB' or '{value}MiB', not a bare number")
    try:
        size = parse_size(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a size (write e.g. '4GiB' or '512MiB')") from None
    if size % MIB:
        raise ValueError(f"{value!r} is not a whole number of MiB")
    if not DISK_MIN_MIB <= size // MIB <= DISK_MAX_MIB:
        raise ValueError(f"{value!r} is out of range: give 64MiB to 16TiB")
    return size // MIB


def _to_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("a rate must be a string such as '50MB' or a number of bytes")
    return parse_size(value)


MiB = Annotated[int, BeforeValidator(_to_mib)]
DiskMiB = Annotated[int, BeforeValidator(_disk_to_mib)]
Rate = Annotated[int, BeforeValidator(_to_bytes)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IOLimits(Strict):
    """Block-I/O limits of each node of a group (per device, bytes/s and IO/s)."""

    read_bps: Rate | None = Field(default=None, gt=0)
    write_bps: Rate | None = Field(default=None, gt=0)
    read_iops: int | None = Field(default=None, gt=0)
    write_iops: int | None = Field(default=None, gt=0)
    weight: int | None = Field(default=None, ge=1, le=1000)


class NodeGroup(Strict):
    role: Literal["head", "compute", "storage"]
    count: int = Field(default=1, ge=0, le=100000)
    vcpus: int = Field(default=1, ge=1, le=1024)
    memory: MiB = Field(default=1024, ge=64)
    # Of `memory`, what a container node gets as hugepages (the rest is normal
    # memory); None: 0 for containers. VM nodes: all of it (guest RAM).
    hugepage_memory: MiB | None = Field(default=None, ge=0)
    pinning: Literal["dedicated", "shared"] | None = None
    io: IOLimits | None = None
    disk: DiskMiB = DISK_DEFAULT_MIB


class Network(Strict):
    subnet: str = "10.88.0.0/24"
    # None: 9000 on one host; across hosts the most the fabric carries (hpvc.plan.overlay)
    mtu: int | None = Field(default=None, ge=1280, le=65520)

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str) -> str:
        try:
            net = ipaddress.IPv4Network(v, strict=True)
        except ValueError as e:
            raise ValueError(f"{v!r} is not an IPv4 network such as '10.88.0.0/24' ({e})") from e
        if net.prefixlen > 30:
            raise ValueError(f"{v!r} is too small: use a /30 or larger network")
        return str(net)

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)


class Tuning(Strict):
    pinning: Literal["dedicated", "shared"] = "dedicated"
    hugepages: Literal["none", "2M", "1G"] = "2M"
    numa: Literal["mirror", "none"] = "mirror"
    partition: Literal["hpc", "commodity"] = "hpc"
    locality: Literal["shm", "none"] = "shm"

    @property
    def hugepage_kib(self) -> int:
        return HUGEPAGE_KIB[self.hugepages]


# Absolute, no '..', and not where a node's system lives.
SHARED_PATH_RE = re.compile(r"(/[A-Za-z0-9._-]+)+")
SYSTEM_DIRS = frozenset(
    [
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/lib",
        "/lib64",
        "/proc",
        "/run",
        "/sbin",
        "/sys",
        "/tmp",
        "/usr",
        "/var",
    ]
)


def _shared_size(value: object) -> int:
    return _disk_to_mib(value)


class Demand(Strict):
    """What a cluster asks of its shared storage's disk (bytes/s; docs/io.md):
    the coordinator gives it no more than this, and the rest to others."""

    read: Rate | None = Field(default=None, gt=0)
    write: Rate | None = Field(default=None, gt=0)


class Shared(Strict):
    """The cluster-wide shared directory (docs/storage.md)."""

    # "host": a host folder bound into every node (one host only, no server);
    # "nfs": exported over NFS by the storage node (or the head) to the subnet.
    server: Literal["host", "nfs"] = "host"
    path: str = "/shared"
    size: Annotated[int, BeforeValidator(_shared_size)] | None = None  # MiB; None: a folder
    keep: bool = False
    demand: Demand | None = None  # nfs: the storage bandwidth it asks (docs/io.md)

    @model_validator(mode="after")
    def _demand_needs_nfs(self) -> Shared:
        if self.demand is not None and self.server != "nfs":
            raise ValueError(
                "demand needs server = 'nfs': only an NFS shared directory has a"
                " storage side whose bandwidth is shared out"
            )
        return self

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        parts = v.split("/")
        if not SHARED_PATH_RE.fullmatch(v) or ".." in parts or "." in parts:
            raise ValueError(f"{v!r} is not an absolute folder path such as '/shared'")
        if "/" + parts[1] in SYSTEM_DIRS:
            raise ValueError(
                f"{v!r} is inside the node's system ({'/' + parts[1]}); use e.g. /shared"
            )
        return v


class Spark(Strict):
    """Apache Spark standalone on the cluster (docs/spark.md): the head runs the
    master, every compute node a worker sized from its vCPUs and memory."""

    master_port: int = Field(default=7077, ge=1024, le=65535)
    ui_port: int = Field(default=8080, ge=1024, le=65535)
    # What each worker offers its executor (SPARK_WORKER_MEMORY); default: all the
    # node's memory leaves. Less leaves the rest to the node's page cache.
    worker_memory: MiB | None = None


class Spec(Strict):
    name: str
    kind: Literal["container", "vm"] = "container"
    image: str = "hpc"
    # A name in hpvc.backends.registry (checked there, before any host change:
    # the spec does not know the backends); unset, the kind's default.
    backend: str | None = None
    network: Network = Network()
    tuning: Tuning = Tuning()
    nodes: list[NodeGroup] = Field(min_length=1)
    shared: Shared = Shared()
    spark: Spark | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a cluster name: use 1-15 lowercase letters, digits or '-',"
                " starting with a letter"
            )
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not IMAGE_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not an image name: use lowercase letters, digits, '.-_'")
        return v

    @model_validator(mode="after")
    def _whole(self) -> Spec:
        page_mib = self.tuning.hugepage_kib // 1024
        for i, g in enumerate(self.nodes):
            if self.kind == "vm" and "disk" in g.model_fields_set:
                raise ValueError(
                    f'nodes[{i}].disk: applies to kind = "container" only (a VM\'s disk'
                    " is its image's, docs/vms.md); remove it"
                )
            if page_mib and g.memory % page_mib:
                raise ValueError(
                    f"nodes[{i}].memory: {g.memory}MiB is not a multiple of the"
                    f" {self.tuning.hugepages} hugepage size"
                )
            self._check_hugepage_memory(i, g)
        total = sum(g.count for g in self.nodes)
        hosts = self.network.network.num_addresses - 3  # network, gateway, broadcast
        if total > hosts:
            raise ValueError(
                f"network.subnet: {self.network.subnet} has room for {hosts} nodes,"
                f" the spec asks for {total}"
            )
        if total == 0:
            raise ValueError("nodes: every group has count = 0; give at least one node")
        self._check_services()
        return self

    def hugepage_mib(self, g: NodeGroup) -> int:
        """MiB of a node of ``g`` backed by hugepages: all of a VM's memory (its
        guest RAM), ``hugepage_memory`` of a container's (default 0); none
        without hugepages."""
        if not self.tuning.hugepage_kib:
            return 0
        if self.kind == "vm":
            return g.memory
        return g.hugepage_memory or 0

    def _check_hugepage_memory(self, i: int, g: NodeGroup) -> None:
        h = g.hugepage_memory
        if h is None:
            return
        if self.kind == "vm":
            raise ValueError(
                f'nodes[{i}].hugepage_memory: applies to kind = "container" only (a VM\'s'
                " memory is all hugepages); remove it"
            )
        page_mib = self.tuning.hugepage_kib // 1024
        if h and not page_mib:
            raise ValueError(
                f'nodes[{i}].hugepage_memory: tuning.hugepages = "none"; set a page size'
                " or remove hugepage_memory"
            )
        if page_mib and h % page_mib:
            raise ValueError(
                f"nodes[{i}].hugepage_memory: {h}MiB is not a multiple of the"
                f" {self.tuning.hugepages} hugepage size"
            )
        if g.memory - h < MIN_NORMAL_MIB:
            raise ValueError(
                f"nodes[{i}].hugepage_memory: {h}MiB leaves {g.memory - h}MiB of the"
                f" node's {g.memory}MiB as normal memory; leave at least {MIN_NORMAL_MIB}MiB"
                " (raise memory or lower hugepage_memory)"
            )

    def _check_services(self) -> None:
        if self.shared.server == "host" and self.shared.size is not None:
            raise ValueError('shared.size: applies to server = "nfs" only; remove it')
        if self.spark is None:
            return
        roles = {g.role for g in self.nodes if g.count}
        if "head" not in roles or "compute" not in roles:
            raise ValueError(
                "spark: needs a head node (the master) and compute nodes (the workers)"
            )
        if self.spark.master_port == self.spark.ui_port:
            raise ValueError("spark: master_port and ui_port must differ")
        from hpvc.spec.spark import MIN_WORKER_MIB, worker_memory_mib

        for i, g in enumerate(self.nodes):
            if g.role == "compute" and g.count:
                try:
                    most = worker_memory_mib(g.memory)
                except HpvcError as e:
                    raise ValueError(f"nodes[{i}].memory: {e.why}; {e.fix}") from None
                want = self.spark.worker_memory
                if want is not None and not MIN_WORKER_MIB <= want <= most:
                    raise ValueError(
                        f"spark.worker_memory: {want}MiB does not fit a {g.memory}MiB node"
                        f" (nodes[{i}]): want {MIN_WORKER_MIB}MiB to {most}MiB"
                    )

    def pinning_of(self, group: NodeGroup) -> str:
        return group.pinning or self.tuning.pinning

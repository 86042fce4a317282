"""Slurm policy that needs no host access: site rules, the spec carried in
the job's environment, the job's subnet and memory. How a cluster is split
over a job's hosts is hpvc.slurm.shares (re-exported here). Light to import:
``hpvc node check`` runs in every srun/sbatch."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import pwd
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpvc.errors import InputError
from hpvc.plan.planner import expand
from hpvc.slurm.shares import (
    hosts_text,
    job_hosts,
    parse_share_name,
    restrict,
    share_name,
    share_overlay,
    split,
    task_pool,
)
from hpvc.spec import Spec, parse_spec
from hpvc.spec.limits import DEFAULT as DEFAULT_LIMITS
from hpvc.spec.limits import Limits

__all__ = [  # the shares' functions are used through this module too
    "Site",
    "check",
    "check_memory",
    "check_spec",
    "decode_spec",
    "encode_spec",
    "for_job",
    "hosts_text",
    "job_hosts",
    "job_prefixlen",
    "job_subnet",
    "load",
    "memory_row",
    "parse_share_name",
    "restrict",
    "share_memory",
    "share_name",
    "share_overlay",
    "split",
    "task_pool",
]

SPEC_ENV = "HPVC_SPEC_B64"  # the spec travels base64-encoded in the job's environment
MAX_SPEC_BYTES = 64 * 1024
DEFAULT_SUBNETS = ("10.88.0.0/16",)
# Images a site allows when it names none: the one hpvc builds itself. A site
# lists every other image it has vetted (images=a,b); there is no "any".
DEFAULT_IMAGES = ("hpc",)
# Node kinds a site may allow: containers by default; VMs (a QEMU per node, root's,
# booted per job) only where the site says kinds=container,vm.
KINDS = ("container", "vm")
JOB_PREFIXLEN = 24  # each job's subnet, at least, cut from the site's pool
YES, NO = ("yes", "true", "1"), ("no", "false", "0")


@dataclass(frozen=True)
class Site:
    """What the site allows (plugstack.conf arguments, passed on by the plugin)."""

    images: tuple[str, ...] = DEFAULT_IMAGES
    kinds: tuple[str, ...] = ("container",)
    subnets: tuple[str, ...] = DEFAULT_SUBNETS  # the pool jobs' subnets are cut from
    binds: tuple[str, ...] = ()  # host directories every node sees at the same path
    # A job's own network.subnet (inside the pool) instead of one cut for it.
    user_subnets: bool = False
    # io.weight in a spec: switches the host disk's I/O scheduler to bfq for everyone.
    io_weight: bool = False
    # slurm.conf counts every hardware thread as a core (nodes given as CPUs=<PUs>
    # alone): Slurm's core numbers are then hardware threads (hpvc.slurm.cpus).
    threads_as_cores: bool = False
    # What one job's spec may ask (nodes in all, groups, disk per node): checked
    # by arithmetic before any node is expanded (hpvc.spec.limits); and what the
    # host keeps of a node's console log (max_console).
    limits: Limits = DEFAULT_LIMITS
    # Checkpoints of jobs (docs/checkpoint.md "Under Slurm"): the folder every
    # host sees where each job's go ("" none: no checkpoints, no restore), the
    # shortest period a job may ask, and the command reaching another host as
    # root (called as COMMAND HOST ARGV..., like ssh; "" ssh -o BatchMode=yes).
    checkpoints: str = ""
    checkpoint_min_s: int = 300
    checkpoint_via: str = ""

    @classmethod
    def parse(cls, items: Sequence[str]) -> Site:
        """``key=value`` items, as in plugstack.conf; an unknown key is an error."""
        site = cls()
        for item in items:
            key, sep, value = item.partition("=")
            values = tuple(v for v in value.split(",") if v)
            if not sep or not values:
                raise InputError(f"site setting {item!r}", "not key=value", "e.g. images=hpc")
            if key == "images":
                site = replace(site, images=values)
            elif key == "kinds":
                bad = [v for v in values if v not in KINDS]
                if bad:
                    raise InputError(
                        f"site setting kinds={value}",
                        f"{bad[0]!r} is not a kind of node",
                        "kinds=container or kinds=container,vm",
                    )
                site = replace(site, kinds=values)
            elif key == "subnets":
                for v in values:
                    try:
                        ipaddress.ip_network(v)
                    except ValueError:
                        raise InputError(
                            f"site setting subnets={value}", f"{v!r} is not a network", ""
                        ) from None
                site = replace(site, subnets=values)
            elif key in ("user_subnets", "io_weight", "threads_as_cores"):
                if len(values) != 1 or values[0] not in YES + NO:
                    raise InputError(f"site setting {item!r}", "not yes or no", f"{key}=no")
                on = values[0] in YES
                if key == "user_subnets":
                    site = replace(site, user_subnets=on)
                elif key == "io_weight":
                    site = replace(site, io_weight=on)
                else:
                    site = replace(site, threads_as_cores=on)
            elif key in ("max_nodes", "max_groups", "max_disk", "max_console"):
                if len(values) != 1:
                    raise InputError(f"site setting {item!r}", "one value", f"{key}=1024")
                where = f"site setting {item!r}"
                site = replace(site, limits=site.limits.with_item(key, values[0], where))
            elif key in ("checkpoints", "checkpoint_via"):
                if len(values) != 1 or not values[0].startswith("/"):
                    raise InputError(f"site setting {item!r}", "not an absolute path",
                                     f"{key}=/shared/hpvc-checkpoints")  # fmt: skip
                if key == "checkpoints":
                    site = replace(site, checkpoints=values[0])
                else:
                    site = replace(site, checkpoint_via=values[0])
            elif key == "checkpoint_min":
                if len(values) != 1 or not values[0].isdigit() or int(values[0]) < 1:
                    raise InputError(f"site setting {item!r}", "not seconds", "checkpoint_min=300")
                site = replace(site, checkpoint_min_s=int(values[0]))
            elif key == "binds":
                for v in values:
                    if not v.startswith("/") or not Path(v).is_dir():
                        raise InputError(
                            f"site setting binds={value}", f"{v!r} is not an absolute directory", ""
                        )
                site = replace(site, binds=values)
            else:
                raise InputError(
                    f"site setting {key!r}",
                    "unknown",
                    "known: images, kinds, subnets, binds, user_subnets, io_weight,"
                    " threads_as_cores, max_nodes, max_groups, max_disk, max_console,"
                    " checkpoints, checkpoint_min, checkpoint_via",
                )
        return site


# ---- the spec: read as the user at submit time, carried in the job's env ----


def encode_spec(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def decode_spec(value: str) -> str:
    try:
        raw = base64.b64decode(value.encode(), validate=True)
        return raw.decode()
    except (binascii.Error, UnicodeDecodeError):
        raise InputError(
            SPEC_ENV, "is not a base64-encoded spec", "submit with --hpvc=SPEC.toml"
        ) from None


def load(text: str, origin: str, site: Site) -> tuple[Spec, dict[str, Any]]:
    """Parse and check a spec against the site's rules; exit-2 errors name the fix."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise InputError(origin, f"larger than {MAX_SPEC_BYTES} bytes", "a spec is a small file")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(origin, f"not valid TOML: {e}", "fix the syntax") from None
    fix = "ask less, or the site raises it (plugstack.conf: max_nodes=, max_groups=, max_disk=)"
    spec = parse_spec(doc, origin, site.limits, fix)
    if spec.kind not in site.kinds:
        raise InputError(
            f"{origin}: kind = {spec.kind!r}",
            "this site runs Slurm jobs only in " + ", ".join(site.kinds) + " nodes",
            f'kind = "{site.kinds[0]}", or the site allows it: kinds='
            + ",".join((*site.kinds, spec.kind))
            + " in plugstack.conf",
        )
    if spec.image not in site.images:
        raise InputError(
            f"{origin}: image = {spec.image!r}",
            "not allowed on this site",
            "use one of: " + ", ".join(site.images),
        )
    if spec.shared.server != "host" or spec.spark is not None:
        # Only specs with NFS or Spark pay the backends' import (issue 33).
        from hpvc.cluster.backends import services_across_hosts

        services_across_hosts(spec, origin)  # what the spec's nodes serve across hosts
    if spec.shared.server == "nfs" and spec.shared.keep:
        raise InputError(
            f"{origin}: shared.keep = true",
            "a Slurm job's shared directory ends with the job",
            "remove keep, and copy what the job leaves to a directory the site shares (binds=)",
        )
    weighted = [g.role for g in spec.nodes if g.io is not None and g.io.weight is not None]
    if weighted and not site.io_weight:
        raise InputError(
            f"{origin}: io.weight of the {weighted[0]} nodes",
            "a weight switches the host disk's I/O scheduler to bfq for every user,"
            " and this site does not allow it",
            "remove io.weight (read_bps/write_bps limits are allowed)",
        )
    if site.user_subnets:
        net = spec.network.network
        allowed = [ipaddress.ip_network(s) for s in site.subnets]
        if not any(net.version == a.version and net.subnet_of(a) for a in allowed):
            raise InputError(
                f"{origin}: network.subnet = {net}",
                "outside the networks this site gives virtual clusters",
                "pick a subnet inside " + ", ".join(site.subnets),
            )
    else:
        job_prefixlen(spec, site)  # the pool can hold the spec's cluster
    return spec, doc


# ---- the job's subnet, cut from the site's pool ----------------------------


def job_prefixlen(spec: Spec, site: Site, hosts: int | None = None) -> int:
    """The prefix length of the subnet a job of ``spec`` gets: /24, or larger
    where its nodes, the gateway and one address per host (at most one per
    node) do not fit."""
    nodes = sum(g.count for g in spec.nodes)  # arithmetic: nothing expanded
    need = nodes + 2 + (hosts or nodes) + 1  # network, gateway, hosts, broadcast
    prefix = JOB_PREFIXLEN
    while prefix > 8 and 2 ** (32 - prefix) < need:
        prefix -= 1
    if not any(ipaddress.ip_network(p).prefixlen <= prefix for p in site.subnets):
        raise InputError(
            f"a cluster of {nodes} nodes",
            f"needs a /{prefix}, larger than any network of this site's pool"
            f" ({', '.join(site.subnets)})",
            "use fewer nodes",
        )
    return prefix


def job_subnet(spec: Spec, site: Site, job: int, hosts: int) -> ipaddress.IPv4Network:
    """The job's own subnet: the pool cut into blocks of ``job_prefixlen``,
    block ``job`` modulo their number. Every host of the job computes the same
    one with nothing shared; two jobs on one host meet only if the site runs
    more jobs at once than its pool has blocks (refused on that host)."""
    prefix = job_prefixlen(spec, site, hosts)
    pools = [ipaddress.IPv4Network(p) for p in site.subnets]
    counts = [2 ** (prefix - p.prefixlen) if p.prefixlen <= prefix else 0 for p in pools]
    k = job % sum(counts)
    for pool, count in zip(pools, counts, strict=True):
        if k < count:
            size = 2 ** (32 - prefix)
            return ipaddress.IPv4Network((int(pool.network_address) + k * size, prefix))
        k -= count
    raise AssertionError("unreachable: k < sum(counts)")


def for_job(
    spec: Spec, doc: dict[str, Any], site: Site, job: int, hosts: int
) -> tuple[Spec, dict[str, Any]]:
    """The spec as the job runs it: its subnet cut from the site's pool, unless
    the site lets users choose (``user_subnets=yes``)."""
    if site.user_subnets:
        return spec, doc
    subnet = str(job_subnet(spec, site, job, hosts))
    network = spec.network.model_copy(update={"subnet": subnet})
    doc = {**doc, "network": {**doc.get("network", {}), "subnet": subnet}}
    return spec.model_copy(update={"network": network}), doc


# ---- memory: what Slurm gave the job on a host -----------------------------


def share_memory(spec: Spec, hosts: int) -> list[int]:
    """MiB of the virtual nodes each host of a ``hosts``-host job runs (their
    memory limits, or the hugepages backing them)."""
    memory = {w.name: w.memory_mib for w, _ in expand(spec)}
    return [sum(memory[n] for n in share) for share in split(spec, hosts)]


MAX_MEMORY_ROW = 1024  # host counts `hpvc node check` reports the memory need of


def memory_row(spec: Spec) -> list[int]:
    """For a job of 1, 2, ... hosts (at most one per node, MAX_MEMORY_ROW), the
    MiB its biggest host share needs: the plugin compares it with the job's
    memory once srun has the allocation, without starting hpvc again."""
    n = min(len(expand(spec)), MAX_MEMORY_ROW)
    return [max(share_memory(spec, h)) for h in range(1, n + 1)]


def check_memory(spec: Spec, hosts: int, mem_mib: int, where: str = "per host") -> None:
    """Refuse a job whose biggest host share needs more memory than Slurm gave
    it on a host (``mem_mib``; 0 = Slurm does not allocate memory here)."""
    if mem_mib <= 0:
        return
    need = share_memory(spec, hosts)
    worst = max(range(len(need)), key=lambda i: need[i])
    if need[worst] > mem_mib:
        names = ", ".join(split(spec, hosts)[worst])
        raise InputError(
            f"--mem: the job has {mem_mib} MiB {where}",
            f"the virtual nodes of its host {worst} ({names}) need {need[worst]} MiB",
            f"ask for --mem={need[worst]}M or give the nodes less memory",
        )


def check(path: Path, site: Site, hosts: int = 0, mem_mib: int = 0) -> str:
    """Read and check a spec (as the submitting user); return it encoded for the
    job. With the job's ``hosts`` and memory per host (``mem_mib``), also check
    that every host's share fits in what Slurm gave the job."""
    return check_spec(path, site, hosts, mem_mib)[0]


def check_spec(path: Path, site: Site, hosts: int = 0, mem_mib: int = 0) -> tuple[str, Spec]:
    """``check``, and the parsed spec."""
    try:
        text = path.read_text()
    except PermissionError as e:
        why = e.strerror or str(e)
        fix = f"let the submitting user read it, e.g. chmod a+r {path}"
        raise InputError(f"--hpvc={path}", why, fix) from None
    except OSError as e:
        why = e.strerror or str(e)
        raise InputError(f"--hpvc={path}", why, "give a readable spec file") from None
    spec, _ = load(text, str(path), site)
    if hosts > 0:
        split(spec, hosts)
        check_memory(spec, hosts, mem_mib)
    return encode_spec(text), spec


def job_user(uid: int, gid: int) -> dict[str, Any] | None:
    """The job's user as a share's record keeps it (``ClusterRecord.user``: uid,
    gid, name as this host's passwd says, else ``uid<N>``); None when the
    plugin did not say (uid -1)."""
    if uid < 0:
        return None
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid{uid}"
    return {"uid": uid, "gid": gid if gid >= 0 else uid, "name": name}

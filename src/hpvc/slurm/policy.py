"""Slurm policy that needs no host access: site rules, the spec carried in
the job's environment, how a cluster is split over a job's hosts, which nodes
tasks run in. Light to import: ``hpvc node check`` runs in every srun/sbatch."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import hostlist  # type: ignore[import-untyped]

from hpvc.errors import DoesNotFit, InputError
from hpvc.plan.addresses import node_ip, node_mac
from hpvc.plan.overlay import Overlay, Vtep, host_address, node_mtu, vni_for
from hpvc.plan.planner import expand
from hpvc.spec import Spec, parse_spec
from hpvc.topology.model import Core, NumaNode, Package, Topology

SPEC_ENV = "HPVC_SPEC_B64"  # the spec travels base64-encoded in the job's environment
MAX_SPEC_BYTES = 64 * 1024
DEFAULT_SUBNETS = ("10.88.0.0/16",)
# Images a site allows when it names none: the one hpvc builds itself. A site
# lists every other image it has vetted (images=a,b); there is no "any".
DEFAULT_IMAGES = ("hpc",)
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
                bad = [v for v in values if v != "container"]
                if bad:
                    raise InputError(
                        f"site setting kinds={value}",
                        f"{bad[0]!r} nodes cannot run Slurm tasks yet",
                        "kinds=container",
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
                    " threads_as_cores",
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
    spec = parse_spec(doc, origin)
    if spec.kind not in site.kinds:
        raise InputError(
            f"{origin}: kind = {spec.kind!r}",
            "this site runs Slurm jobs only in " + ", ".join(site.kinds) + " nodes",
            'kind = "container"',
        )
    if spec.image not in site.images:
        raise InputError(
            f"{origin}: image = {spec.image!r}",
            "not allowed on this site",
            "use one of: " + ", ".join(site.images),
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
    nodes = len(expand(spec))
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
    except OSError as e:
        why = e.strerror or str(e)
        raise InputError(f"--hpvc={path}", why, "give a readable spec file") from None
    spec, _ = load(text, str(path), site)
    if hosts > 0:
        split(spec, hosts)
        check_memory(spec, hosts, mem_mib)
    return encode_spec(text), spec


# ---- splitting the cluster over the job's hosts ---------------------------


def split(spec: Spec, hosts: int) -> list[list[str]]:
    """Virtual node names per host: spec order, blocks as even as possible."""
    names = [w.name for w, _ in expand(spec)]
    if hosts > len(names):
        raise DoesNotFit(
            f"the job has {hosts} hosts but the spec {len(names)} virtual node(s)",
            f"ask for at most {len(names)} node(s) (-N {len(names)}) or add nodes to the spec",
        )
    base, extra = divmod(len(names), hosts)
    out: list[list[str]] = []
    start = 0
    for i in range(hosts):
        size = base + (1 if i < extra else 0)
        out.append(names[start : start + size])
        start += size
    return out


def share_name(job: int, index: int) -> str:
    return f"j{job}-{index}"


def parse_share_name(name: str) -> tuple[int, int] | None:
    """(job, index) of a share's cluster name, None for any other cluster."""
    job, sep, index = name[1:].partition("-")
    if name[:1] != "j" or not sep or not (job.isdigit() and index.isdigit()):
        return None
    return int(job), int(index)


def task_pool(share: Sequence[str], roles: dict[str, str]) -> list[str]:
    """The nodes local tasks run in, in order: local task ``t`` runs in
    ``pool[t % len(pool)]`` (the plugin does the modulo). The share's compute
    nodes, or all its nodes if it has none."""
    return [n for n in share if roles[n] == "compute"] or list(share)


def restrict(topo: Topology, cpus: set[int]) -> Topology:
    """The topology as the job sees it: only the CPUs Slurm gave it."""
    keep = set(topo.online_cpus) & cpus
    if not keep:
        raise InputError(
            "job CPUs", f"none of {sorted(cpus)} is online here", "check the Slurm node's CPUs"
        )
    packages = tuple(
        Package(
            id=p.id,
            numa_nodes=p.numa_nodes,
            cores=tuple(
                Core(id=c.id, cpus=tuple(x for x in c.cpus if x in keep))
                for c in p.cores
                if any(x in keep for x in c.cpus)
            ),
        )
        for p in topo.packages
    )
    nodes = tuple(
        NumaNode(
            id=n.id,
            cpus=tuple(x for x in n.cpus if x in keep),
            memory_mib=n.memory_mib,
            free_mib=n.free_mib,
            hugepages=n.hugepages,
        )
        for n in topo.numa_nodes
    )
    return Topology(
        packages=tuple(p for p in packages if p.cores),
        numa_nodes=nodes,
        online_cpus=tuple(sorted(keep)),
        notes=topo.notes,
    )


def job_hosts(nodelist: str) -> list[str]:
    """The job's hosts in Slurm's order, from its node list (``n[1-3],gpu07``)."""
    return [str(h) for h in hostlist.expand_hostlist(nodelist)] if nodelist else []


def share_overlay(
    spec: Spec, job: int, index: int, hosts: Sequence[str], addresses: Sequence[str], mtu: int
) -> Overlay:
    """How host ``index`` of a job joins the job's cluster network: the job's VNI,
    every other host's fabric address with the (name, ip, mac) of its share's
    nodes, and the node MTU the fabric's ``mtu`` leaves. The gateway address
    lives on the first host only; the others' bridges get addresses from the
    top of the subnet, which no node may reach."""
    shares = split(spec, len(hosts))
    net = spec.network.network
    where = {w.name: w.index for w, _ in expand(spec)}
    remotes = tuple(
        Vtep(
            host=hosts[i],
            address=addresses[i],
            nodes=tuple(
                (n, node_ip(net, where[n]), node_mac(share_name(job, i), net, where[n]))
                for n in shares[i]
            ),
        )
        for i in range(len(hosts))
        if i != index
    )
    lowest = min(
        (ipaddress.IPv4Address(host_address(net, i)) for i in range(1, len(hosts))), default=None
    )
    last = ipaddress.IPv4Address(node_ip(net, max(where.values())))
    if lowest is not None and last >= lowest:
        raise InputError(
            f"network.subnet = {net}",
            f"too small for {len(where)} nodes and the addresses of {len(hosts)} hosts",
            "give the spec a larger subnet",
        )
    return Overlay(
        vni=vni_for(f"slurm-job-{job}"),
        local=addresses[index],
        remotes=remotes,
        mtu=node_mtu(mtu, spec.network.mtu),
        bridge_address=host_address(net, index),
    )


def hosts_text(spec: Spec, job: int) -> str:
    """/etc/hosts for every node of the whole cluster, not only this share's."""
    lines = ["127.0.0.1\tlocalhost", f"# hpvc cluster {spec.name} of Slurm job {job}"]
    lines += [f"{node_ip(spec.network.network, w.index)}\t{w.name}" for w, _ in expand(spec)]
    return "\n".join(lines) + "\n"

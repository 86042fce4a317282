"""An HPC workload beside a CPU-hungry commodity tenant: idle, partitioned, shared.

The isolation experiment of seed 002 (Figure 5: mean and standard deviation
of HPC benchmarks under competing commodity load), on hpvc containers. The
HPC workload is one ``hpcc`` process (``hpvc run HPC -n 1 -- hpcc``, problem
size ``HPCC_N``); each sample is one hpcc run and yields its HPL and single
DGEMM rates (GFLOP/s) and its single STREAM Triad (GB/s, best of 10 trials).
The commodity tenant is a second hpvc cluster running one busy loop per vCPU,
started with ``crun exec`` inside its container, so its cgroups (cpuset, cpu
shares, CFS quota) confine it like any tenant's work.

Three configurations, measured in one run, the order rotating every
repetition; each visit brings its clusters up, takes ``samples_per_config``
samples and brings them down:

- ``idle``: the HPC cluster alone, placed as in ``partitioned``;
- ``partitioned``: the HPC node pinned (``pinning = "dedicated"``) and, where
  the host has a socket to spare for the tenant, ``partition = "hpc"`` (the
  cluster holds whole sockets, the tenant gets the others: seed 002's
  set-up). On a one-socket host an hpc partition leaves the tenant nothing,
  so there the HPC node is pinned to a core of its own (partition
  ``commodity``) and the tenant floats over the CPUs hpvc left it: CPUs are
  apart, caches and memory bandwidth of the socket are still shared;
- ``shared``: both float (``pinning = "shared"``, partition ``commodity``), the
  tenant over every CPU the HPC node may use (all of them on a one-node host):
  the kernel shares them by cgroup weight and CFS quota.

The tenant's spec is the same in both loaded configurations; only the HPC
cluster's tuning differs. Partitions keep hpvc's clusters apart, not the
host's other processes (``/hpvc`` is not an exclusive cpuset), so every
sample also records the CPUs the HPC node, the tenant (proof that the load
competed) and the rest of the host used while it ran.

The document: ``samples`` is the flat list other code reads, one row per
sample and metric (``rep``: the repetition, ``order``: the sample's place in
the whole run); ``summary[config][metric]``: n, mean, stdev (sample), min,
median, max and mean and stdev relative to idle's; ``goals``: per metric,
partitioned stdev within 2x of idle's; ``load``, ``visits``: the evidence.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpvc.backends import container as ct
from hpvc.bench import common, hpcc
from hpvc.bench.stats import summary
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.state import Store
from hpvc.errors import DoesNotFit, HpvcError, InputError, MissingDependency
from hpvc.host import cgroups
from hpvc.host.blkio import read_text
from hpvc.host.command import at
from hpvc.host.probe import cgroup_layout
from hpvc.image import resolve_image
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.reservations import reservations_from_plans
from hpvc.spec import parse_spec
from hpvc.topology import Topology, read_topology

Progress = Callable[[str], None]

SUITE = "isolation"
CONFIGS = ("idle", "partitioned", "shared")
LOADED = ("partitioned", "shared")
NODE = "compute0"
HPC_MEMORY = "512MiB"
TENANT_MEMORY = "256MiB"
HPCC_N = 1800  # about 3.5 s per hpcc run on an idle core here (HPL about 0.7 s of it)
HPCC_NB = 80  # HPL block size (as in Debian's example input)
MIN_N, MAX_N = 100, 5000  # the HPC node has HPC_MEMORY; hpcc takes about 8 N^2 bytes
WARMUP_S = 1.0  # the load runs this long before the first sample of a visit
GOAL_STDEV_RATIO = 2.0
MIN_LOAD_CPUS = 0.25  # the tenant must burn this many CPUs in every loaded sample (idle: ~0)
LOAD_SCRIPT = 'i=0; while [ "$i" -lt {n} ]; do (while :; do :; done) & i=$((i+1)); done; wait'
LOAD_DESCRIBE = (
    "one busy loop (sh -c 'while :; do :; done') per tenant vCPU, the tenant having as many"
    " vCPUs as the host has CPUs, started by crun exec inside the tenant's container"
)


@dataclass(frozen=True)
class Metric:
    name: str
    field: str  # key in hpcc's summary section
    unit: str
    scale: float  # field * scale = value in unit


METRICS = (
    Metric("HPL", "HPL_Tflops", "GFLOP/s", 1000.0),
    Metric("DGEMM", "SingleDGEMM_Gflops", "GFLOP/s", 1.0),
    Metric("STREAM_Triad", "SingleSTREAM_Triad", "GB/s", 1.0),
)


def _quiet(_: str) -> None:
    pass


# --- pure: specs, layouts, statistics -------------------------------------------------


def spec_text(name: str, subnet: str, tuning: dict[str, str], vcpus: int, memory: str) -> str:
    """A one-node container cluster (``compute0``), no hugepages."""
    lines = [f'name = "{name}"', 'kind = "container"', 'image = "hpc"', "[network]"]
    lines += [f'subnet = "{subnet}"', "[tuning]", 'hugepages = "none"']
    lines += [f'{k} = "{v}"' for k, v in tuning.items()]
    lines += ["[[nodes]]", 'role = "compute"', "count = 1", f"vcpus = {vcpus}"]
    lines.append(f'memory = "{memory}"')
    return "\n".join(lines) + "\n"


def threads_per_core(topo: Topology) -> int:
    return max((len(c.cpus) for p in topo.packages for c in p.cores), default=1)


def hpc_spec(name: str, subnet: str, pinning: str, partition: str, vcpus: int) -> str:
    tuning = {"pinning": pinning, "partition": partition, "locality": "shm"}
    return spec_text(name, subnet, tuning, vcpus, HPC_MEMORY)


def tenant_spec(name: str, subnet: str, topo: Topology) -> str:
    """The commodity tenant: as many floating vCPUs as the host has CPUs."""
    tuning = {"pinning": "shared", "partition": "commodity", "locality": "none"}
    return spec_text(name, subnet, tuning, len(topo.online_cpus), TENANT_MEMORY)


def parse_text(text: str) -> Any:
    return parse_spec(tomllib.loads(text))


def plan_pair(hpc: str, tenant: str | None, topo: Topology) -> tuple[Plan, Plan | None]:
    """Plan the HPC cluster, then the tenant beside it, as ``hpvc up`` would in order."""
    hosts = [("local", topo)]
    a = plan_cluster(parse_text(hpc), hosts)
    if tenant is None:
        return a, None
    res = reservations_from_plans([a], dict(hosts))
    return a, plan_cluster(parse_text(tenant), hosts, res)


@dataclass(frozen=True)
class Partitioning:
    """How ``partitioned`` keeps the HPC node apart on this host."""

    partition: str  # the HPC cluster's: hpc (whole sockets) or commodity (a pinned core)
    vcpus: int  # the HPC node's: a whole core (hyper-thread siblings too), else one thread

    @property
    def mode(self) -> str:
        return "hpc" if self.partition == "hpc" else "dedicated"


def partitioning(topo: Topology) -> Partitioning:
    """The strongest separation with room left for the tenant: whole sockets, else a
    pinned core, else a pinned hyper-thread (a one-core host)."""
    core = threads_per_core(topo)
    tenant = tenant_spec("probetenant", "10.0.1.0/24", topo)
    for partition, vcpus in (("hpc", core), ("commodity", core), ("commodity", 1)):
        hpc = hpc_spec("probehpc", "10.0.0.0/24", "dedicated", partition, vcpus)
        try:
            plan_pair(hpc, tenant, topo)
        except DoesNotFit:
            continue
        return Partitioning(partition, vcpus)
    raise InputError(
        "bench isolation",
        f"{len(topo.online_cpus)} CPU(s) cannot hold a pinned HPC node and a tenant apart",
        "run it on a host with at least 2 CPUs",
    )


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
    p: Partitioning, topo: Topology, names: tuple[str, str], subnets: tuple[str, str]
) -> dict[str, Layout]:
    """The clusters of each configuration; only the HPC cluster's tuning differs."""
    pinned = hpc_spec(names[0], subnets[0], "dedicated", p.partition, p.vcpus)
    floating = hpc_spec(names[0], subnets[0], "shared", "commodity", p.vcpus)
    tenant = tenant_spec(names[1], subnets[1], topo)
    return {
        "idle": Layout(pinned, None, False),
        "partitioned": Layout(pinned, tenant, True),
        "shared": Layout(floating, tenant, True),
    }


def stats(values: list[float]) -> dict[str, float]:
    """mean, sample standard deviation (0 for one value), min, median, max."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "stdev": sd, **summary(values)}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize(samples: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """config -> metric -> n and stats, with mean and stdev relative to idle's."""
    values: dict[str, dict[str, list[float]]] = {}
    for s in samples:
        values.setdefault(s["config"], {}).setdefault(s["metric"], []).append(float(s["value"]))
    out: dict[str, dict[str, dict[str, Any]]] = {
        c: {m: {"n": len(v), **stats(v)} for m, v in per.items()} for c, per in values.items()
    }
    for per_metric in out.values():
        for m, d in per_metric.items():
            idle = out.get("idle", {}).get(m)
            d["rel_mean_vs_idle"] = _ratio(d["mean"], idle["mean"]) if idle else None
            d["rel_stdev_vs_idle"] = _ratio(d["stdev"], idle["stdev"]) if idle else None
    return out


def goals(summ: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for m in METRICS:
        rel = summ.get("partitioned", {}).get(m.name, {}).get("rel_stdev_vs_idle")
        out.append(
            {
                "metric": m.name,
                "config": "partitioned",
                "stdev_vs_idle_at_most": GOAL_STDEV_RATIO,
                "value": rel,
                "met": rel is not None and rel <= GOAL_STDEV_RATIO,
            }
        )
    return out


def parse_hpcc(text: str, n: int) -> dict[str, float]:
    """Metric name -> value from hpccoutf.txt's last summary, which must be for our N
    (proof hpcc read our input) and successful; every metric must be a positive rate."""
    fields = hpcc.summary_fields(text)
    if fields.get("HPL_N") != str(n):
        raise HpvcError("hpcc", f"ran N={fields.get('HPL_N')}, not {n}", "hpccinf.txt unread?")
    if fields.get("Success") != "1":
        raise HpvcError("hpcc", "reports Success != 1 (a check failed)", "run hpcc by hand")
    out: dict[str, float] = {}
    for m in METRICS:
        try:
            value = float(fields[m.field]) * m.scale
        except (KeyError, ValueError):
            raise HpvcError("hpcc", f"summary has no number for {m.field}", "") from None
        if not value > 0:
            raise HpvcError("hpcc", f"{m.field} = {fields[m.field]} (not a rate)", "")
        out[m.name] = value
    return out


def load_cpus(cpu_s: float | None, wall_s: float) -> float | None:
    """Average number of CPUs busy over ``wall_s`` (None when unknown)."""
    return cpu_s / wall_s if cpu_s is not None and wall_s > 0 else None


# --- host side: preflight, cgroup counters, clusters, load ---------------------------


def preflight(repeat: int, samples_per_config: int, hpcc_n: int = HPCC_N) -> None:
    """Refuse bad settings (exit 2) and a host without root, crun or Open MPI."""
    if repeat < 1 or samples_per_config < 1 or repeat * samples_per_config < 2:
        raise InputError(
            f"--repeat {repeat} --samples {samples_per_config}",
            "a standard deviation needs at least 2 samples per configuration",
            "--repeat 3 --samples 3",
        )
    if not MIN_N <= hpcc_n <= MAX_N:
        raise InputError(f"hpcc N {hpcc_n}", f"not from {MIN_N} to {MAX_N}", f"N = {HPCC_N}")
    common.require("bench isolation", ["crun", "mpirun.openmpi", "ip"])


def check_image(progress: Progress) -> None:
    common.ensure_image("hpc", progress)
    if not (resolve_image("hpc").rootfs / "usr/bin/hpcc").exists():
        raise MissingDependency(
            "image 'hpc'", "has no /usr/bin/hpcc", "hpvc image rm hpc && hpvc image build hpc"
        )


def cpu_seconds(cluster: str, node: str, root: Path = Path("/")) -> float | None:
    """CPU time the node's cgroup used so far (v1 cpuacct.usage, v2 cpu.stat); None: unknown."""
    layout = cgroup_layout(root)
    rel = cgroups.node_path(cluster, node).lstrip("/")
    acct = layout.v1.get("cpuacct")
    if acct:
        text = read_text(at(root, acct) / rel / "cpuacct.usage")
        return int(text) / 1e9 if text and text.isdigit() else None
    if layout.v2_path is not None:
        for line in (read_text(at(root, layout.v2_path) / rel / "cpu.stat") or "").splitlines():
            k, _, v = line.partition(" ")
            if k == "usage_usec" and v.strip().isdigit():
                return int(v) / 1e6
    return None


def host_cpu_seconds(root: Path = Path("/")) -> tuple[float | None, float | None]:
    """Busy and stolen CPU seconds of the whole host so far, from /proc/stat."""
    first = (read_text(at(root, "/proc/stat")) or "").split("\n", 1)[0].split()
    if len(first) < 9 or first[0] != "cpu":
        return None, None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


def _delta(a: float | None, b: float | None) -> float | None:
    return b - a if a is not None and b is not None else None


def run_hpcc(store: Store, name: str, n: int) -> dict[str, float]:
    """One hpcc run in the HPC node (``hpvc run NAME -n 1``); its rates."""
    out = store.cluster_dir(name) / "shared" / "hpccoutf.txt"
    out.unlink(missing_ok=True)
    r = ops.run(name, ["sh", "-c", "cd /shared && exec hpcc"], 1, store, capture=True)
    if isinstance(r, int):  # capture=True always gives the process; for mypy
        raise HpvcError("hpcc in the HPC node", f"exit code {r}")
    if r.returncode != 0:
        said = [x.strip() for x in f"{r.stderr}\n{r.stdout}".splitlines() if x.strip()]
        why = f"exit code {r.returncode}" + (f": {said[-1]}" if said else "")
        raise HpvcError("hpcc in the HPC node", why, f"hpvc run {name} -n 1 -- hpcc")
    try:
        text = out.read_text()
    except OSError as e:
        raise HpvcError("hpcc", f"no output file: {e}", "run it by hand") from None
    return parse_hpcc(text, n)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for our crun exec; kill it (by its PID, via the handle) if it lingers."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def cluster(tmp: Path, store: Store, text: str, load: bool, progress: Progress) -> Iterator[str]:
    """Bring one cluster up (its load started, if asked); down again on leaving."""
    name = str(tomllib.loads(text)["name"])
    spec = tmp / f"{name}.toml"
    spec.write_text(text)
    progress(f"{name}: up")
    lifecycle.up(str(spec), store)
    proc: subprocess.Popen[bytes] | None = None
    try:
        if load:
            n = len(store.get(name).the_plan().node(NODE).vcpus)
            argv = ct.exec_argv(ct.container_id(name, NODE), ["sh", "-c", LOAD_SCRIPT.format(n=n)])
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield name
    finally:
        progress(f"{name}: down")
        try:
            lifecycle.down(name, store)  # the container goes, and every loop in it
        finally:
            if proc is not None:
                _reap(proc)


@dataclass
class Run:
    """What one benchmark run accumulates."""

    tmp: Path
    store: Store
    layouts: dict[str, Layout]
    parting: Partitioning
    threads: int
    samples_per_config: int
    hpcc_n: int
    progress: Progress = _quiet
    samples: list[dict[str, Any]] = field(default_factory=list)
    load: list[dict[str, Any]] = field(default_factory=list)
    visits: list[dict[str, Any]] = field(default_factory=list)


def _read_cpus(cluster: str | None) -> str | None:
    if cluster is None:
        return None
    try:
        return str(cgroups.read_node_limits(cluster, NODE).get("cpus"))
    except (HpvcError, OSError):
        return None


def counters(hpc: str, tenant: str | None, root: Path = Path("/")) -> dict[str, float | None]:
    """CPU seconds so far: the HPC node's, the tenant's, the whole host's (busy, stolen)."""
    busy, steal = host_cpu_seconds(root)
    return {
        "hpc": cpu_seconds(hpc, NODE, root),
        "tenant": cpu_seconds(tenant, NODE, root) if tenant else None,
        "host": busy,
        "steal": steal,
    }


def load_row(
    where: dict[str, Any], wall: float, before: dict[str, float | None], after: dict[str, Any]
) -> dict[str, Any]:
    """CPUs each side used on average during a sample; ``other_cpus``: the rest of the host."""
    d = {k: _delta(before[k], after.get(k)) for k in before}
    cpus = {k: load_cpus(v, wall) for k, v in d.items()}
    known = [cpus["host"], cpus["hpc"]]
    other = (
        max(0.0, known[0] - known[1] - (cpus["tenant"] or 0.0))
        if known[0] is not None and known[1] is not None
        else None
    )
    return {
        **where,
        "wall_s": wall,
        "tenant_cpu_s": d["tenant"],
        "tenant_cpus": cpus["tenant"],
        "hpc_cpu_s": d["hpc"],
        "hpc_cpus": cpus["hpc"],
        "host_busy_cpus": cpus["host"],
        "steal_cpus": cpus["steal"],
        "other_cpus": other,
        "loadavg_1m": os.getloadavg()[0],
    }


def sample_rows(where: dict[str, Any], rates: dict[str, float]) -> list[dict[str, Any]]:
    """The shared interface: one flat row per metric."""
    return [
        {
            "suite": SUITE,
            "config": where["config"],
            "metric": m.name,
            "unit": m.unit,
            "higher_is_better": True,
            "rep": where["rep"],
            "order": where["order"],
            "value": rates[m.name],
        }
        for m in METRICS
    ]


def _sample(r: Run, config: str, rep: int, hpc: str, tenant: str | None) -> None:
    """One hpcc run; its rates, and the CPU time both clusters used meanwhile."""
    where = {"config": config, "rep": rep, "order": len(r.load)}
    before = counters(hpc, tenant)
    w0 = time.perf_counter()
    rates = run_hpcc(r.store, hpc, r.hpcc_n)
    wall = time.perf_counter() - w0
    r.load.append(load_row(where, wall, before, counters(hpc, tenant)))
    r.samples += sample_rows(where, rates)


def visit(r: Run, config: str, rep: int) -> None:
    """Bring the configuration's clusters up, take its samples, bring them down."""
    lay = r.layouts[config]
    with cluster(r.tmp, r.store, lay.hpc, False, r.progress) as hpc:
        inf = r.store.cluster_dir(hpc) / "shared" / "hpccinf.txt"
        inf.write_text(hpcc.input_text(r.hpcc_n, HPCC_NB, 1, 1))
        with _maybe_tenant(r, lay) as tenant:
            r.visits.append(
                {"config": config, "rep": rep, "hpc_cpus": _read_cpus(hpc)}
                | {"tenant_cpus": _read_cpus(tenant), "load": lay.load}
            )
            if lay.load:
                time.sleep(WARMUP_S)
            for i in range(r.samples_per_config):
                r.progress(f"repetition {rep + 1}: {config} sample {i + 1}")
                _sample(r, config, rep, hpc, tenant)


@contextmanager
def _maybe_tenant(r: Run, lay: Layout) -> Iterator[str | None]:
    if lay.tenant is None:
        yield None
        return
    with cluster(r.tmp, r.store, lay.tenant, lay.load, r.progress) as name:
        yield name


def rotations(repeat: int) -> list[list[str]]:
    """The configurations' order in each repetition (rotated, so none always goes first)."""
    n = len(CONFIGS)
    return [list(CONFIGS[i % n :] + CONFIGS[: i % n]) for i in range(repeat)]


LOAD_KEYS = ("hpc_cpus", "tenant_cpus", "other_cpus", "steal_cpus", "loadavg_1m")


def load_summary(load: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per configuration: CPUs the HPC node, the tenant and the rest of the host used."""
    out: dict[str, dict[str, Any]] = {}
    for config in CONFIGS:
        rows = [x for x in load if x["config"] == config]
        out[config] = {"samples": len(rows)}
        for k in LOAD_KEYS:
            vals = [float(x[k]) for x in rows if x.get(k) is not None]
            out[config][k] = stats(vals) if vals else None
    return out


def load_verified(load: list[dict[str, Any]]) -> bool:
    """Every loaded sample saw the tenant burn at least MIN_LOAD_CPUS CPUs."""
    rows = [x for x in load if x["config"] in LOADED]
    return bool(rows) and all(
        x["tenant_cpus"] is not None and x["tenant_cpus"] >= MIN_LOAD_CPUS for x in rows
    )


def document(facts: dict[str, Any], r: Run, repeat: int, wall: float) -> dict[str, Any]:
    summ = summarize(r.samples)
    texts = {c: [x for x in (lay.hpc, lay.tenant) if x] for c, lay in r.layouts.items()}
    desc = describe(r.parting, r.threads)
    return {
        "suite": SUITE,
        **facts,
        "repeat": repeat,
        "samples_per_config": r.samples_per_config,
        "wall_s": wall,
        "loadavg_end": list(os.getloadavg()),
        "workload": f"hpcc, 1 process, N = {r.hpcc_n} (hpvc run HPC -n 1 -- hpcc)",
        "hpcc_n": r.hpcc_n,
        "competing_load": LOAD_DESCRIBE,
        "partition_mode": r.parting.mode,
        "hpc_vcpus": r.parting.vcpus,
        "metrics": [
            {"metric": m.name, "unit": m.unit, "higher_is_better": True, "hpcc": m.field}
            for m in METRICS
        ],
        "configs": {c: {"describe": desc[c], "specs": texts[c]} for c in CONFIGS},
        "samples": r.samples,
        "load": r.load,
        "visits": r.visits,
        "summary": summ,
        "load_summary": load_summary(r.load),
        "load_verified": load_verified(r.load),
        "min_load_cpus": MIN_LOAD_CPUS,
        "goals": goals(summ),
    }


def run(
    repeat: int = 3,
    samples_per_config: int = 3,
    progress: Progress = _quiet,
    hpcc_n: int = HPCC_N,
) -> dict[str, Any]:
    """Each configuration ``samples_per_config`` times per repetition, ``repeat`` repetitions
    (the order rotating); ``hpcc_n``: hpcc's problem size (smaller is faster). Returns the
    results document (see the module's docstring)."""
    preflight(repeat, samples_per_config, hpcc_n)
    check_image(progress)
    facts = common.host_facts()
    t0 = time.perf_counter()
    topo = read_topology("/")
    parting = partitioning(topo)
    pid = os.getpid() % 100000
    names = (f"bi{pid}h", f"bi{pid}c")
    with common.scratch_state("bench isolation", progress) as (tmp, store):
        a, b = common.free_subnets(2)
        lays = layouts(parting, topo, names, (a, b))
        threads = threads_per_core(topo)
        r = Run(tmp, store, lays, parting, threads, samples_per_config, hpcc_n, progress)
        for rep, order in enumerate(rotations(repeat)):
            for config in order:
                visit(r, config, rep)
        progress("tearing down")
    return document(facts, r, repeat, time.perf_counter() - t0)


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _load_cell(ls: dict[str, Any], key: str) -> str:
    s = ls.get(key)
    return "-" if not s else f"{s['mean']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def _cpusets(doc: dict[str, Any], config: str) -> str:
    seen = [v for v in doc["visits"] if v["config"] == config]
    if not seen:
        return "-"
    sets = sorted({f"{v['hpc_cpus']} / {v['tenant_cpus'] or '-'}" for v in seen})
    return ", ".join(sets)


def report_md(doc: dict[str, Any]) -> str:
    """Markdown: per metric and configuration mean, stdev, min/median/max and vs idle;
    the goals; what the competing load and the rest of the host burned."""
    lines = [
        f"Isolation (seed 002, Figure 5): {doc['workload']}, {doc['repeat']} repetitions x"
        f" {doc['samples_per_config']} samples per configuration, order rotating, on"
        f" {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs), kernel {doc['kernel']},"
        f" {doc.get('open_mpi', '')}, {doc['crun']}, {doc['date']}; {doc['wall_s']:.0f} s in all.",
        "",
        "| metric | config | n | mean | stdev | min | median | max | mean vs idle"
        " | stdev vs idle |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in doc["metrics"]:
        for c in doc["summary"]:
            s = doc["summary"][c].get(m["metric"])
            if s is None:
                continue
            cells = [f"{m['metric']} ({m['unit']})", c, str(s["n"])]
            cells += [_f(s[k]) for k in ("mean", "stdev", "min", "median", "max")]
            cells += [_f(s["rel_mean_vs_idle"]), _f(s["rel_stdev_vs_idle"])]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Goals (higher is better for every metric):"]
    for g in doc["goals"]:
        verdict = "met" if g["met"] else "NOT met"
        lines.append(
            f"- {g['metric']}: {g['config']} stdev <= {g['stdev_vs_idle_at_most']:.1f} x idle's:"
            f" {verdict} ({_f(g['value'])})"
        )
    ok = "yes" if doc["load_verified"] else "NO"
    lines += [
        "",
        f"Competing load: {doc['competing_load']}. Verified (the tenant's cgroup burned"
        f" >= {doc['min_load_cpus']} CPUs during every loaded sample): {ok}.",
        "CPUs used during the samples, mean (min-max), from the cgroups' CPU time and"
        " /proc/stat; 'rest of host' is everything else on the machine (other users),"
        " 'stolen' is time the hypervisor took from this VM:",
        "",
        "| config | HPC node | tenant | rest of host | stolen | load avg 1 min"
        " | cpuset HPC / tenant |",
        "|---|---|---|---|---|---|---|",
    ]
    for c, ls in doc["load_summary"].items():
        cells = [c, *(_load_cell(ls, k) for k in LOAD_KEYS), _cpusets(doc, c)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Partition mode on this host: {doc['partition_mode']}."]
    lines += [f"- {c}: {cfg['describe']}" for c, cfg in doc["configs"].items()]
    return "\n".join(lines) + "\n"

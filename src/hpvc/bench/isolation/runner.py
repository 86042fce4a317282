"""An HPC workload beside a CPU-hungry commodity tenant: idle, partitioned, shared.

The isolation experiment of seed 002 (Figure 5: mean and standard deviation
of HPC benchmarks under competing commodity load), on hpvc containers. The
HPC workload is one ``hpcc`` process (``hpvc run HPC -n 1 -- hpcc``, problem
size ``HPCC_N``); each sample is one hpcc run and yields its HPL and single
DGEMM rates (GFLOP/s) and its single STREAM Triad (GB/s, best of 10 trials).
The commodity tenant is a second hpvc cluster running one busy loop per vCPU,
started with ``crun exec`` inside its container (``ops.exec_argv``), so its cgroups (cpuset, cpu
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

Partitions keep hpvc's clusters apart, not the host's other processes
(``/hpvc`` is not an exclusive cpuset), so every sample also records the CPUs
the HPC node, the tenant (proof that the load competed) and the rest of the
host used while it ran (``cluster.inspect`` for a node's, ``host.usage`` for the host's).

This module runs the experiment; the specs are ``isolation.layout``'s, the
numbers ``isolation.stats``' and the document and report ``isolation.report``'s.
"""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.hpcc.input import input_text
from hpvc.bench.isolation.layout import (
    NODE,
    Layout,
    Partitioning,
    candidates,
    hpc_spec,
    layouts,
    tenant_spec,
)
from hpvc.bench.isolation.report import Outcome, document
from hpvc.bench.isolation.stats import load_row, parse_hpcc, rotations, sample_rows
from hpvc.cluster import inspect, lifecycle, ops
from hpvc.cluster.inspect import HostView
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host import usage
from hpvc.image import resolve_image
from hpvc.progress import Progress, quiet
from hpvc.store import Store

HPCC_N = 1800  # about 3.5 s per hpcc run on an idle core here (HPL about 0.7 s of it)
HPCC_NB = 80  # HPL block size (as in Debian's example input)
MIN_N, MAX_N = 100, 5000  # the HPC node has HPC_MEMORY; hpcc takes about 8 N^2 bytes
WARMUP_S = 1.0  # the load runs this long before the first sample of a visit
LOAD_SCRIPT = 'i=0; while [ "$i" -lt {n} ]; do (while :; do :; done) & i=$((i+1)); done; wait'


def partitioning(host: HostView) -> Partitioning:
    """The strongest separation with room left for the tenant: whole sockets, else a
    pinned core, else a pinned hyper-thread (a one-core host)."""
    tenant = tenant_spec("probetenant", "10.0.1.0/24", host.cpus)
    for p in candidates(host.threads_per_core):
        hpc = hpc_spec("probehpc", "10.0.0.0/24", "dedicated", p.partition, p.vcpus)
        if inspect.why_not_fit([hpc, tenant], host) is None:
            return p
    raise InputError(
        "bench isolation",
        f"{host.cpus} CPU(s) cannot hold a pinned HPC node and a tenant apart",
        "run it on a host with at least 2 CPUs",
    )


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


def counters(hpc: str, tenant: str | None) -> dict[str, float | None]:
    """CPU seconds so far: the HPC node's, the tenant's, the whole host's (busy, stolen)."""
    busy, steal = usage.host_cpu_seconds()
    return {
        "hpc": inspect.node_cpu_seconds(hpc, NODE),
        "tenant": inspect.node_cpu_seconds(tenant, NODE) if tenant else None,
        "host": busy,
        "steal": steal,
    }


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
    """Wait for our exec into the node; kill it (by its PID, via the handle) if it lingers."""
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
            argv = ops.exec_argv(name, NODE, ["sh", "-c", LOAD_SCRIPT.format(n=n)], store)
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
    """Where one benchmark run keeps its clusters, and what it gathers."""

    tmp: Path
    store: Store
    out: Outcome
    progress: Progress = quiet


def _sample(r: Run, config: str, rep: int, hpc: str, tenant: str | None) -> None:
    """One hpcc run; its rates, and the CPU time both clusters used meanwhile."""
    where: dict[str, Any] = {"config": config, "rep": rep, "order": len(r.out.load)}
    before = counters(hpc, tenant)
    w0 = time.perf_counter()
    rates = run_hpcc(r.store, hpc, r.out.hpcc_n)
    wall = time.perf_counter() - w0
    after = counters(hpc, tenant)
    r.out.load.append(load_row(where, wall, before, after, os.getloadavg()[0]))
    r.out.samples += sample_rows(where, rates)


def visit(r: Run, config: str, rep: int) -> None:
    """Bring the configuration's clusters up, take its samples, bring them down."""
    lay = r.out.layouts[config]
    with cluster(r.tmp, r.store, lay.hpc, False, r.progress) as hpc:
        inf = r.store.cluster_dir(hpc) / "shared" / "hpccinf.txt"
        inf.write_text(input_text(r.out.hpcc_n, HPCC_NB, 1, 1))
        with _maybe_tenant(r, lay) as tenant:
            r.out.visits.append(
                {"config": config, "rep": rep, "hpc_cpus": inspect.node_cpuset(hpc, NODE)}
                | {"tenant_cpus": _cpuset(tenant), "load": lay.load}
            )
            if lay.load:
                time.sleep(WARMUP_S)
            for i in range(r.out.samples_per_config):
                r.progress(f"repetition {rep + 1}: {config} sample {i + 1}")
                _sample(r, config, rep, hpc, tenant)


def _cpuset(cluster: str | None) -> str | None:
    return None if cluster is None else inspect.node_cpuset(cluster, NODE)


@contextmanager
def _maybe_tenant(r: Run, lay: Layout) -> Iterator[str | None]:
    if lay.tenant is None:
        yield None
        return
    with cluster(r.tmp, r.store, lay.tenant, lay.load, r.progress) as name:
        yield name


def run(
    repeat: int = 3,
    samples_per_config: int = 3,
    progress: Progress = quiet,
    hpcc_n: int = HPCC_N,
) -> dict[str, Any]:
    """Each configuration ``samples_per_config`` times per repetition, ``repeat`` repetitions
    (the order rotating); ``hpcc_n``: hpcc's problem size (smaller is faster). Returns the
    results document (see ``isolation.report``)."""
    preflight(repeat, samples_per_config, hpcc_n)
    check_image(progress)
    facts = common.host_facts()
    t0 = time.perf_counter()
    host = inspect.read_host()
    parting = partitioning(host)
    pid = os.getpid() % 100000
    names = (f"bi{pid}h", f"bi{pid}c")
    with common.scratch_state("bench isolation", progress) as (tmp, store):
        a, b = common.free_subnets(2)
        lays = layouts(parting, host.cpus, names, (a, b))
        out = Outcome(lays, parting, host.threads_per_core, samples_per_config, hpcc_n)
        r = Run(tmp, store, out, progress)
        for rep, order in enumerate(rotations(repeat)):
            for config in order:
                visit(r, config, rep)
        progress("tearing down")
    wall = time.perf_counter() - t0
    return document(facts, r.out, repeat, wall, list(os.getloadavg()))

"""MPI ping-pong between two processes: native, co-resident containers, isolated ones.

Three configurations, measured in one run and alternated within every
repetition (the order rotates, so none always goes first):

- ``native``: two processes on the host (``mpirun.openmpi -n 2``);
- ``shm``: two compute containers of a cluster with ``locality = "shm"``
  (shared IPC and PID namespace, one /dev/shm: Open MPI's vader BTL with CMA);
- ``none``: two compute containers with ``locality = "none"`` (TCP over the
  cluster bridge, the path isolated nodes take).

``native`` and ``shm`` run with ``btl = vader,self``, so a container pair that
could not use shared memory fails loudly instead of quietly falling back to
TCP. Each cluster is brought up once per run and torn down at the end.

With ``mpi="mpich"`` the same three with MPICH (the host's ``mpiexec.mpich``;
in the nodes an image of Debian's ``mpich`` alone): ``shm`` is then hpvc's
own PMI, which gives MPICH the co-resident nodes as one host
(``hpvc.cluster.pmi``), ``none`` the image's hydra, each node a host.

Ratios are "higher is better", 1.0 = as fast as native: latency native /
container, bandwidth container / native, one ratio per repetition (the two
sides measured seconds apart). The goal: ``shm`` within 10% of native
(median ratio >= 0.90) on every metric.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.stats import summary
from hpvc.cluster import lifecycle, ops
from hpvc.errors import HpvcError, InputError
from hpvc.image import build_image, resolve_image
from hpvc.progress import Progress, quiet
from hpvc.store import Store

Runner = Callable[[], str]


@dataclass(frozen=True)
class Mpi:
    """An MPI the ping-pong runs with: on the host, and in the nodes' image."""

    name: str
    image: str
    packages: tuple[str, ...]  # the image's packages, built here; (): a preset image
    mpicc: str
    native: tuple[str, ...]  # two ranks on the host, before the program
    tools: tuple[str, ...]
    version: tuple[str, ...]  # what prints its version first


MPIS = {
    # By name, not path: Open MPI takes its prefix from an absolute argv[0].
    "openmpi": Mpi(
        "Open MPI",
        "hpc",
        (),
        "mpicc",
        (ops.MPIRUN, "--allow-run-as-root", "-n", "2", "--bind-to", "none"),
        ("mpirun.openmpi", "mpicc"),
        ("ompi_info", "--version"),
    ),
    "mpich": Mpi(
        "MPICH",
        "mpich",
        ("mpich", "procps", "iproute2"),  # the image tests/integration/test_run_mpi.py builds
        "mpicc.mpich",
        ("mpiexec.mpich", "-n", "2"),
        ("mpiexec.mpich", "mpicc.mpich", "debootstrap"),
        ("mpichversion",),
    ),
}

GOAL_RATIO = 0.90
MAX_BYTES = 4 << 20
ITERATIONS = 2000
TIMEOUT_S = 600

CONFIGS: dict[str, str] = {
    "native": "two processes on the host",
    "shm": "two co-resident containers, locality shm (shared IPC/PID ns and /dev/shm)",
    "none": "two isolated containers, locality none (TCP over the cluster bridge)",
}
BTL = {"native": "vader,self", "shm": "vader,self", "none": "tcp,self"}
# MPICH has no switch that refuses the network: how each configuration reaches it
MPICH_PATH = {
    "native": "hydra on the host, ch4 shared memory",
    "shm": "hpvc's PMI: both nodes one host, ch4 shared memory",
    "none": "the image's hydra: each node a host, UCX over the bridge",
}


@dataclass(frozen=True)
class Metric:
    key: str
    bytes: int
    field: str
    unit: str

    @property
    def higher_is_better(self) -> bool:
        return self.field == "bandwidth_MBps"

    def ratio(self, native: float, container: float) -> float:
        """1.0 = as fast as native, higher is better, whichever the metric."""
        return container / native if self.higher_is_better else native / container


# pingpong steps its sizes by 4x (1, 4, 16 ... 4 MiB): 4 B is its small message.
METRICS = (
    Metric("latency_4B", 4, "latency_us", "us"),
    Metric("latency_1KiB", 1024, "latency_us", "us"),
    Metric("bandwidth_1MiB", 1 << 20, "bandwidth_MBps", "MB/s"),
    Metric("bandwidth_4MiB", 4 << 20, "bandwidth_MBps", "MB/s"),
)


def preflight(mpi: Mpi) -> None:
    common.require("bench locality", ["crun", *mpi.tools, "make", "ip"])


def ensure_image(mpi: Mpi, progress: Progress) -> None:
    """The nodes' image: a preset, or built here from its packages alone."""
    if not mpi.packages:
        common.ensure_image(mpi.image, progress)
        return
    try:
        resolve_image(mpi.image)
    except InputError:
        progress(f"image {mpi.image!r} not built yet: building it (about a minute)")
        build_image(mpi.image, list(mpi.packages), progress=lambda m: progress(f"image: {m}"))


def pingpong_args(binary: str) -> list[str]:
    return [binary, str(MAX_BYTES), str(ITERATIONS)]


def _failed(what: str, r: subprocess.CompletedProcess[str]) -> HpvcError:
    """The first line that says something (Open MPI boxes its messages in dashes)."""
    text = f"{r.stderr}\n{r.stdout}".splitlines()
    said = [x.strip() for x in text if any(ch.isalpha() for ch in x)]
    why = said[0] if said else f"exit code {r.returncode}"
    return HpvcError(what, why, "run the same job by hand to see all of its output")


def run_native(mpi: Mpi, binary: Path) -> str:
    argv = list(mpi.native)
    if mpi is MPIS["openmpi"]:
        argv += ["--mca", "btl", BTL["native"]]
    argv += pingpong_args(str(binary))
    r = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=TIMEOUT_S)
    if r.returncode != 0:
        raise _failed("pingpong native", r)
    return r.stdout


@contextmanager
def _env(key: str, value: str) -> Iterator[None]:
    """Set one variable for a child started by a library that copies os.environ."""
    before = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def run_in_cluster(store: Store, name: str, binary: Path, locality: str) -> str:
    """Two ranks on the cluster's two compute nodes (``hpvc run NAME -n 2``)."""
    with _env("OMPI_MCA_btl", BTL[locality]):
        r = ops.run(name, pingpong_args(str(binary)), 2, store, capture=True)
    if isinstance(r, int):  # capture=True always gives the process; for mypy
        raise HpvcError(f"pingpong {locality}", f"exit code {r}")
    if r.returncode != 0:
        raise _failed(f"pingpong {locality}", r)
    return r.stdout


def parse(stdout: str, config: str) -> list[dict[str, Any]]:
    """pingpong's JSON lines; every size METRICS needs must be there."""
    rows = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    have = {int(r["bytes"]) for r in rows}
    missing = [m.bytes for m in METRICS if m.bytes not in have]
    if missing:
        raise HpvcError(
            f"pingpong {config}",
            f"no result for {missing} bytes",
            f"pingpong {MAX_BYTES} {ITERATIONS} must print every size up to {MAX_BYTES}",
        )
    return rows


def bring_up(
    tmp: Path, store: Store, locality: str, subnet: str, binary: Path, image: str = "hpc"
) -> Runner:
    """A cluster of two 1-vCPU compute nodes; pingpong copied into its mpi dir."""
    name = f"bl{os.getpid() % 100000}{locality[0]}"
    spec = tmp / f"{name}.toml"
    groups = [{"role": "compute", "count": 2, "memory": "256MiB"}]
    spec.write_text(common.cluster_spec(name, subnet, groups, locality, image=image))
    lifecycle.up(str(spec), store)
    inside = store.cluster_dir(name) / "mpi" / binary.name
    shutil.copy2(binary, inside)
    return partial(run_in_cluster, store, name, inside, locality)


def one_run(config: str, runner: Runner, rep: int, order: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows = parse(runner(), config)
    return {
        "rep": rep,
        "order": order,
        "wall_s": time.perf_counter() - t0,
        "rank0": rows[0].get("rank0", ""),
        "sizes": rows,
    }


def repetitions(
    runners: dict[str, Runner], repeat: int, progress: Progress
) -> dict[str, list[dict[str, Any]]]:
    """Every configuration once per repetition, the order rotated each time."""
    names = list(runners)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for rep in range(repeat):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for i, config in enumerate(order):
            progress(f"repetition {rep + 1}/{repeat}: {config}")
            runs[config].append(one_run(config, runners[config], rep, i))
    return runs


def value(run: dict[str, Any], m: Metric) -> float:
    row = next(r for r in run["sizes"] if int(r["bytes"]) == m.bytes)
    return float(row[m.field])


def metrics_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in METRICS:
        samples = [value(r, m) for r in runs]
        out[m.key] = {"unit": m.unit, "samples": samples, **summary(samples)}
    return out


def ratios_of(native: list[dict[str, Any]], other: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric, the ratio of each repetition's pair (same rep, seconds apart)."""
    out: dict[str, Any] = {}
    for m in METRICS:
        samples = [m.ratio(value(a, m), value(b, m)) for a, b in zip(native, other, strict=True)]
        s = summary(samples)
        out[m.key] = {"samples": samples, **s, "meets_goal": s["median"] >= GOAL_RATIO}
    return out


def document(
    facts: dict[str, Any], runs: dict[str, list[dict[str, Any]]], mpi: str = "openmpi"
) -> dict[str, Any]:
    path = {c: f"btl {b}" for c, b in BTL.items()} if mpi == "openmpi" else MPICH_PATH
    configs = {
        c: {"describe": CONFIGS[c], "path": path[c], "runs": r, "metrics": metrics_of(r)}
        for c, r in runs.items()
    }
    ratios = {c: ratios_of(runs["native"], r) for c, r in runs.items() if c != "native"}
    return {
        "benchmark": "locality-pingpong",
        **facts,
        "mpi": mpi,
        "repeat": len(runs["native"]),
        "pingpong": {"max_bytes": MAX_BYTES, "iterations": ITERATIONS},
        "ratio": "higher is better, 1.0 = as fast as native:"
        " latency native/container, bandwidth container/native",
        "goal": {"config": "shm", "median_ratio_at_least": GOAL_RATIO},
        "loadavg_end": list(os.getloadavg()),
        "meets_goal": all(v["meets_goal"] for v in ratios["shm"].values()),
        "metrics": [m.key for m in METRICS],
        "configs": configs,
        "ratios": ratios,
    }


def run(repeat: int = 5, progress: Progress = quiet, mpi: str = "openmpi") -> dict[str, Any]:
    """Measure the three configurations ``repeat`` times with ``mpi`` (a key of
    MPIS); return the results document."""
    kind = MPIS[mpi]
    preflight(kind)
    ensure_image(kind, progress)
    facts = common.host_facts(mpi=mpi == "openmpi")
    facts["mpi_version"] = f"{kind.name} {common.tool_version(list(kind.version)).split()[-1]}"
    with common.scratch_state("bench locality", progress) as (tmp, store):
        progress("building pingpong")
        binary = common.build_native("pingpong", tmp, kind.mpicc)
        runners: dict[str, Runner] = {"native": partial(run_native, kind, binary)}
        for loc, subnet in zip(("shm", "none"), common.free_subnets(2), strict=True):
            progress(f"cluster with locality {loc!r}: up ({subnet})")
            runners[loc] = bring_up(tmp, store, loc, subnet, binary, kind.image)
        runs = repetitions(runners, repeat, progress)
        progress("tearing the clusters down")
    return document(facts, runs, mpi)


def fmt(v: float, m: Metric) -> str:
    """Latency to the nanosecond, bandwidth to the MB/s."""
    return f"{v:.3f}" if m.unit == "us" else f"{v:.0f}"


def report_md(doc: dict[str, Any]) -> str:
    """Markdown table: per metric and configuration, values and ratio to native."""
    lines = [
        f"MPI ping-pong, 2 ranks, {doc['repeat']} repetitions alternating native / shm / none"
        f" on {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs), kernel {doc['kernel']},"
        f" {doc.get('mpi_version', doc.get('open_mpi'))}, {doc['crun']}, {doc['date']}.",
        "",
        f"Ratio: {doc['ratio']}; goal: shm median ratio >= {GOAL_RATIO:.2f}"
        f" ({'met' if doc['meets_goal'] else 'NOT met'}).",
        "",
        "| metric | config | min | median | max | ratio min | ratio median | ratio max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in METRICS:
        for c, cfg in doc["configs"].items():
            v = cfg["metrics"][m.key]
            r = doc["ratios"].get(c, {}).get(m.key)
            rc = (
                [f"{r['min']:.2f}", f"{r['median']:.2f}", f"{r['max']:.2f}"]
                if r
                else ["1 (ref)", "", ""]
            )
            cells = [m.key + f" ({m.unit})", c, *(fmt(v[k], m) for k in ("min", "median", "max"))]
            lines.append("| " + " | ".join(cells + rc) + " |")
    lines += [
        "",
        *(f"- {c}: {cfg['describe']}, {cfg['path']}" for c, cfg in doc["configs"].items()),
    ]
    lines.append("- latency_4B: pingpong steps message sizes by 4x, so 4 B is its small size")
    return "\n".join(lines) + "\n"

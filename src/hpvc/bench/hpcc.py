"""HPC Challenge (``hpcc``): native, a tuned container node, one-off ablations, a VM.

Debian's ``hpcc`` (Open MPI, the system ``libblas.so.3``) runs with ``procs``
ranks (default 2) in each configuration; every configuration runs once per
repetition, the order rotated each time, and every cluster is brought up once
for the whole run:

- ``native``: ``mpirun -n P --bind-to core hpcc`` on the host;
- ``container``: one compute container of ``procs`` vCPUs tuned as hpvc tunes
  it: pinning dedicated, hugepages 2M, numa mirror, partition commodity,
  locality shm (ranks exec'd into the node by ``hpvc run``, so Open MPI uses
  shared memory between them, and they float over the node's CPUs:
  ``hpvc run`` does not bind ranks);
- ``container-nopin`` / ``-nohuge`` / ``-nonuma``: ``container`` with one tuning
  switched off (pinning shared, hugepages none, numa none);
- ``vm``: the same node as a QEMU VM (its ranks over ssh; ``hpvc run`` limits
  VM jobs to TCP, also between ranks in one guest).

What the ablations change for hpcc, honestly: **hugepages** back a
*container's* memory only where the program asks for them (hugetlbfs,
``MAP_HUGETLB``, libhugetlbfs, glibc's ``glibc.malloc.hugetlb`` tunable); hpvc
grows the pool, mounts a hugetlbfs at ``/dev/hugepages`` and sets the hugetlb
limit, and hpcc, which allocates with plain ``malloc``, uses none of it
(checked: the node's pool stays all free through a run; THP is ``madvise``
here, so neither side gets transparent huge pages either). So
``container-nohuge`` differs from ``container`` only in that mount, the limit
and the reserved pool: for hpcc it should measure the same (it is measured to
show it). A VM's memory, by contrast, is all on hugepages. **numa** ``none``
and ``mirror`` are the same placement on a host with one NUMA node (this
development VM): that ablation is then a control, too. **pinning** shared
puts a CFS quota of ``procs`` CPUs on a node floating over the host's free
CPUs; dedicated gives it CPUs of its own and no quota.

A configuration that does not fit as asked (a dedicated VM needs a CPU for
its emulator threads beside its vCPUs) falls back to pinning shared where
that fits; the results say so in the configuration's ``describe`` and
``pinning``.

Problem size: hpcc sizes STREAM, RandomAccess and FFT from the HPL N (together
they use about the memory of the HPL matrix), so N is chosen for a matrix of
``MATRIX_MIB`` and at least ``LLC_FACTOR`` times the last-level cache: on a
2-CPU EPYC VM (32 MiB L3) N = 4096, a native run of about 22 s. Under TCG a VM
is 10-50x slower, so it gets ``VM_TCG_N`` instead, and its figures are not
comparable with native (no ratios) unless the accelerator is KVM.

Results: ``samples`` is a flat list of one value per (config, metric, rep),
the shape every suite shares; ``ratios.ratio_rows`` and ``ratios.table_md``
turn any such list into min/median/max and paired per-repetition ratios to a
baseline (higher is better: target/native, latency native/target).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpvc.backends import vm_qemu
from hpvc.bench import common, ratios
from hpvc.bench.stats import summary
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.state import Store
from hpvc.errors import DoesNotFit, HpvcError, InputError, MissingDependency
from hpvc.plan import plan_cluster
from hpvc.spec import load_spec
from hpvc.topology.sysfs import read_topology

Progress = Callable[[str], None]
Runner = Callable[[int], str]

SUITE = "hpcc"
NB = 128
MATRIX_MIB = 128  # HPL matrix of all ranks: ~22 s native with 2 ranks on a 2-CPU EPYC VM
LLC_FACTOR = 4  # the matrix (and so the STREAM arrays) at least 4x the last-level cache
VM_TCG_N = 1000  # ~1 s native; a VM under TCG is 10-50x slower
MIN_NODE_MIB = 512
GOAL_RATIO = 0.97
GOAL_METRICS = ("HPL", "DGEMM", "STREAM_Triad", "STREAM_Copy")
NODE_DIR_VM = "/tmp/hpvc-hpcc"  # in the guest: a VM does not see the host's mpi dir
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Metric:
    key: str
    field: str  # in hpccoutf.txt's summary
    unit: str
    higher_is_better: bool
    scale: float = 1.0  # field value -> unit


# "Star": every rank runs it at once; the figure is the mean per rank.
METRICS = (
    Metric("HPL", "HPL_Tflops", "GFLOP/s", True, 1000.0),
    Metric("DGEMM", "StarDGEMM_Gflops", "GFLOP/s", True),
    Metric("STREAM_Triad", "StarSTREAM_Triad", "GB/s", True),
    Metric("STREAM_Copy", "StarSTREAM_Copy", "GB/s", True),
    Metric("RandomAccess", "StarRandomAccess_GUPs", "GUP/s", True),
    Metric("FFT", "StarFFT_Gflops", "GFLOP/s", True),
    Metric("PingPong_latency", "AvgPingPongLatency_usec", "us", False),
    Metric("PingPong_bandwidth", "AvgPingPongBandwidth_GBytes", "GB/s", True),
)


@dataclass(frozen=True)
class Config:
    """One configuration: where hpcc runs and, for a cluster, its tuning."""

    name: str
    kind: str  # "native", "container" or "vm"
    describe: str
    pinning: str = "dedicated"
    hugepages: str = "2M"
    numa: str = "mirror"
    code: str = ""  # cluster name suffix


TUNED = "pinning dedicated, hugepages 2M, numa mirror, partition commodity, locality shm"
CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config("native", "native", "hpcc on the host, ranks bound to cores"),
        Config("container", "container", f"one container node, {TUNED}", code="c"),
        Config(
            "container-nopin", "container", "container, pinning shared", pinning="shared", code="p"
        ),
        Config(
            "container-nohuge", "container", "container, hugepages none", hugepages="none", code="h"
        ),
        Config("container-nonuma", "container", "container, numa none", numa="none", code="n"),
        Config("vm", "vm", f"one QEMU VM node, {TUNED}, MPI over TCP", code="v"),
    )
}


def _quiet(_: str) -> None:
    pass


# --- input and problem size --------------------------------------------------------


def grid(procs: int) -> tuple[int, int]:
    """HPL's process grid P x Q = procs, as square as it gets, P <= Q."""
    p = max(d for d in range(1, math.isqrt(procs) + 1) if procs % d == 0)
    return p, procs // p


def input_text(n: int, nb: int, p: int, q: int) -> str:
    """``hpccinf.txt``: HPL.dat (one N, NB and grid) and hpcc's PTRANS lines."""
    lines = [
        "HPLinpack benchmark input file",
        "Innovative Computing Laboratory, University of Tennessee",
        "HPL.out      output file name (if any)",
        "8            device out (6=stdout,7=stderr,file)",
        "1            # of problems sizes (N)",
        f"{n:<12} Ns",
        "1            # of NBs",
        f"{nb:<12} NBs",
        "0            PMAP process mapping (0=Row-,1=Column-major)",
        "1            # of process grids (P x Q)",
        f"{p:<12} Ps",
        f"{q:<12} Qs",
        "16.0         threshold",
        "1            # of panel fact",
        "2            PFACTs (0=left, 1=Crout, 2=Right)",
        "1            # of recursive stopping criterium",
        "4            NBMINs (>= 1)",
        "1            # of panels in recursion",
        "2            NDIVs",
        "1            # of recursive panel fact.",
        "1            RFACTs (0=left, 1=Crout, 2=Right)",
        "1            # of broadcast",
        "1            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)",
        "1            # of lookahead depth",
        "1            DEPTHs (>=0)",
        "2            SWAP (0=bin-exch,1=long,2=mix)",
        "64           swapping threshold",
        "0            L1 in (0=transposed,1=no-transposed) form",
        "0            U  in (0=transposed,1=no-transposed) form",
        "1            Equilibration (0=no,1=yes)",
        "8            memory alignment in double (> 0)",
        "##### This line (no. 32) is ignored (it serves as a separator). ######",
        "0                       Number of additional problem sizes for PTRANS",
        "1200 10000 30000        values of N",
        "0                       number of additional blocking sizes for PTRANS",
        "40 9 8 13 13 20 16 32 64        values of NB",
    ]
    return "\n".join(lines) + "\n"


def _size_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)", text.strip())
    if not m:
        raise ValueError(f"not a cache size: {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def llc_bytes(root: Path = Path("/")) -> int:
    """Size of CPU 0's last-level data (or unified) cache, from sysfs."""
    base = root / "sys/devices/system/cpu/cpu0/cache"
    best = (0, 0)
    for d in sorted(base.glob("index*")):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            level = int((d / "level").read_text())
            size = _size_bytes((d / "size").read_text())
        except (OSError, ValueError):
            continue
        best = max(best, (level, size))
    if best[1] == 0:
        raise HpvcError("last-level cache", f"no cache size under {base}", "")
    return best[1]


def problem_size(mem_mib: int, procs: int, llc_bytes: int) -> int:
    """HPL N for a matrix (8 N^2 bytes, all ranks) of about ``mem_mib`` MiB, but never
    under ``LLC_FACTOR`` x the last-level cache; a multiple of NB x procs."""
    step = NB * procs
    at_most = math.isqrt(mem_mib * 2**20 // 8) // step * step
    at_least = -(-math.isqrt(LLC_FACTOR * llc_bytes // 8) // step) * step
    return max(at_most, at_least, step)


def node_memory_mib(n: int) -> int:
    """Node memory for hpcc at N: 4x the matrix (hpcc's tests, MPI, the OS), 256 MiB steps."""
    need = 4 * 8 * n * n / 2**20
    return max(MIN_NODE_MIB, math.ceil(need / 256) * 256)


# --- output ------------------------------------------------------------------------


def summary_fields(text: str) -> dict[str, str]:
    """``Key=value`` lines of the last summary section (hpcc appends to its output)."""
    begin = text.rfind("Begin of Summary section.")
    end = text.find("End of Summary section.", begin)
    if begin < 0 or end < 0:
        tail = "\n".join(text.strip().splitlines()[-8:]) or "(no output)"
        raise HpvcError(
            "hpcc",
            f"no summary section in its output (it failed or was cut short); last lines:\n{tail}",
            "run hpcc by hand in a directory with the same hpccinf.txt",
        )
    out: dict[str, str] = {}
    for line in text[begin:end].splitlines()[1:]:
        key, eq, value = line.partition("=")
        if eq:
            out[key.strip()] = value.strip()
    return out


def rank0_host(text: str) -> str:
    """The host (node) hpcc's rank 0 ran on, from the output's header."""
    found = re.findall(r"^Hostname: '([^']*)'", text, re.M)
    return found[-1] if found else ""


def parse(text: str) -> dict[str, float]:
    """The METRICS of an hpccoutf.txt, in their units (HPL in GFLOP/s)."""
    fields = summary_fields(text)
    missing = [m.field for m in METRICS if m.field not in fields]
    if missing:
        raise HpvcError("hpcc", f"summary lacks {', '.join(missing)}", "")
    return {m.key: float(fields[m.field]) * m.scale for m in METRICS}


def _checked(text: str, n: int, what: str) -> dict[str, float]:
    """parse(), and proof that hpcc read our input (its N) and passed its checks."""
    fields = summary_fields(text)
    if fields.get("HPL_N") != str(n):
        raise HpvcError(
            what,
            f"hpcc ran N={fields.get('HPL_N')}, not {n}",
            "it did not read a valid hpccinf.txt and fell back to its defaults",
        )
    if fields.get("Success") != "1":
        raise HpvcError(what, "hpcc reports Success != 1 (a check failed)", "see hpccoutf.txt")
    return parse(text)


# --- runners -----------------------------------------------------------------------


def _failed(what: str, r: subprocess.CompletedProcess[str]) -> HpvcError:
    said = [x.strip() for x in f"{r.stderr}\n{r.stdout}".splitlines() if x.strip()]
    tail = " | ".join(said[-4:]) or f"exit code {r.returncode}"
    return HpvcError(what, f"exit code {r.returncode}: {tail}", "run the same job by hand")


def run_native(workdir: Path, procs: int, text: str) -> str:
    """hpcc with ``procs`` host ranks in ``workdir`` (made fresh); its hpccoutf.txt."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    (workdir / "hpccinf.txt").write_text(text)
    # By name: Open MPI takes its prefix from an absolute argv[0].
    argv = [ops.MPIRUN, "--allow-run-as-root", "-n", str(procs), "--bind-to", "core", "hpcc"]
    r = subprocess.run(
        argv, cwd=workdir, env={**os.environ, **THREAD_ENV}, capture_output=True, text=True
    )
    out = workdir / "hpccoutf.txt"
    got = out.read_text() if out.is_file() else r.stdout
    if r.returncode != 0:  # hpcc says why in its output file, Open MPI on stderr
        raise _failed("hpcc native", subprocess.CompletedProcess(argv, r.returncode, got, r.stderr))
    return got


# Rank 0 writes the input (only rank 0 reads it) and prints the output when hpcc is
# done; one line, as it passes through ssh's quoting for VM ranks.
NODE_SCRIPT = (
    'r="${OMPI_COMM_WORLD_RANK:-0}"; mkdir -p "$1" && cd "$1" || exit 1; '
    "export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; "
    'if [ "$r" = 0 ]; then printf \'%b\' "$2" > hpccinf.txt; rm -f hpccoutf.txt; fi; '
    'hpcc; rc=$?; if [ "$r" = 0 ] && [ -f hpccoutf.txt ]; then cat hpccoutf.txt; fi; exit $rc'
)


def node_argv(node_dir: str, text: str) -> list[str]:
    """The command of every rank in a node: hpcc in ``node_dir`` with input ``text``."""
    return ["sh", "-c", NODE_SCRIPT, "hpcc", node_dir, text.replace("\n", "\\n")]


def run_in_cluster(store: Store, name: str, procs: int, text: str, node_dir: str) -> str:
    """hpcc as ``hpvc run NAME -n procs``; rank 0's hpccoutf.txt."""
    r = ops.run(name, node_argv(node_dir, text), procs, store, capture=True)
    if isinstance(r, int):  # capture=True always gives the process; for mypy
        raise HpvcError(f"hpcc in {name}", f"exit code {r}")
    if r.returncode != 0:
        raise _failed(f"hpcc in {name}", r)
    return r.stdout


# --- clusters ----------------------------------------------------------------------


SPEC = """\
name = "{name}"
kind = "{kind}"
image = "hpc"
[network]
subnet = "{subnet}"
mtu = 9000
[tuning]
pinning = "{c.pinning}"
hugepages = "{c.hugepages}"
numa = "{c.numa}"
partition = "commodity"
locality = "shm"
[[nodes]]
role = "compute"
count = 1
vcpus = {vcpus}
memory = "{memory_mib}MiB"
"""


def spec_text(cfg: Config, name: str, subnet: str, vcpus: int, memory_mib: int) -> str:
    """One compute node of ``vcpus`` vCPUs with the config's tuning."""
    kind = "vm" if cfg.kind == "vm" else "container"
    return SPEC.format(
        name=name, kind=kind, subnet=subnet, c=cfg, vcpus=vcpus, memory_mib=memory_mib
    )


def does_not_fit(path: Path, root: Path = Path("/")) -> str | None:
    """Why the spec at ``path`` does not fit alone on the host at ``root``; None if it fits."""
    try:
        plan_cluster(load_spec(path), [(lifecycle.hostname(), read_topology(root))])
    except DoesNotFit as e:
        return e.why
    return None


def settle(
    cfg: Config, tmp: Path, name: str, subnet: str, procs: int, n: int, root: Path = Path("/")
) -> tuple[Config, str]:
    """The config as it fits here and its spec text (written to ``tmp/NAME.toml``):
    dedicated pinning falls back to shared where only that fits; a spec that fits
    neither way is kept as asked (``hpvc up`` then says what is short)."""
    path = tmp / f"{name}.toml"
    text = spec_text(cfg, name, subnet, procs, node_memory_mib(n))
    path.write_text(text)
    why = does_not_fit(path, root)
    if why is None or cfg.pinning != "dedicated":
        return cfg, text
    alt = replace(cfg, pinning="shared", describe=f"{cfg.describe}; pinning shared: {why}")
    alt_text = spec_text(alt, name, subnet, procs, node_memory_mib(n))
    path.write_text(alt_text)
    if does_not_fit(path, root) is None:
        return alt, alt_text
    path.write_text(text)
    return cfg, text


# --- the run -----------------------------------------------------------------------


def preflight(configs: list[str], repeat: int, procs: int) -> None:
    if not configs:
        raise InputError("--configs", "no configuration given", f"one of {', '.join(CONFIGS)}")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise InputError(f"config {unknown[0]!r}", "unknown", f"one of {', '.join(CONFIGS)}")
    if len(set(configs)) != len(configs):
        raise InputError("--configs", "a configuration is given twice", "")
    if repeat < 1:
        raise InputError("--repeat", f"{repeat} is not a positive number", "--repeat 3")
    cpus = os.cpu_count() or 1
    if not 1 <= procs <= cpus:
        raise InputError(f"--procs {procs}", f"this host has {cpus} CPUs", f"--procs {cpus}")
    kinds = {CONFIGS[c].kind for c in configs}
    tools = [ops.MPIRUN, "hpcc"] + (["crun", "ip"] if "container" in kinds else [])
    common.require("bench hpcc", tools)
    if "vm" in kinds:
        for tool, pkg in (("qemu-system-x86_64", "qemu-system-x86"), ("ssh", "openssh-client")):
            if shutil.which(tool) is None:
                raise MissingDependency(
                    "bench hpcc vm", f"{tool} not found", f"apt-get install {pkg}"
                )


def _cluster_runner(
    stack: ExitStack, cfg: Config, subnet: str, procs: int, n: int, progress: Progress
) -> tuple[Config, str, Runner, float]:
    """Bring the config's cluster up in a state of its own (dedicated CPUs of several
    clusters would collide in one); the caller's stack tears it down."""
    tmp, store = stack.enter_context(common.scratch_state(f"bench hpcc {cfg.name}", progress))
    name = f"hc{os.getpid() % 100000}{cfg.code}"
    cfg, text = settle(cfg, tmp, name, subnet, procs, n)
    progress(f"{cfg.name}: cluster {name} up ({subnet})")
    t0 = time.perf_counter()
    lifecycle.up(str(tmp / f"{name}.toml"), store)
    up_s = time.perf_counter() - t0
    node_dir = NODE_DIR_VM if cfg.kind == "vm" else str(store.cluster_dir(name) / "mpi" / "hpcc")
    inp = input_text(n, NB, *grid(procs))
    return cfg, text, lambda _rep: run_in_cluster(store, name, procs, inp, node_dir), up_s


def _native_runner(tmp: Path, procs: int, n: int) -> Runner:
    inp = input_text(n, NB, *grid(procs))
    return lambda rep: run_native(tmp / f"native-{rep}", procs, inp)


def rotations(names: list[str], repeat: int) -> Iterable[tuple[int, int, str]]:
    """(rep, order, config): every config once per rep, the order rotated each rep."""
    for rep in range(repeat):
        k = rep % len(names)
        for i, c in enumerate(names[k:] + names[:k]):
            yield rep, i, c


def measure(
    runners: dict[str, Runner], sizes: dict[str, int], repeat: int, progress: Progress
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(samples, runs): the shared flat samples and the wall time of every run."""
    samples: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for rep, order, c in rotations(list(runners), repeat):
        progress(f"repetition {rep + 1}/{repeat}: {c} (N={sizes[c]})")
        t0 = time.perf_counter()
        text = runners[c](rep)
        values = _checked(text, sizes[c], f"hpcc {c}")
        wall = time.perf_counter() - t0
        runs.append(
            {"config": c, "rep": rep, "order": order, "wall_s": wall, "rank0": rank0_host(text)}
        )
        progress(f"  {c}: {wall:.1f} s, HPL {values['HPL']:.2f} GFLOP/s")
        for m in METRICS:
            samples.append(
                {
                    "suite": SUITE,
                    "config": c,
                    "metric": m.key,
                    "unit": m.unit,
                    "higher_is_better": m.higher_is_better,
                    "rep": rep,
                    "order": order,
                    "value": values[m.key],
                }
            )
    return samples, runs


def run(
    configs: list[str],
    repeat: int = 3,
    procs: int = 2,
    progress: Progress = _quiet,
    n_override: int | None = None,
    vm_n: int | None = None,
) -> dict[str, Any]:
    """Measure ``configs`` ``repeat`` times each; return the results document."""
    preflight(configs, repeat, procs)
    cfgs = [CONFIGS[c] for c in configs]
    if any(c.kind != "native" for c in cfgs):
        common.ensure_image("hpc", progress)
    accel = vm_qemu.accelerator().name if any(c.kind == "vm" for c in cfgs) else None
    llc = llc_bytes()
    n = n_override or problem_size(MATRIX_MIB, procs, llc)
    small = vm_n or (n if accel == "kvm" else min(n, VM_TCG_N))
    sizes = {c.name: small if c.kind == "vm" else n for c in cfgs}
    facts = common.host_facts()
    described: dict[str, dict[str, Any]] = {}
    runners: dict[str, Runner] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hpvc-hpcc-")))
        clusters = [c for c in cfgs if c.kind != "native"]
        subnets = iter(common.free_subnets(len(clusters)) if clusters else [])
        for cfg in cfgs:
            if cfg.kind == "native":
                runners[cfg.name] = _native_runner(tmp, procs, n)
                described[cfg.name] = {"describe": cfg.describe, "spec": None, "n": n}
                continue
            got, spec, runner, up_s = _cluster_runner(
                stack, cfg, next(subnets), procs, sizes[cfg.name], progress
            )
            runners[cfg.name] = runner
            described[cfg.name] = {
                "describe": got.describe,
                "spec": spec,
                "n": sizes[cfg.name],
                "pinning": got.pinning,
                "up_s": up_s,
            }
        samples, runs = measure(runners, sizes, repeat, progress)
        progress("tearing the clusters down")
    return document(facts, configs, described, samples, runs, n, llc, procs, accel)


def not_comparable(
    described: dict[str, dict[str, Any]], n: int, accel: str | None
) -> dict[str, str]:
    """Configs whose ratios to native mean nothing, and why."""
    out: dict[str, str] = {}
    for c, d in described.items():
        if d["n"] != n:
            out[c] = f"N={d['n']}, native N={n}"
        if CONFIGS[c].kind == "vm" and accel != "kvm":
            out[c] = f"VM under {accel or 'unknown'} (software emulation)" + (
                f", N={d['n']}" if d["n"] != n else ""
            )
    return out


def document(
    facts: dict[str, Any],
    configs: list[str],
    described: dict[str, dict[str, Any]],
    samples: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    n: int,
    llc: int,
    procs: int,
    accel: str | None,
) -> dict[str, Any]:
    p, q = grid(procs)
    return {
        "suite": SUITE,
        **facts,
        "loadavg_end": list(os.getloadavg()),
        "repeat": 1 + max((r["rep"] for r in runs), default=-1),
        "procs": procs,
        "input": {"n": n, "nb": NB, "p": p, "q": q, "llc_bytes": llc, "matrix_bytes": 8 * n * n},
        "accelerator": accel,
        "configs": {c: described[c] for c in configs},
        "not_comparable": not_comparable(described, n, accel),
        "metrics": [
            {"key": m.key, "field": m.field, "unit": m.unit, "higher_is_better": m.higher_is_better}
            for m in METRICS
        ],
        "ratio": "> 1 is better than native: target/native, latency native/target,"
        " paired by repetition",
        "goals": [
            {
                "metric": m,
                "config": "container",
                "vs": "native",
                "median_ratio_at_least": GOAL_RATIO,
            }
            for m in GOAL_METRICS
        ],
        "runs": runs,
        "samples": samples,
    }


def report_md(doc: dict[str, Any]) -> str:
    """The run in markdown: where, what, then one table per config."""
    i = doc["input"]
    lines = [
        f"HPC Challenge ({doc['suite']}), {doc['procs']} ranks, {doc['repeat']} repetition(s)"
        f" with the configs alternated, on {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs),"
        f" kernel {doc['kernel']}, {doc.get('open_mpi', '')}, {doc['crun']}, {doc['date']}.",
        "",
        f"Input: N={i['n']}, NB={i['nb']}, grid {i['p']}x{i['q']}; matrix"
        f" {i['matrix_bytes'] / 2**20:.0f} MiB, last-level cache {i['llc_bytes'] / 2**20:.0f} MiB."
        f" Ratio: {doc['ratio']}.",
        "",
        *(f"- {c}: {d['describe']} (N={d['n']})" for c, d in doc["configs"].items()),
        *(f"- {c}: no ratios, not comparable: {why}" for c, why in doc["not_comparable"].items()),
        "",
    ]
    rows = ratios.ratio_rows(doc["samples"])
    lines.append(ratios.table_md(rows, doc["goals"], no_ratio=doc["not_comparable"]))
    walls: dict[str, list[float]] = {}
    for r in doc["runs"]:
        walls.setdefault(r["config"], []).append(r["wall_s"])
    lines.append(
        "Wall time per run (median s): "
        + ", ".join(f"{c} {summary(w)['median']:.1f}" for c, w in walls.items())
    )
    return "\n".join(lines) + "\n"

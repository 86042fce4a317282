"""HPC Challenge (``hpcc``): native, a tuned container node, one-off ablations, a VM.

Debian's ``hpcc`` (Open MPI; OpenBLAS by default, ``hpcc.blas``) runs with ``procs``
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

Every side runs the same BLAS with the same settings (``hpcc.blas``: OpenBLAS
by default, one thread per rank) through the same node script, which also
reports the BLAS files rank 0 had mapped; the results name the BLAS that ran
on each side.

This module runs the suite (preflight, the probe, the clusters, the rotation
of runs); the problem size is ``hpcc.sizing``'s (cache, memory and a time
budget), the input ``hpcc.input``'s, the output parsing ``hpcc.parse``'s, the
configurations ``hpcc.configs``' and the document and report ``hpcc.report``'s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.hpcc import blas, sizing
from hpvc.bench.hpcc.configs import CONFIGS, Config, spec_text
from hpvc.bench.hpcc.input import NB, VM_TCG_N, grid, input_text, node_memory_mib
from hpvc.bench.hpcc.parse import METRICS, SUITE, checked, rank0_host, summary_fields
from hpvc.bench.hpcc.report import document
from hpvc.cluster import inspect, lifecycle, ops
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host import hwinfo
from hpvc.host.accel import accelerator
from hpvc.progress import Progress, quiet
from hpvc.store import Store
from hpvc.sysroot import HOST, RootLike

Runner = Callable[[int], str]

NODE_DIR_VM = "/tmp/hpvc-hpcc"  # in the guest: a VM does not see the host's mpi dir


# --- runners -----------------------------------------------------------------------


def _failed(what: str, r: subprocess.CompletedProcess[str]) -> HpvcError:
    said = [x.strip() for x in f"{r.stderr}\n{r.stdout}".splitlines() if x.strip()]
    tail = " | ".join(said[-4:]) or f"exit code {r.returncode}"
    return HpvcError(what, f"exit code {r.returncode}: {tail}", "run the same job by hand")


# Rank 0 writes the input (only rank 0 reads it), runs hpcc with the loader's
# own log of the libraries it loads (``LD_DEBUG=files`` into ``.hpvc-ld.<pid>``:
# every library's constructor, "calling init: <path>", written as it loads),
# and once hpcc is done prints the BLAS files it loaded (symlinks resolved:
# libopenblas.so.0 -> libopenblasp-r0.3.21.so, blas.MAPPED lines), then its
# output. Reading /proc/PID/maps instead lost a race: a tiny run could end
# between two looks (seen 2026-11-27, "nothing mapped was seen" in a container).
# Every rank gets the same BLAS settings ($3: LD_LIBRARY_PATH, empty for the
# alternatives'). One line, as it passes through ssh's quoting for VM ranks.
NODE_SCRIPT = (
    'r="${OMPI_COMM_WORLD_RANK:-0}"; mkdir -p "$1" && cd "$1" || exit 1; '
    "export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; "
    'if [ -n "$3" ]; then export LD_LIBRARY_PATH="$3"; fi; '
    'if [ "$r" = 0 ]; then printf \'%b\' "$2" > hpccinf.txt; rm -f hpccoutf.txt .hpvc-ld.*; '
    'LD_DEBUG=files LD_DEBUG_OUTPUT="$PWD/.hpvc-ld" hpcc & else hpcc & fi; p=$!; '
    'wait "$p"; rc=$?; if [ "$r" = 0 ]; then '
    'sed -n "s|.*calling init: \\(/[^ ]*blas[^ ]*\\).*|\\1|p" ".hpvc-ld.$p" 2>/dev/null '
    '| while read -r f; do readlink -f "$f"; done | sort -u | sed "s|^|'
    + blas.MAPPED
    + '|"; rm -f .hpvc-ld.*; [ -f hpccoutf.txt ] && cat hpccoutf.txt; fi; exit $rc'
)


def node_argv(node_dir: str, text: str, choice: str = blas.DEFAULT) -> list[str]:
    """The command of every rank: hpcc in ``node_dir`` with input ``text`` and BLAS
    ``choice`` (the same script natively, in containers and in VMs)."""
    return ["sh", "-c", NODE_SCRIPT, "hpcc", node_dir, text.replace("\n", "\\n"),
            blas.library_dir(choice)]  # fmt: skip


def run_native(workdir: Path, procs: int, text: str, choice: str = blas.DEFAULT) -> str:
    """hpcc with ``procs`` host ranks in ``workdir`` (made fresh), through the node
    script; rank 0's output (its BLAS lines, then hpccoutf.txt)."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    # By name: Open MPI takes its prefix from an absolute argv[0].
    argv = [ops.MPIRUN, "--allow-run-as-root", "-n", str(procs), "--bind-to", "core"]
    r = subprocess.run(
        [*argv, *node_argv(str(workdir), text, choice)], cwd=workdir, capture_output=True,
        text=True,
    )  # fmt: skip
    if r.returncode != 0:  # hpcc says why in its output file, Open MPI on stderr
        raise _failed("hpcc native", r)
    return r.stdout


def run_in_cluster(
    store: Store, name: str, procs: int, text: str, node_dir: str, choice: str = blas.DEFAULT
) -> str:
    """hpcc as ``hpvc run NAME -n procs``; rank 0's output."""
    r = ops.run(name, node_argv(node_dir, text, choice), procs, store, capture=True)
    if isinstance(r, int):  # capture=True always gives the process; for mypy
        raise HpvcError(f"hpcc in {name}", f"exit code {r}")
    if r.returncode != 0:
        raise _failed(f"hpcc in {name}", r)
    return r.stdout


def probe(tmp: Path, procs: int, choice: str, n: int) -> sizing.Probe:
    """One native run at a small ``n``: the flop rate and other tests' time (sizing)."""
    t0 = time.perf_counter()
    text = run_native(tmp / "probe", procs, input_text(n, NB, *grid(procs)), choice)
    wall = time.perf_counter() - t0
    checked(text, n, "hpcc probe")
    f = summary_fields(text)
    return sizing.Probe(n, wall, float(f["HPL_time"]), float(f["HPL_Tflops"]) * 1000.0)


def host_memory_mib(root: RootLike = HOST) -> int:
    """What the host can give a node: free memory of its NUMA nodes, as the planner counts."""
    from hpvc.topology import read_topology

    return sum(n.free_mib for n in read_topology(root).numa_nodes)


# --- clusters ----------------------------------------------------------------------


def settle(
    cfg: Config,
    tmp: Path,
    name: str,
    subnet: str,
    procs: int,
    n: int,
    root: RootLike = HOST,
    image: str = blas.IMAGE[blas.DEFAULT],
) -> tuple[Config, str]:
    """The config as it fits here and its spec text (written to ``tmp/NAME.toml``):
    dedicated pinning falls back to shared where only that fits; a spec that fits
    neither way is kept as asked (``hpvc up`` then says what is short)."""
    path = tmp / f"{name}.toml"
    text = spec_text(cfg, name, subnet, procs, node_memory_mib(n), image)
    path.write_text(text)
    why = inspect.why_spec_file_not_fit(path, root)
    if why is None or cfg.pinning != "dedicated":
        return cfg, text
    alt = replace(cfg, pinning="shared", describe=f"{cfg.describe}; pinning shared: {why}")
    alt_text = spec_text(alt, name, subnet, procs, node_memory_mib(n), image)
    path.write_text(alt_text)
    if inspect.why_spec_file_not_fit(path, root) is None:
        return alt, alt_text
    path.write_text(text)
    return cfg, text


# --- the run -----------------------------------------------------------------------


def preflight(
    configs: list[str], repeat: int, procs: int, choice: str = blas.DEFAULT, budget_s: float = 1.0
) -> None:
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
    if choice not in blas.CHOICES:
        raise InputError(f"--blas {choice}", "unknown", f"one of {', '.join(blas.CHOICES)}")
    if not budget_s > 0:
        raise InputError(f"--time-budget {budget_s}", "not a positive number of seconds", "60")
    kinds = {CONFIGS[c].kind for c in configs}
    tools = [ops.MPIRUN, "hpcc"] + (["crun", "ip"] if "container" in kinds else [])
    common.require("bench hpcc", tools)
    why = blas.missing(choice)
    if why:
        raise MissingDependency(
            "bench hpcc", why, f"apt-get install {blas.OPENBLAS_PACKAGE} (or --blas system)"
        )
    if "vm" in kinds:
        for tool, pkg in (("qemu-system-x86_64", "qemu-system-x86"), ("ssh", "openssh-client")):
            if shutil.which(tool) is None:
                raise MissingDependency(
                    "bench hpcc vm", f"{tool} not found", f"apt-get install {pkg}"
                )


def _cluster_runner(
    stack: ExitStack,
    cfg: Config,
    subnet: str,
    procs: int,
    n: int,
    progress: Progress,
    choice: str,
) -> tuple[Config, str, Runner, float]:
    """Bring the config's cluster up in a state of its own (dedicated CPUs of several
    clusters would collide in one); the caller's stack tears it down."""
    tmp, store = stack.enter_context(common.scratch_state(f"bench hpcc {cfg.name}", progress))
    name = f"hc{os.getpid() % 100000}{cfg.code}"
    cfg, text = settle(cfg, tmp, name, subnet, procs, n, image=blas.IMAGE[choice])
    progress(f"{cfg.name}: cluster {name} up ({subnet})")
    t0 = time.perf_counter()
    lifecycle.up(str(tmp / f"{name}.toml"), store)
    up_s = time.perf_counter() - t0
    node_dir = NODE_DIR_VM if cfg.kind == "vm" else str(store.cluster_dir(name) / "mpi" / "hpcc")
    inp = input_text(n, NB, *grid(procs))
    return (
        cfg,
        text,
        lambda _rep: run_in_cluster(store, name, procs, inp, node_dir, choice),
        up_s,
    )


def _native_runner(tmp: Path, procs: int, n: int, choice: str) -> Runner:
    inp = input_text(n, NB, *grid(procs))
    return lambda rep: run_native(tmp / f"native-{rep}", procs, inp, choice)


def rotations(names: list[str], repeat: int) -> Iterable[tuple[int, int, str]]:
    """(rep, order, config): every config once per rep, the order rotated each rep."""
    for rep in range(repeat):
        k = rep % len(names)
        for i, c in enumerate(names[k:] + names[:k]):
            yield rep, i, c


def measure(
    runners: dict[str, Runner], sizes: dict[str, int], repeat: int, progress: Progress
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(samples, runs): the shared flat samples and the wall time and BLAS of every run."""
    samples: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for rep, order, c in rotations(list(runners), repeat):
        progress(f"repetition {rep + 1}/{repeat}: {c} (N={sizes[c]})")
        t0 = time.perf_counter()
        text = runners[c](rep)
        values = checked(text, sizes[c], f"hpcc {c}")
        wall = time.perf_counter() - t0
        mapped = blas.mapped_paths(text)
        runs.append(
            {
                "config": c,
                "rep": rep,
                "order": order,
                "wall_s": wall,
                "rank0": rank0_host(text),
                "blas": blas.identify(mapped),
                "blas_files": mapped,
            }
        )
        progress(f"  {c}: {wall:.1f} s, HPL {values['HPL']:.2f} GFLOP/s, {runs[-1]['blas']}")
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


def choose_size(
    tmp: Path,
    procs: int,
    choice: str,
    budget_s: float,
    asked: int | None,
    llc: int,
    progress: Progress,
) -> tuple[sizing.Sizing, sizing.Probe | None]:
    """HPL's N here (``hpcc.sizing``); the probe runs unless N is given."""
    mem = host_memory_mib()
    found = None
    if asked is None:
        n0 = sizing.probe_n(procs)
        progress(f"probe: one native hpcc run at N={n0} ({choice} BLAS) to size N")
        found = probe(tmp, procs, choice, n0)
        progress(f"  probe: {found.wall_s:.1f} s, HPL {found.hpl_gflops:.2f} GFLOP/s")
    got = sizing.choose(
        llc_bytes=llc, procs=procs, mem_mib=mem, budget_s=budget_s, probe=found, asked_n=asked
    )
    for why in got.reasons:
        progress(f"N: {why}")
    return got, found


def run(
    configs: list[str],
    repeat: int = 3,
    procs: int = 2,
    progress: Progress = quiet,
    n_override: int | None = None,
    vm_n: int | None = None,
    budget_s: float = sizing.BUDGET_S,
    choice: str = blas.DEFAULT,
) -> dict[str, Any]:
    """Measure ``configs`` ``repeat`` times each; return the results document.
    ``n_override``: HPL's N (else sized here); ``budget_s``: one native run's budget."""
    preflight(configs, repeat, procs, choice, budget_s)
    cfgs = [CONFIGS[c] for c in configs]
    if any(c.kind != "native" for c in cfgs):
        common.ensure_image(blas.IMAGE[choice], progress)
    accel = accelerator().name if any(c.kind == "vm" for c in cfgs) else None
    facts = common.host_facts()
    described: dict[str, dict[str, Any]] = {}
    runners: dict[str, Runner] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hpvc-hpcc-")))
        llc = hwinfo.llc_bytes()
        size, found = choose_size(tmp, procs, choice, budget_s, n_override, llc, progress)
        n = size.n
        small = vm_n or (n if accel == "kvm" else min(n, VM_TCG_N))
        sizes = {c.name: small if c.kind == "vm" else n for c in cfgs}
        clusters = [c for c in cfgs if c.kind != "native"]
        subnets = iter(common.free_subnets(len(clusters)) if clusters else [])
        for cfg in cfgs:
            if cfg.kind == "native":
                runners[cfg.name] = _native_runner(tmp, procs, n, choice)
                described[cfg.name] = {"describe": cfg.describe, "spec": None, "n": n}
                continue
            got, spec, runner, up_s = _cluster_runner(
                stack, cfg, next(subnets), procs, sizes[cfg.name], progress, choice
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
    loadavg = list(os.getloadavg())
    doc = document(facts, configs, described, samples, runs, n, llc, procs, accel, loadavg)
    doc["sizing"] = size.as_dict() | {"probe": found.as_dict() if found else None}
    doc["blas"] = blas.summary(choice, runs)
    base = doc["blas"]["ran"].get("native")
    for c, names in doc["blas"]["ran"].items():
        if base and names != base:  # an A/B of two libraries says nothing of hpvc
            doc["not_comparable"][c] = f"BLAS {', '.join(names)}, native {', '.join(base)}"
    return doc

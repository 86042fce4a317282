"""Slurm as MPI's launcher in hpvc's nodes, measured (issue 30, Figures).

On a private copy of the local Slurm test cluster (as ``hpvc bench slurm``),
jobs submitted by an ordinary user, per repetition, the order rotated:

* an MPI ping-pong (native/bench/pingpong.c, the image's Open MPI) between
  two ranks in one virtual node, launched by ``srun -n2 --mpi=pmix`` (each
  task joins the node; PMIx through the plugin's forwarder) and by
  ``mpirun -np 2`` run as the step's one task inside the same node (Open
  MPI's own launcher, no Slurm in the MPI job): latency at 1 byte,
  bandwidth at the largest message;
* an 8-rank HPCC (small N) the same two ways, in the same node;
* the launch time of a step ``srun -N2 -n4 --mpi=pmix true`` inside a
  ``salloc -N2`` allocation with ``--hpvc`` (virtual nodes already up: the
  cost of every further step, tasks joining their nodes and the PMIx
  forwarder) and without, timed in the allocation's script.

With ``kind = "vm"`` the same runs in VM guests (1 vCPU; HPCC at N = 256 for
TCG): a guest does not see the job's directory, so the ping-pong binary and
HPCC's input travel in the command line into the guest's /tmp and rank 0
prints HPCC's output (``_carried``, ``RANK0``).

Both MPI launches run in the same node of one job per measurement, so they
share its CPUs, memory and image; only the launcher differs. A cross-host
mpirun would need a remote shell between nodes that Slurm jobs' nodes do not
have; across hosts the ping-pong under srun is what the integration test
runs (tests/integration/test_slurm_pmix.py).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.hpcc import input as hpcc_input
from hpvc.bench.hpcc import parse as hpcc_parse
from hpvc.bench.slurm.cluster import SlurmCluster, Submitter, private_slurm
from hpvc.bench.stats import summary
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.progress import Progress, quiet

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "salloc", "mpicc", "make", "cc")
PP_BYTES = 1 << 20
PP_REPS = 200
HPCC_RANKS = 8
HPCC_N = 1024  # small: 8 MiB matrix, 8 ranks on the node's CPUs
HPCC_NB = 64
HPCC_N_VM = 256  # a TCG guest is 10-50x slower
STEPS = 3  # timed steps per allocation, after one that brings it up
TIMEOUT_S = 600
# Ranks may outnumber CPUs (8 HPCC ranks on 2): both launchers yield when idle.
MPI_ENV = "OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1"
# mpirun inside the node as on a workstation: none of the step's Slurm variables.
NO_SLURM = 'for v in $(env | sed -n "s/^\\(SLURM_[A-Za-z0-9_]*\\)=.*/\\1/p"); do unset "$v"; done'

KINDS = ("container", "vm")


def spec_text(name: str, subnet: str, kind: str, computes: int) -> str:
    """``computes`` compute nodes of 2 vCPUs (VMs: 1), floating, no hugepages."""
    vcpus = 1 if kind == "vm" else 2
    return (
        f'name = "{name}"\nkind = "{kind}"\nimage = "hpc"\n'
        f'[network]\nsubnet = "{subnet}"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        f'[[nodes]]\nrole = "compute"\ncount = {computes}\nvcpus = {vcpus}\nmemory = "768MiB"\n'
    )


def preflight(kind: str) -> None:
    if kind not in KINDS:
        raise InputError(f"--kind {kind}", "unknown", "--kind container or --kind vm")
    if os.geteuid() != 0:
        raise MissingDependency("bench pmix", "needs root (slurmd, containers)", "run as root")
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        raise MissingDependency("bench pmix", f"{', '.join(missing)} not installed", "make setup")


def _submit(
    cluster: SlurmCluster, user: Submitter, cwd: Path, argv: list[str]
) -> subprocess.CompletedProcess[str]:
    """``argv`` as ``user``; then wait for the job's epilog to take its nodes
    down (the next job gets the same subnet)."""
    r = cluster.submit(user, argv, cwd, TIMEOUT_S)
    if r.returncode != 0:
        raise HpvcError(f"bench pmix: {' '.join(argv[:6])}", (r.stderr or r.stdout).strip()[-400:])
    deadline = time.monotonic() + 60
    while cluster.shares() and time.monotonic() < deadline:
        time.sleep(0.1)
    if cluster.shares():
        raise HpvcError("bench pmix", f"job nodes still up after 60 s: {cluster.shares()}")
    return r


def _launch(
    how: str, ranks: int, spec: Path, command: str, before: str = "", after: str = ""
) -> list[str]:
    """srun argv running ``command`` as ``ranks`` MPI ranks in the spec's one
    node: Slurm's PMIx launch, or mpirun as the step's one task in that node;
    ``before`` and ``after`` are shell run around it (per task under srun)."""
    if how == "srun":
        return ["srun", "-N1", f"-n{ranks}", "-O", "--mpi=pmix", f"--hpvc={spec}",
                "sh", "-c", f"{before}env {MPI_ENV} {command}{after}"]  # fmt: skip
    mpirun = f"mpirun --mca plm isolated --host localhost:{ranks} -np {ranks} --bind-to none"
    run = f"{before}env {MPI_ENV} {mpirun} {command}{after}"
    return ["srun", "-N1", "-n1", f"--hpvc={spec}", "sh", "-c", f"{NO_SLURM}; {run}"]


# A guest sees nothing of the job's directory (the site's binds stay on the
# host): its programs and input travel in the command line, into its /tmp.
RANK0 = ' && if [ "${SLURM_PROCID:-0}" = 0 ]; then cat hpccoutf.txt; fi'


def _carried(binary: Path) -> tuple[str, str]:
    """Shell that writes ``binary`` into the node's /tmp, and its path there."""
    data = base64.b64encode(binary.read_bytes()).decode()
    path = "/tmp/pingpong.$$"  # one per task: tasks of one node write at once
    return f"echo {data} | base64 -d > {path} && chmod +x {path} && ", path


def pingpong(
    cluster: SlurmCluster,
    user: Submitter,
    work: Path,
    spec: Path,
    how: str,
    binary: Path,
    carry: bool = False,
) -> dict[str, float]:
    before, path = _carried(binary) if carry else ("", str(binary))
    argv = _launch(how, 2, spec, f"{path} {PP_BYTES} {PP_REPS}", before)
    r = _submit(cluster, user, work, argv)
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    if not rows or rows[-1]["bytes"] != PP_BYTES:
        why = (r.stdout + r.stderr).strip()[-400:]
        raise HpvcError(f"bench pmix: ping-pong under {how}", f"no result: {why}")
    return {"latency_us": float(rows[0]["latency_us"]),
            "bandwidth_MBps": float(rows[-1]["bandwidth_MBps"])}  # fmt: skip


def hpcc(
    cluster: SlurmCluster,
    user: Submitter,
    work: Path,
    spec: Path,
    how: str,
    tag: str,
    carry: bool = False,
) -> dict[str, float]:
    n = HPCC_N_VM if carry else HPCC_N
    p, q = hpcc_input.grid(HPCC_RANKS)
    text = hpcc_input.input_text(n, HPCC_NB, p, q)
    if carry:  # written in the node's /tmp, the output read back by rank 0
        before = f"cd /tmp && printf '%s' '{text}' > hpccinf.$$ && mv -f hpccinf.$$ hpccinf.txt && "
        out = _submit(cluster, user, work, _launch(how, HPCC_RANKS, spec, "hpcc", before, RANK0))
        return hpcc_parse.checked(out.stdout, n, f"hpcc under {how}")
    d = work / f"hpcc-{tag}"
    d.mkdir()
    (d / "hpccinf.txt").write_text(text)
    os.chown(d, user.uid, user.gid)
    _submit(cluster, user, d, _launch(how, HPCC_RANKS, spec, "hpcc"))
    return hpcc_parse.checked((d / "hpccoutf.txt").read_text(), n, f"hpcc under {how}")


def launch_steps(
    cluster: SlurmCluster, user: Submitter, work: Path, spec: Path | None
) -> list[float]:
    """Seconds of each timed ``srun -N2 -n4 --mpi=pmix true`` in one allocation."""
    step = "srun -N2 -n4 --mpi=pmix true"
    script = (
        f"{step} || exit 1; for i in $(seq {STEPS}); do s=$(date +%s.%N); {step} || exit 1; "
        'e=$(date +%s.%N); echo "step $s $e"; done'
    )
    argv = ["salloc", "-N2", "-n4"] + ([f"--hpvc={spec}"] if spec else []) + ["sh", "-c", script]
    out = _submit(cluster, user, work, argv).stdout
    steps = [line.split() for line in out.splitlines() if line.startswith("step ")]
    if len(steps) != STEPS:
        raise HpvcError("bench pmix: allocation", f"expected {STEPS} steps: {out[-300:]}")
    return [float(e) - float(s) for _, s, e in steps]


def one_rep(
    cluster: SlurmCluster,
    user: Submitter,
    work: Path,
    specs: dict[str, Path],
    binary: Path,
    rep: int,
    progress: Progress,
    carry: bool = False,
) -> list[dict[str, Any]]:
    runs: list[tuple[str, str, Any]] = []
    one = specs["one"]
    for how in ("srun", "mpirun"):
        runs.append(
            ("pingpong", how, lambda h=how: pingpong(cluster, user, work, one, h, binary, carry))
        )
        runs.append(
            ("hpcc", how, lambda h=how: hpcc(cluster, user, work, one, h, f"{rep}-{h}", carry))
        )
    for config in ("plain", "hpvc"):
        spec = specs["two"] if config == "hpvc" else None
        runs.append(
            (
                "step_launch",
                config,
                lambda s=spec: {"seconds": launch_steps(cluster, user, work, s)},
            )
        )
    k = rep % len(runs)
    out = []
    for order, (what, config, fn) in enumerate(runs[k:] + runs[:k]):
        progress(f"repetition {rep + 1}: {what} {config}")
        out.append({"what": what, "config": config, "rep": rep, "order": order, **fn()})
    return out


def _stats(rows: list[dict[str, Any]], what: str, config: str, key: str) -> list[float]:
    vals: list[float] = []
    for r in rows:
        if r["what"] == what and r["config"] == config:
            v = r[key]
            vals += v if isinstance(v, list) else [float(v)]
    return vals


def _paired(rows: list[dict[str, Any]], what: str, key: str) -> list[float]:
    """srun/mpirun per repetition (same node, same repetition)."""
    by: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["what"] == what:
            by.setdefault(r["rep"], {})[r["config"]] = float(r[key])
    return [v["srun"] / v["mpirun"] for v in by.values() if v.get("mpirun")]


def document(rows: list[dict[str, Any]]) -> dict[str, Any]:
    mpi: list[dict[str, Any]] = []
    keys = [("pingpong", "latency_us", "us"), ("pingpong", "bandwidth_MBps", "MB/s")]
    keys += [("hpcc", m.key, m.unit) for m in hpcc_parse.METRICS]
    for what, key, unit in keys:
        s, m = _stats(rows, what, "srun", key), _stats(rows, what, "mpirun", key)
        if s and m:
            ratio = summary(_paired(rows, what, key))
            mpi.append({"what": what, "metric": key, "unit": unit, "srun_pmix": summary(s),
                        "mpirun": summary(m), "ratio_srun_mpirun": ratio})  # fmt: skip
    plain, hp = (_stats(rows, "step_launch", c, "seconds") for c in ("plain", "hpvc"))
    launch = {"plain": summary(plain), "hpvc": summary(hp),
              "added_median_s": summary(hp)["median"] - summary(plain)["median"]}  # fmt: skip
    return {"mpi": mpi, "step_launch": launch}


def run(
    repeat: int = 3, progress: Progress = quiet, user: str = "nobody", kind: str = "container"
) -> dict[str, Any]:
    if repeat < 1:
        raise InputError("--repeat", "must be at least 1", "--repeat 3")
    preflight(kind)
    submitter = Submitter.named(user)
    common.ensure_image("hpc", progress)
    if kind == "vm":
        common.ensure_guest("hpc", progress)
    facts = common.host_facts()
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-bench-pmix-"))
    os.chmod(tmp, 0o755)
    work = tmp / "work"
    work.mkdir()
    os.chown(work, submitter.uid, submitter.gid)
    subnet = common.free_subnets(1)[0]  # one job at a time: both specs use it
    specs = {"one": work / "one.toml", "two": work / "two.toml"}
    specs["one"].write_text(spec_text("pm1", subnet, kind, 1))
    specs["two"].write_text(spec_text("pm2", subnet, kind, 2))
    (work / "bin").mkdir()
    binary = common.build_native("pingpong", work / "bin")
    os.chmod(work / "bin", 0o755)
    site = f"binds={work}" + (" kinds=container,vm" if kind == "vm" else "")
    rows: list[dict[str, Any]] = []
    left: list[tuple[str, str]] = []
    try:
        with private_slurm(tmp, subnet, progress, extra_args=site) as cluster:
            r = subprocess.run(
                ["srun", "--version"], env=cluster.env, capture_output=True, text=True
            )
            version = r.stdout.strip() or "unknown"
            for rep in range(repeat):
                rows += one_rep(
                    cluster, submitter, work, specs, binary, rep, progress, kind == "vm"
                )
            left = cluster.sweep(cluster.env["HPVC_BIN"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if left:
        raise HpvcError("bench pmix", f"shares left after the runs: {left}", "")
    return {"benchmark": "pmix", **facts, "slurm": version, "kind": kind, "repeat": repeat,
            "submitted_by": submitter.name, "runs": rows, **document(rows)}  # fmt: skip

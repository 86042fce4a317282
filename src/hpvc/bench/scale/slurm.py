"""The Slurm half of ``hpvc bench scale``: how ``srun --hpvc`` grows with the
number of hosts (issue 33; docs/benchmarks.md, "Scale").

On a private copy of the Slurm test cluster with as many hosts as the largest
count asked for (scripts/slurm/up.sh with HPVC_SLURM_HOSTS; its own fabric and
directory, so a ``make slurm-up`` cluster beside it is not disturbed), once
with a resident hpvc (``hpvc serve``) on every host and once without, for each
host count h and repetition, alternated (the order of the counts rotated, plain
and ``--hpvc`` swapped every repetition):

* ``srun -N<h> TASK`` and ``srun -N<h> --hpvc=SPEC TASK``, a new job each: a
  cluster of two container nodes per host (one head, 2h-1 computes) on one
  network, VXLAN across the hosts. The time to the first task is from srun's
  start to the earliest task's clock (one machine, one clock); every task
  also prints what the plugin and ``hpvc node up`` measured (the phases,
  ``hpvc.bench.slurm.runner.breakdown``);
* the epilog: from srun's exit until each host's job lock is gone (``hpvc
  node down`` removes it last), polled every 20 ms;
* the host's busy CPU seconds over srun and epilog (hpvc's per host: the
  ``--hpvc`` run's less the plain run's, divided by h), and the resident
  memory of every host's slurmd and ``hpvc serve`` (``ps``).

VMs are not measured here: under TCG on this 2-CPU machine a guest boots in
2-3 s and 32 at once take about a minute (HOST-NOTES.md), so the curve would
show the emulator; ``hpvc bench slurm --kind vm`` measures VM jobs on 1-2 hosts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.scale import report
from hpvc.bench.slurm.cluster import SlurmCluster, Submitter, private_slurm
from hpvc.bench.slurm.runner import TASK as TIMES_TASK
from hpvc.bench.slurm.runner import breakdown, preflight
from hpvc.errors import HpvcError, InputError
from hpvc.host.usage import host_cpu_seconds
from hpvc.progress import Progress, quiet

MAX_HOSTS = 32  # scripts/slurm/common.sh: hosts .1-.32 of the fabric's /24
NODES_PER_HOST = 2
POLL_S = 0.02
EPILOG_TIMEOUT_S = 120
# One line per task: its clock when it started, its job and host; then the
# plugin's and node up's own timings (hpvc.bench.slurm.runner.TASK).
TASK = 'echo "first-task $(date +%s.%N) $SLURM_JOB_ID $SLURMD_NODENAME"; ' + TIMES_TASK.replace(
    "$HPVC_STEP", "1"
)

VM_NOTE = (
    "VMs not measured: under TCG a guest boots in 2-3 s and 32 at once take about a minute"
    " on this machine, so the curve would be the emulator's; `hpvc bench slurm --kind vm`"
    " measures VM jobs on 1-2 hosts"
)


def spec_text(subnet: str, hosts: int, per_host: int = NODES_PER_HOST) -> str:
    """One head and ``per_host * hosts - 1`` computes, floating CPUs, no
    hugepages: ``per_host`` container nodes on each of the job's hosts."""
    return (
        f'name = "sc"\nkind = "container"\nimage = "hpc"\n'
        f'[network]\nsubnet = "{subnet}"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "head"\nmemory = "96MiB"\n'
        f'[[nodes]]\nrole = "compute"\ncount = {per_host * hosts - 1}\nmemory = "96MiB"\n'
    )


def parse_tasks(out: str) -> list[tuple[float, int, str]]:
    """(clock, job, host) of every task's ``first-task`` line."""
    got = []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 4 and f[0] == "first-task":
            got.append((float(f[1]), int(f[2]), f[3]))
    return got


def _locks(cluster: SlurmCluster, job: int, hosts: Sequence[str]) -> dict[str, Path]:
    return {h: cluster.store(h).root / "jobs" / f"{job}.lock" for h in hosts}


def _epilog(cluster: SlurmCluster, job: int, hosts: Sequence[str], end: float) -> dict[str, float]:
    """Seconds from ``end`` (srun's exit, monotonic) until each host's job lock
    is gone: that host's `hpvc node down` has finished."""
    left = _locks(cluster, job, hosts)
    done: dict[str, float] = {}
    deadline = time.monotonic() + EPILOG_TIMEOUT_S
    while left:
        now = time.monotonic()
        for h, p in list(left.items()):
            if not p.exists():
                done[h] = now - end
                del left[h]
        if left and now > deadline:
            raise HpvcError(
                f"bench scale: job {job}",
                f"epilog not done on {', '.join(sorted(left))} after {EPILOG_TIMEOUT_S} s",
                "see the slurmd logs; `hpvc node down --job` on those hosts",
            )
        if left:
            time.sleep(POLL_S)
    return done


def _busy() -> float:
    busy, _ = host_cpu_seconds()
    return busy or 0.0


def one_srun(
    cluster: SlurmCluster, user: Submitter, cwd: Path, hosts: int, spec: Path | None
) -> dict[str, Any]:
    """One new job of ``hosts`` hosts, one task each: its times, its phases,
    its epilog per host and the machine's busy CPU seconds over all of it."""
    argv = ["srun", f"-N{hosts}"] + ([f"--hpvc={spec}"] if spec else []) + ["sh", "-c", TASK]
    cpu0 = _busy()
    t0 = time.time()
    m0 = time.monotonic()
    r = cluster.submit(user, argv, cwd)
    end = time.monotonic()
    wall = end - m0
    if r.returncode != 0:
        raise HpvcError(f"bench scale: {' '.join(argv[:3])}", (r.stderr or r.stdout).strip()[-300:])
    tasks = parse_tasks(r.stdout)
    if len(tasks) != hosts:
        raise HpvcError(f"bench scale: srun -N{hosts}", f"{len(tasks)} tasks answered: {r.stdout}")
    first = min(t for t, _, _ in tasks) - t0
    job = tasks[0][1]
    epilog = _epilog(cluster, job, [h for _, _, h in tasks], end) if spec else {}
    return {
        "config": "hpvc" if spec else "plain",
        "hosts": hosts,
        "job": job,
        "first_task_s": first,
        "wall_s": wall,
        "phases": breakdown(r.stdout, "1", first) if spec else None,
        "epilog_s": epilog,
        "cpu_s": _busy() - cpu0,
    }


def memory(cluster: SlurmCluster) -> dict[str, Any]:
    """Resident memory (MiB) of each host's slurmd and resident hpvc."""
    run = cluster.dir / "run"
    out: dict[str, Any] = {}
    for what, name in (("slurmd", "slurmd-{}.pid"), ("hpvc_serve", "hpvc-serve-{}.pid")):
        pids = []
        for h in cluster.hosts:
            p = run / name.format(h)
            if p.exists() and p.read_text().strip().isdigit():
                pids.append(p.read_text().strip())
        if not pids:
            continue
        r = subprocess.run(
            ["ps", "-o", "rss=", "-p", ",".join(pids)], capture_output=True, text=True
        )
        rss = [int(x) / 1024 for x in r.stdout.split() if x.isdigit()]
        if rss:
            out[what] = {"hosts": len(rss), "per_host_mib": sorted(rss), "total_mib": sum(rss)}
    return out


def _rotated(xs: Sequence[int], k: int) -> list[int]:
    k %= len(xs)
    return list(xs[k:]) + list(xs[:k])


def measure(
    cluster: SlurmCluster,
    user: Submitter,
    work: Path,
    specs: dict[int, Path],
    reps: int,
    resident: bool,
    progress: Progress,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    label = "resident" if resident else "no resident"
    for rep in range(reps):
        for order, h in enumerate(_rotated(sorted(specs), rep)):
            configs: list[Path | None] = [None, specs[h]]
            if rep % 2:
                configs.reverse()
            for spec in configs:
                progress(f"{label}, repetition {rep + 1}: srun -N{h}{' --hpvc' if spec else ''}")
                row = one_srun(cluster, user, work, h, spec)
                rows.append({**row, "resident": resident, "rep": rep, "order": order})
    return rows


def check_hosts(hosts: Sequence[int]) -> list[int]:
    if not hosts:
        raise InputError("--hosts", "no host count given", "--hosts 1,2,4,8,16,32")
    bad = [h for h in hosts if not 1 <= h <= MAX_HOSTS]
    if bad:
        raise InputError(
            f"--hosts {bad[0]}",
            f"the test cluster has 1 to {MAX_HOSTS} hosts",
            "--hosts 1,2,4,8,16,32",
        )
    return sorted(set(hosts))


def run(
    hosts: Sequence[int],
    reps: int,
    progress: Progress = quiet,
    user: str = "nobody",
    residents: Sequence[bool] = (True, False),
) -> dict[str, Any]:
    """Both paths at every host count, ``reps`` alternated repetitions, with
    and without residents; every job submitted by ``user`` (an ordinary user)."""
    counts = check_hosts(hosts)
    if reps < 1:
        raise InputError("--reps", "must be at least 1", "--reps 3")
    submitter = Submitter.named(user)
    preflight()
    common.ensure_image("hpc", progress)
    facts = common.host_facts(mpi=False)
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-bench-scale-"))
    os.chmod(tmp, 0o755)  # munged wants its socket's directories searchable by all
    rows: list[dict[str, Any]] = []
    mem: dict[str, Any] = {}
    started: dict[str, float] = {}
    left: list[tuple[str, str]] = []
    try:
        work = tmp / "work"
        work.mkdir()
        subnet = common.free_subnets(1)[0]
        specs = {}
        for h in counts:
            specs[h] = work / f"scale-{h}.toml"
            specs[h].write_text(spec_text(subnet, h))
        for resident in residents:
            key = "resident" if resident else "no_resident"
            t = time.monotonic()
            with private_slurm(
                tmp, subnet, progress, resident=resident, hosts=max(counts)
            ) as cluster:
                started[key] = time.monotonic() - t
                mem[key] = memory(cluster)
                rows += measure(cluster, submitter, work, specs, reps, resident, progress)
                mem[key + "_after"] = memory(cluster)
                left += cluster.sweep(cluster.env["HPVC_BIN"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if left:
        raise HpvcError("bench scale", f"shares left after the runs: {left}", "")
    return report.document(
        facts
        | {
            "benchmark": "scale-slurm",
            "hosts": counts,
            "reps": reps,
            "nodes_per_host": NODES_PER_HOST,
            "submitted_by": submitter.name,
            "cluster_up_s": started,
            "memory": mem,
            "vm": VM_NOTE,
        },
        rows,
    )

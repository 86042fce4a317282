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

With ``kind="vm"`` (``--kind vm``): one VM node per host, at 1 to 4 hosts
only: under TCG on this 2-CPU machine every guest is emulated and 32 booting
at once take about a minute (docs/architecture.md, HOST-NOTES.md), so larger
counts measure the emulator, not hpvc. The tasks run in the guests, whose
clocks are not the host's: the first task is when its line reaches srun's
output on the host. Each host's QEMU memory is its peak resident set during
the ``--hpvc`` job (``ps``, every 0.2 s). The growth words are the emulation's.
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
from hpvc.bench.scale.vm import VM_KIND_NOTE, vm_spec_text, watched_submit
from hpvc.bench.slurm.cluster import SlurmCluster, Submitter, private_slurm
from hpvc.bench.slurm.runner import TASK as TIMES_TASK
from hpvc.bench.slurm.runner import breakdown, preflight
from hpvc.errors import HpvcError, InputError
from hpvc.host.usage import host_cpu_seconds
from hpvc.progress import Progress, quiet

MAX_HOSTS = 32  # scripts/slurm/common.sh: hosts .1-.32 of the fabric's /24
NODES_PER_HOST = 2
KINDS = ("container", "vm")
MAX_VM_HOSTS = 4  # TCG on 2 CPUs: more guests at once measure the emulator
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
    """(clock, job, host) of every task's ``first-task`` line; the host is ""
    where the task had no SLURMD_NODENAME (in a VM guest)."""
    got = []
    for line in out.splitlines():
        f = line.split()
        if len(f) in (3, 4) and f[0] == "first-task":
            got.append((float(f[1]), int(f[2]), f[3] if len(f) == 4 else ""))
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
    cluster: SlurmCluster,
    user: Submitter,
    cwd: Path,
    hosts: int,
    spec: Path | None,
    kind: str = "container",
) -> dict[str, Any]:
    """One new job of ``hosts`` hosts, one task each: its times, its phases,
    its epilog per host and the machine's busy CPU seconds over all of it."""
    argv = ["srun", f"-N{hosts}"] + ([f"--hpvc={spec}"] if spec else []) + ["sh", "-c", TASK]
    cpu0 = _busy()
    t0 = time.time()
    m0 = time.monotonic()
    if kind == "vm":
        r, seen, qemu, locks = watched_submit(cluster, user, argv, cwd)
    else:
        r, seen, qemu, locks = cluster.submit(user, argv, cwd), None, {}, set()
    end = time.monotonic()
    wall = end - m0
    if r.returncode != 0:
        raise HpvcError(f"bench scale: {' '.join(argv[:3])}", (r.stderr or r.stdout).strip()[-300:])
    tasks = parse_tasks(r.stdout)
    if len(tasks) != hosts:
        raise HpvcError(f"bench scale: srun -N{hosts}", f"{len(tasks)} tasks answered: {r.stdout}")
    first = seen - m0 if seen is not None else min(t for t, _, _ in tasks) - t0
    job = tasks[0][1]
    names = [h for _, _, h in tasks]
    if kind == "vm" and spec:
        names = sorted(h for h, j in locks if j == str(job))
        if str(job) not in qemu:
            raise HpvcError(f"bench scale: job {job}", "no QEMU of it seen while it ran")
        if len(names) != hosts:
            raise HpvcError(
                f"bench scale: job {job}", f"its lock seen on {names}, not {hosts} hosts"
            )
    epilog = _epilog(cluster, job, names, end) if spec else {}
    return {
        "config": "hpvc" if spec else "plain",
        "hosts": hosts,
        "job": job,
        "first_task_s": first,
        "wall_s": wall,
        "phases": breakdown(r.stdout, "1", first) if spec else None,
        "epilog_s": epilog,
        "cpu_s": _busy() - cpu0,
        **(
            {"qemu_rss_per_host_mib": qemu.get(str(job), 0.0) / hosts}
            if kind == "vm" and spec
            else {}
        ),
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
    kind: str = "container",
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
                row = one_srun(cluster, user, work, h, spec, kind)
                rows.append({**row, "resident": resident, "rep": rep, "order": order})
    return rows


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise InputError(f"--kind {kind}", "unknown", "--kind container or --kind vm")
    return kind


def check_hosts(hosts: Sequence[int], kind: str = "container") -> list[int]:
    if not hosts:
        raise InputError("--hosts", "no host count given", "--hosts 1,2,4,8,16,32")
    bad = [h for h in hosts if not 1 <= h <= MAX_HOSTS]
    if bad:
        raise InputError(
            f"--hosts {bad[0]}",
            f"the test cluster has 1 to {MAX_HOSTS} hosts",
            "--hosts 1,2,4,8,16,32",
        )
    over = [h for h in hosts if h > MAX_VM_HOSTS]
    if check_kind(kind) == "vm" and over:
        raise InputError(
            f"--kind vm --hosts {max(over)}",
            f"VMs run under TCG emulation on this machine; more than {MAX_VM_HOSTS} guests"
            " booting at once measure the emulator, not hpvc",
            f"--kind vm --hosts 1,2,4 (at most {MAX_VM_HOSTS})",
        )
    return sorted(set(hosts))


def run(
    hosts: Sequence[int],
    reps: int,
    progress: Progress = quiet,
    user: str = "nobody",
    residents: Sequence[bool] = (True, False),
    kind: str = "container",
) -> dict[str, Any]:
    """Both paths at every host count, ``reps`` alternated repetitions, with
    and without residents; every job submitted by ``user`` (an ordinary user);
    container nodes or (``kind="vm"``) one VM per host."""
    counts = check_hosts(hosts, kind)
    if reps < 1:
        raise InputError("--reps", "must be at least 1", "--reps 3")
    submitter = Submitter.named(user)
    preflight()
    common.ensure_image("hpc", progress)
    if kind == "vm":
        common.ensure_guest("hpc", progress)
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
            specs[h].write_text(vm_spec_text(subnet, h) if kind == "vm" else spec_text(subnet, h))
        for resident in residents:
            key = "resident" if resident else "no_resident"
            t = time.monotonic()
            site = "kinds=container,vm" if kind == "vm" else ""
            with private_slurm(
                tmp, subnet, progress, extra_args=site, resident=resident, hosts=max(counts)
            ) as cluster:
                started[key] = time.monotonic() - t
                mem[key] = memory(cluster)
                rows += measure(cluster, submitter, work, specs, reps, resident, progress, kind)
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
            "kind": kind,
            "nodes_per_host": 1 if kind == "vm" else NODES_PER_HOST,
            "submitted_by": submitter.name,
            "cluster_up_s": started,
            "memory": mem,
            "vm": VM_KIND_NOTE if kind == "vm" else VM_NOTE,
        },
        rows,
    )
